"""From a sample to the exact text the judge reads.

    sample --layout---> question/answer items, rendered with `Image-k: <image>` lines (MMIE's layout, k from 0)
           --rubric---> the category's prompt (configs/rubrics/*.yaml)
           --template-> the chat turn (judge/templates.py)
           --expand---> each image slot becomes the backbone's image tokens (judge/vision.py): InternVL's
                        <img><IMG_CONTEXT> x (256 * tiles)</img>, Qwen-VL's <|vision_start|><|image_pad|> x n<|vision_end|>
           --encode---> token ids, special tokens only where the template and the images put them (encode_prompt)

Text is text: an image slot comes only from an image segment, never from what a text spells. A sample's,
a rubric's or a system message's `<image>` stays those seven characters, and its `<img>`, `<IMG_CONTEXT>` or
`<|end|>` (or any other backbone's image and control tokens) become the tokens of their characters (encode_prompt). The prompt is therefore carried as a
`Query`, texts and image slots, until the image tokens replace the slots; `<image>` marks a slot only in
`JudgePrompt.query`, the spelling a chat API takes. (MMIE's own script, through InternVL's chat(), would put
an image where a sample's text spells `<image>` and read a spelled `<|end|>` as the control token.)

MMIE's reading of an answer (a rubric's `answer_stops_at_images`, 3 in rubrics imported from MMIE's
prompts.py): MMIE's dataset.py reads the answer only until the prompt holds 3 images, so the rest of a
longer answer never reaches its judge. Rubrics that reproduce MMIE do the same, and record the cut; this
toolkit's own rubrics read every answer whole.

Image-token budget (`image_token_budget`, counted in image tokens per sample: InternVL's <IMG_CONTEXT>). When a
sample's images need more, cuts are made in this order until it fits, and each is recorded in
`JudgePrompt.truncated`:
  1. every image's limit is lowered together, one step at a time (`ImageProcessing.reduced`): InternVL's tile
     limit down to 1 tile (no thumbnail), Qwen-VL's most pixels down to its least;
  2. whole images are replaced by the text `[image omitted]`, question images first (earliest first),
     then answer images (latest first), keeping the `Image-k:` numbering so the text still lines up.
The rubric, instructions, question and answer text are never cut by this budget.

Prompt-token budget (`prompt_token_budget`, the whole prompt in tokens, image tokens included; MileBench's
long-context rule). When the prompt is longer, the question's context is dropped oldest first - its texts
and images alike, in the order they appear - until the prompt fits. The question's first text (the task
instruction) and its last text (what is asked) always stay, as do the answer, the reference and the
rubric. One `[earlier context omitted]` line marks the gap, the remaining images keep their `Image-k`
numbers, and the cut is recorded in `JudgePrompt.truncated`. A sample is never dropped.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from string import Formatter
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

from mmjudge.configs import DEFAULT_RUBRICS
from mmjudge.judge.data import (IMAGE_PLACEHOLDER, InputError, JudgeText, Pair, Problem, Sample, Segment, missing_file,
                                parse_records, resolve_image)
from mmjudge.judge.detokenize import reference_ids
from mmjudge.judge.parsing import ScoreScale
from mmjudge.judge.templates import ChatTemplate, Span, join_parts
from mmjudge.judge.verdicts import VERDICT_FORMATS
from mmjudge.judge.vision import ImageProcessing, image_size, placeholder
from mmjudge.judge.yamlfile import read_yaml

OMITTED_IMAGE = "[image omitted]"
CONTEXT_OMITTED = "[earlier context omitted]"
TEMPLATE_FIELDS = ("instructions", "question", "answer", "reference")
# A pairwise rubric's: the two answers in the order the judge is shown them (the reverse order shows B as
# answer_a), whatever names the benchmark gives them ("Assistant A", "Answer 1", "<OUTPUT_A>").
PAIR_FIELDS = ("instructions", "question", "answer_a", "answer_b")

# A user turn as pieces of text, and None where an image goes.
Query = list[str | None]


class Rubric(BaseModel):
    """One category's instructions and prompt layout, loaded from YAML.

    A pairwise rubric (`kind: pairwise`) shows the judge a question and two answers and asks which is
    better; its `verdict_format` (judge/verdicts.py) says how the judge writes its verdict and how it is
    read back. Its answers and question are laid out as MMIE lays a sample out (`layout: mmie`), or as a
    benchmark's chat message lists them (`layout: parts`: each text as it is, each image where it stands,
    the pieces joined by `separator`; `layout: tagged`, OpenING's: parts whose text is followed by an
    ` <IMG_k></IMG_k>` tag where an image comes). `images: end` puts the question's images after the whole
    text, as a benchmark that sends [text, image] does. `system_message` replaces the checkpoint's."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["pointwise", "pairwise"] = "pointwise"
    category: str
    scale: tuple[float, float] = (ScoreScale.low, ScoreScale.high)
    step: float = ScoreScale.step  # Inst-It's judge scores 0-1 in steps of 0.1
    criteria: dict[str, JudgeText] = {}  # criterion name -> the label of its line in the judge's output
    instructions: JudgeText
    template: str  # fields: TEMPLATE_FIELDS, e.g. {question}
    use_reference: bool = False  # MMIE shows the reference answer (gt_answer's first text) for MSR only
    # MMIE's dataset.py reads the answer only until the prompt holds this many images (3); the rest of the
    # answer is left out (see `read_answer_as_mmie`). None reads every answer whole.
    answer_stops_at_images: int | None = None
    # Pairwise rubrics only (the class docstring).
    verdict_format: str = "mmjudge"
    layout: Literal["mmie", "parts", "tagged"] = "mmie"
    separator: str = ""
    images: Literal["inline", "end"] = "inline"
    system_message: JudgeText | None = None

    @field_validator("template")
    @classmethod
    def _known_fields(cls, template: str, info: ValidationInfo) -> str:
        # Checked when the rubric loads: `fill` would otherwise fail only after the model has loaded.
        try:
            names = [name for _, name, _, _ in Formatter().parse(template) if name is not None]
        except ValueError as err:  # a lone { or }
            raise ValueError(f"{err}; write a literal brace as {{{{ or }}}}") from None
        known = PAIR_FIELDS if info.data.get("kind") == "pairwise" else TEMPLATE_FIELDS
        if unknown := [name for name in names if name not in known]:
            raise ValueError(f"unknown field(s) {_braced(unknown)}; a template may use {_braced(known)}")
        if [spec for _, name, spec, conversion in Formatter().parse(template) if name is not None and (spec or conversion)]:
            raise ValueError("a field takes no format spec or conversion (write {answer}, not {answer:>10} or {answer!r})")
        return template

    @field_validator("criteria")
    @classmethod
    def _named_criteria(cls, criteria: dict[str, str]) -> dict[str, str]:
        # A criterion's name keys the record's `criteria` and its label a line of the judge's answer: an empty
        # one, or one across lines, could never be read back, and `overall` is the record's `score`.
        for name, label in criteria.items():
            if not name.strip() or name == "overall" or "\n" in name:
                raise ValueError(f"criterion {name!r}: a name is a word or words on one line, other than 'overall' (the record's score)")
            if not label.strip() or "\n" in label:
                raise ValueError(f"criterion {name!r}: its label {label!r} is the start of one line of the judge's answer: give a text on one line")
        return criteria

    @model_validator(mode="after")
    def _valid_scale(self) -> Rubric:
        ScoreScale(*self.scale, self.step)  # a ValueError when the step does not divide the scale
        return self

    @model_validator(mode="after")
    def _shows_what_is_judged(self) -> Rubric:
        # Without {answer} every prompt would be the same, whatever the sample says; without {instructions}
        # or {question} the judge would score an answer to nothing by no rubric; with use_reference and no
        # {reference}, the reference would never be shown.
        if self.kind == "pairwise":
            needed = list(PAIR_FIELDS)
        else:
            needed = ["instructions", "question", "answer"] + (["reference"] if self.use_reference else [])
        used = {name for _, name, _, _ in Formatter().parse(self.template)}
        if missing := [name for name in needed if name not in used]:
            raise ValueError(f"template: {_braced(missing)} missing; a judge's prompt needs {_braced(needed)}")
        return self

    @model_validator(mode="after")
    def _pairwise_settings(self) -> Rubric:
        if self.kind == "pairwise" and self.verdict_format not in VERDICT_FORMATS:
            raise ValueError(f"verdict_format: {self.verdict_format!r} is none of {', '.join(VERDICT_FORMATS)}")
        pairwise_only = {"verdict_format": "mmjudge", "layout": "mmie", "separator": "", "images": "inline", "system_message": None}
        if self.kind == "pointwise" and (given := [k for k, default in pairwise_only.items() if getattr(self, k) != default]):
            raise ValueError(f"{', '.join(given)}: for a pairwise rubric only (kind: pairwise); this one scores answers one at a time")
        if self.kind == "pairwise" and (self.use_reference or self.answer_stops_at_images is not None):
            raise ValueError("use_reference and answer_stops_at_images are MMIE's, for pointwise rubrics only")
        return self

    @property
    def score_scale(self) -> ScoreScale:
        return ScoreScale(*self.scale, self.step)

    def fill(self, fields: dict[str, Query], before: tuple[str, ...] = ()) -> Query:
        """The template with its fields filled (the instructions are the rubric's own); the image slots of
        the question and the answers stay slots. `before`: only what comes before the text that leads to the
        first of these fields (ANSWER_FIELDS: the part of a prompt that every answer to its question shares)."""
        fields = {"instructions": [self.instructions], **fields}
        query: Query = []
        for literal, name, _, _ in Formatter().parse(self.template):
            if name in before:
                break
            if self.layout == "tagged" and name in ("answer_a", "answer_b") and fields[name][:1] in ([], [""]):
                # IntJudge announces an answer that opens without text by its prefix alone, on a line of its own
                literal = "\n" + literal.strip()
            query.append(literal)
            if name is not None:
                query += fields[name]
        return query


# The fields of a rubric's template that hold an answer: a prompt's part before the first is its question's
# (the rubric, the question and its images), the same for every answer judged against them.
ANSWER_FIELDS = ("answer", "answer_a", "answer_b")


def judgeable(item: Sample | Pair, rubrics: dict[str, Rubric]) -> bool:
    """Whether a rubric judges the item: one of its category, pairwise only for a pair."""
    rubric = rubrics.get(item.category)
    return rubric is not None and (isinstance(item, Pair) or rubric.kind == "pointwise")


def rubric_problems(samples: list[Sample | Pair], rubrics: dict[str, Rubric], file: Path) -> list[Problem]:
    """One problem per category that no rubric covers, with its sample count and first id (judge-score
    --skip_invalid skips those samples); and one per category whose rubric is pairwise where its samples
    each hold one answer."""
    uncovered: dict[str, list[str]] = {}
    single: dict[str, list[str]] = {}
    for sample in samples:
        if sample.category not in rubrics:
            uncovered.setdefault(sample.category, []).append(sample.id)
        elif isinstance(sample, Sample) and rubrics[sample.category].kind == "pairwise":
            single.setdefault(sample.category, []).append(sample.id)
    what = "pair(s)" if samples and isinstance(samples[0], Pair) else "sample(s)"
    return [Problem(str(file), f"no rubric for category {category} ({len(ids)} {what}, first id {ids[0]!r}); give one with --rubric")
            for category, ids in sorted(uncovered.items())] + [
            Problem(str(file), f"the rubric of category {category} compares two answers (kind: pairwise), but its {len(ids)} sample(s) "
                               f"each have one (first id {ids[0]!r}); give a pointwise rubric with --rubric")
            for category, ids in sorted(single.items())]


def _braced(names) -> str:
    return " ".join(f"{{{name}}}" for name in names)


def load_rubrics(paths: list[str | Path] | tuple[Path, ...] = DEFAULT_RUBRICS) -> dict[str, Rubric]:
    """Rubrics by category from YAML files (each holds one rubric, or a list of them)."""
    rubrics: dict[str, Rubric] = {}
    problems = []
    for path in paths:
        path = Path(path)
        files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
        for file in files:
            if not file.is_file():
                problems.append(Problem(str(file), f"rubric: {missing_file(file)}"))
                continue
            try:
                data = read_yaml(file)
            except InputError as err:
                problems += err.problems
                continue
            parsed, invalid = parse_records(file, data if isinstance(data, list) else [data], Rubric)
            problems += invalid
            for index, rubric in parsed:
                if rubric.category in rubrics:
                    problems.append(Problem(str(file), f"a second rubric for category {rubric.category}", index))
                rubrics[rubric.category] = rubric
    if problems:
        raise InputError(problems)
    return rubrics


@dataclass(frozen=True)
class PlannedImage:
    """One image of the prompt, the rule it is processed by, and its tiles and image tokens (0: omitted for the budget)."""

    path: Path
    number: int  # the k of `Image-k`, from 0 as MMIE numbers them
    part: str  # "question" or "answer"
    processing: ImageProcessing
    n_tiles: int
    tokens: int


@dataclass(frozen=True)
class JudgePrompt:
    sample_id: str
    text: str
    images: list[PlannedImage]  # only the images shown, in prompt order
    truncated: list[str]
    # The user turn before the chat template and image expansion, an `<image>` where each shown image goes:
    # what a chat API takes (judge-score --backend openai sends it).
    query: str
    # Where in `text` the template's control tokens and the image tokens are: the only special tokens it may
    # hold. Everything else is text (encode_prompt).
    controls: tuple[Span, ...]
    shared: int = 0  # characters of `text` before its first answer (ANSWER_FIELDS), the same for every answer to its question

    @property
    def n_tiles(self) -> int:
        return sum(image.n_tiles for image in self.images)

    def chat_content(self) -> list[dict]:
        """The user turn as a chat message's content parts, each shown image an image part where it goes
        (`{"type": "image", "path": ...}`, as transformers' apply_chat_template takes it): what a checkpoint's own
        chat template and image processing make this prompt's ids of (docs/reward-models.md)."""
        pieces = self.query.split(IMAGE_PLACEHOLDER)
        if len(pieces) != len(self.images) + 1:
            raise ValueError(f"{self.sample_id}: its text spells {IMAGE_PLACEHOLDER} itself, where no image goes")
        parts = [{"type": "text", "text": pieces[0]}] * bool(pieces[0])
        for image, text in zip(self.images, pieces[1:]):
            parts += [{"type": "image", "path": str(image.path)}] + [{"type": "text", "text": text}] * bool(text)
        return parts

    @property
    def image_tokens(self) -> int:
        return sum(image.tokens for image in self.images)


# A question or answer as MMIE lays it out: each segment's text, then its image as `Image-k: <image>`.
# An item is a text (str) or the number k of an image (int).
Item = str | int


def layout(segments: list[Segment], first_number: int) -> list[Item]:
    """The items of some segments; images are numbered from `first_number` (MMIE counts from 0 across the
    question and then the answer)."""
    items: list[Item] = []
    number = first_number
    for segment in segments:
        if segment.text is not None:
            items.append(segment.text)
        if segment.image is not None:
            items.append(number)
            number += 1
    return items


def render(items: list[Item], shown: dict[int, bool]) -> Query:
    """MMIE's text, exactly: every item on a line of its own, ending in a newline; a shown image's slot
    where MMIE writes its `<image>`."""
    query: Query = []
    for item in items:
        if isinstance(item, str):
            query.append(f"{item}\n")
        elif shown[item]:
            query += [f"Image-{item}: ", None, "\n"]
        else:
            query.append(f"Image-{item}: {OMITTED_IMAGE}\n")
    return query


def spelled(query: Query) -> str:
    """The query as a chat API takes it: an `<image>` where each image goes (InternVL's and vLLM's convention)."""
    return "".join(IMAGE_PLACEHOLDER if piece is None else piece for piece in query)


def read_answer_as_mmie(sample: Sample, stop_at: int) -> tuple[Sample, list[str]]:
    """The sample as MMIE's dataset.py reads it: the question whole, then the answer segment by segment -
    text, then image - stopping as soon as the prompt holds `stop_at` images (question images count). What
    is left out is recorded, where MMIE drops it silently."""
    images = sum(segment.image is not None for segment in sample.question)
    kept: list[Segment] = []
    for segment in sample.answer:
        if images >= stop_at:  # MMIE still reads this segment's text, not its image
            if segment.text is not None:
                kept.append(Segment(text=segment.text))
            break
        kept.append(segment)
        images += segment.image is not None
        if images >= stop_at:
            break
    if kept == sample.answer:
        return sample, []
    texts = sum(s.text is not None for s in sample.answer) - sum(s.text is not None for s in kept)
    dropped_images = sum(s.image is not None for s in sample.answer) - sum(s.image is not None for s in kept)
    note = f"answer read as MMIE reads it, up to {stop_at} images in the prompt: {texts} text(s) and {dropped_images} image(s) left out"
    return sample.model_copy(update={"answer": kept}), [note]


def reference_text(sample: Sample) -> str:
    """MMIE's reference answer: the text of the first gt_answer segment."""
    first = sample.gt_answer[0].text if sample.gt_answer else None
    return first or ""


Parts = list[tuple[str, list[Segment]]]  # a prompt's question and answers, named, in the order shown


def plan_images(parts: Parts, image_root: Path, processing: ImageProcessing, budget: int | None) -> tuple[list[PlannedImage], list[str]]:
    """Decide the tiles and tokens of every image under the budget (see the module docstring for the order of
    cuts: a pair's answers count as the answer, the one shown last first)."""
    refs = [(s.image, part) for part, segments in parts for s in segments if s.image is not None]
    sizes = [image_size(resolve_image(path, image_root), processing.exif_transpose) for path, _ in refs]
    plans = [PlannedImage(resolve_image(path, image_root), k, part, processing, *processing.plan(*size))
             for k, ((path, part), size) in enumerate(zip(refs, sizes))]
    truncated: list[str] = []
    tokens = lambda: sum(p.tokens for p in plans)  # noqa: E731
    if budget is None or tokens() <= budget:
        return plans, truncated
    smaller = processing
    while tokens() > budget and (step := smaller.reduced()) is not None:
        smaller = step
        plans = [replace(p, processing=smaller, **dict(zip(("n_tiles", "tokens"), smaller.plan(*size)))) if p.n_tiles else p
                 for p, size in zip(plans, sizes)]
    if smaller is not processing:
        (kind, least), (_, most) = smaller.limit(), processing.limit()
        truncated.append(f"{kind} per image limited to {least:,} (from {most:,})")
    drop_order = [i for i, p in enumerate(plans) if p.part == "question"] + [i for i, p in reversed(list(enumerate(plans))) if p.part != "question"]
    for i in drop_order:
        if tokens() <= budget:
            break
        plans[i] = replace(plans[i], n_tiles=0, tokens=0)
        truncated.append(f"Image-{plans[i].number} ({plans[i].part}) omitted")
    return plans, truncated


def build_prompt(
    sample: Sample,
    rubric: Rubric,
    template: ChatTemplate,
    system_message: str | None,
    image_root: str | Path,
    processing: ImageProcessing,
    image_token_budget: int | None = None,
    prompt_token_budget: int | None = None,
    count_tokens: Callable[[str], int] | None = None,
) -> JudgePrompt:
    read_cuts = []
    if rubric.answer_stops_at_images is not None:
        sample, read_cuts = read_answer_as_mmie(sample, rubric.answer_stops_at_images)
    plans, truncated = plan_images([("question", sample.question), ("answer", sample.answer)], Path(image_root), processing, image_token_budget)
    truncated = read_cuts + truncated
    question = layout(sample.question, 0)
    answer = layout(sample.answer, sum(isinstance(item, int) for item in question))

    def assemble(question_items: list[Item]) -> JudgePrompt:
        return _assemble(sample, rubric, template, system_message, plans, question_items, answer, truncated)

    if prompt_token_budget is None:
        return assemble(question)
    if count_tokens is None:
        raise ValueError("a prompt token budget needs count_tokens")
    return fit_prompt_budget(assemble, question, plans, prompt_token_budget, count_tokens)


def _assemble(sample: Sample, rubric: Rubric, template: ChatTemplate, system_message: str | None, plans: list[PlannedImage],
              question: list[Item], answer: list[Item], truncated: list[str]) -> JudgePrompt:
    shown = {p.number: p.n_tiles > 0 for p in plans}
    fields = {"question": render(question, shown), "answer": render(answer, shown), "reference": [reference_text(sample) if rubric.use_reference else ""]}
    query = rubric.fill(fields)
    laid_out = {item for item in question + answer if isinstance(item, int)}
    shown_images = [p for p in plans if p.n_tiles > 0 and p.number in laid_out]
    images = [placeholder(p.processing, p.tokens) for p in shown_images]
    text, controls = render_query(template, query, images, system_message)
    shared = rubric.fill(fields, before=ANSWER_FIELDS)
    return JudgePrompt(sample.id, text, shown_images, list(truncated), spelled(query), controls,
                       shared_length(template, shared, images, system_message))


def build_pair_prompt(
    pair: Pair,
    first: str,
    rubric: Rubric,
    template: ChatTemplate,
    system_message: str | None,
    image_root: str | Path,
    processing: ImageProcessing,
    image_token_budget: int | None = None,
    prompt_token_budget: int | None = None,
    count_tokens: Callable[[str], int] | None = None,
) -> JudgePrompt:
    """A pair's prompt under a pairwise rubric, answer `first` ("A" or "B") shown first. Images are numbered
    across the question and the answers in the order shown; the budgets cut as they cut a sample (the
    module docstring), the two answers standing for the answer."""
    second = "B" if first == "A" else "A"
    parts = [("question", pair.question), (f"answer {first}", pair.answer(first)), (f"answer {second}", pair.answer(second))]
    plans, truncated = plan_images(parts, Path(image_root), processing, image_token_budget)
    question = layout(pair.question, 0)
    shown_first = layout(pair.answer(first), _images_in(question))
    shown_second = layout(pair.answer(second), _images_in(question) + _images_in(shown_first))
    system = rubric.system_message if rubric.system_message is not None else system_message

    def assemble(question_items: list[Item]) -> JudgePrompt:
        shown = {p.number: p.n_tiles > 0 for p in plans}
        end = rubric.images == "end"
        fields = {"question": _pair_pieces(rubric, question_items, shown, with_images=not end),
                  "answer_a": _pair_pieces(rubric, shown_first, shown), "answer_b": _pair_pieces(rubric, shown_second, shown)}
        slotted = rubric.fill(fields)  # image slots still as their numbers, to put the tiles in the order the slots come
        if end:
            slotted += [part for item in question_items if isinstance(item, int) and shown[item] for part in (rubric.separator, item)]
        order = [piece for piece in slotted if isinstance(piece, int)]
        by_number = {p.number: p for p in plans}
        images = [by_number[number] for number in order]
        query: Query = [None if isinstance(piece, int) else piece for piece in slotted]
        placeholders = [placeholder(image.processing, image.tokens) for image in images]
        text, controls = render_query(template, query, placeholders, system)
        shared = [None if isinstance(piece, int) else piece for piece in rubric.fill(fields, before=ANSWER_FIELDS)]
        return JudgePrompt(pair.id, text, images, list(truncated), spelled(query), controls, shared_length(template, shared, placeholders, system))

    if prompt_token_budget is None:
        return assemble(question)
    if count_tokens is None:
        raise ValueError("a prompt token budget needs count_tokens")
    return fit_prompt_budget(assemble, question, plans, prompt_token_budget, count_tokens)


def _images_in(items: list[Item]) -> int:
    return sum(isinstance(item, int) for item in items)


def _pair_pieces(rubric: Rubric, items: list[Item], shown: dict[int, bool], with_images: bool = True) -> list[str | int]:
    """A question or answer as the rubric's layout shows it: an image slot as the image's number. `mmie`:
    MMIE's lines (`render`); `parts`: each text as it is and each image where it stands, joined by the
    rubric's separator; `tagged`: parts whose text before an image ends in ` <IMG_k></IMG_k>` (OpenING's)."""
    if rubric.layout == "mmie":
        return [piece for item in items if with_images or isinstance(item, str)
                for piece in ([f"{item}\n"] if isinstance(item, str) else
                              [f"Image-{item}: ", item, "\n"] if shown[item] else [f"Image-{item}: {OMITTED_IMAGE}\n"])]
    pieces: list[str | int] = []
    for k, item in enumerate(items):
        if isinstance(item, str):
            following = items[k + 1] if k + 1 < len(items) else None
            tag = rubric.layout == "tagged" and isinstance(following, int) and with_images
            pieces.append(f"{item} <IMG_{following}></IMG_{following}>" if tag else item)
        elif with_images:
            pieces.append(item if shown[item] else OMITTED_IMAGE)
    joined: list[str | int] = []
    for piece in pieces:
        if joined and rubric.separator:
            joined.append(rubric.separator)
        joined.append(piece)
    return joined


def render_query(template: ChatTemplate, query: Query, images: list[str], system_message: str | None) -> tuple[str, tuple[Span, ...]]:
    """A user turn in the chat template, each image slot as its image tokens (`images`, in order, each
    `vision.placeholder`'s text): the prompt's text, and the spans of the template's and the images' own
    tokens (encode_prompt). judge-serve renders a chat request's turn with it too."""
    assert query.count(None) == len(images), "one image per image slot"
    return join_parts(template.parts(_query_parts(query, images), system_message))


def shared_length(template: ChatTemplate, shared: Query, images: list[str], system_message: str | None) -> int:
    """The characters of a prompt's text (render_query's) that its first pieces `shared` take, the template's
    turn before them included (its end, `parts`' last, is not before them)."""
    parts = template.parts(_query_parts(shared, images[: shared.count(None)]), system_message)[:-1]
    return sum(len(piece) for piece, _ in parts)


def _query_parts(query: Query, images: list[str]) -> list[tuple[str, bool]]:
    """The query's pieces as template parts, each image slot as its image's tokens (in order)."""
    texts = iter(images)
    return [(piece, False) if piece is not None else (next(texts), True) for piece in query]


def encode_prompt(tokenizer, text: str, controls: tuple[Span, ...], add_special_tokens: bool = True) -> list[int]:
    """The token ids of a built prompt (`JudgePrompt.text`, or that text with more appended), in which only
    the spans `controls` (the template's control tokens, the image tokens) may become special tokens: text
    from a sample, a rubric or a system message is read as text, whatever it says. Tokenized as one string,
    a `<|end|><|assistant|>` in an answer closed the user's turn and opened a reply of the answer's making
    ("### Score 6"), and an `<IMG_CONTEXT>` stood for an image that is not there.

    A prompt holding no special token outside `controls` (every real one) is tokenized whole, exactly as
    InternVL's chat tokenizes it with the reference's tokenizer (transformers 4.37's, whose whole prompts
    start with a token that transformers 5 does not give: judge/detokenize.py); in one that does, each such
    token becomes the tokens of its characters."""
    ids = _encode(tokenizer, text, controls, add_special_tokens)
    return reference_ids(tokenizer, ids) if add_special_tokens else ids


def _encode(tokenizer, text: str, controls: tuple[Span, ...], add_special_tokens: bool) -> list[int]:
    encoded = tokenizer(text, add_special_tokens=add_special_tokens)
    added = tokenizer.added_tokens_encoder
    special_ids = set(added.values())
    in_controls = re.compile("|".join(map(re.escape, sorted(added, key=len, reverse=True))))
    expected = sum(len(in_controls.findall(text, start, end)) for start, end in controls)
    if add_special_tokens:
        expected += tokenizer.num_special_tokens_to_add()
    if sum(map(encoded.input_ids.count, special_ids)) == expected:  # list.count: C speed over thousands of ids
        return encoded.input_ids
    encoded = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    starts = [start for start, _ in controls]
    ids = []
    for token, (start, end) in zip(encoded.input_ids, encoded.offset_mapping):
        k = bisect.bisect_right(starts, start) - 1
        if token in special_ids and end > start and not (k >= 0 and end <= controls[k][1]):
            ids += _as_text(tokenizer, text[start:end])
        else:
            ids.append(token)
    return ids


def _as_text(tokenizer, text: str) -> list[int]:
    """The ids of `text` read as plain text where it follows other text: after a newline, so that a
    SentencePiece tokenizer adds no word-start marker that the text does not have."""
    plain = dict(add_special_tokens=False, split_special_tokens=True)
    before = tokenizer("\n", **plain).input_ids
    after = tokenizer(f"\n{text}", **plain).input_ids
    return after[len(before):] if after[: len(before)] == before else tokenizer(text, **plain).input_ids


def fit_prompt_budget(assemble: Callable[[list[Item]], JudgePrompt], question: list[Item], plans: list[PlannedImage],
                      budget: int, count_tokens: Callable[[str], int]) -> JudgePrompt:
    """MileBench's long-context rule: drop the question's oldest context, texts and images alike, until
    the prompt fits the budget (see the module docstring)."""
    texts = [i for i, item in enumerate(question) if isinstance(item, str)]
    pinned = {texts[0], texts[-1]} if texts else set()
    droppable = [i for i in range(len(question)) if i not in pinned]
    shown = {p.number: p.n_tiles > 0 for p in plans}
    tokens = {p.number: p.tokens for p in plans}

    def cost(item: Item) -> int:  # an estimate: each round is checked against the real count
        return count_tokens(spelled(render([item], shown))) + (tokens[item] + 2 if isinstance(item, int) else 0)

    prompt, dropped = assemble(question), 0
    while (over := count_tokens(prompt.text) - budget) > 0 and dropped < len(droppable):
        while over > 0 and dropped < len(droppable):
            over -= cost(question[droppable[dropped]])
            dropped += 1
        prompt = assemble(_without(question, droppable[:dropped]))
    if dropped:
        prompt.truncated.append(_describe_cut([question[i] for i in droppable[:dropped]], budget))
    if over > 0:
        prompt.truncated.append(f"prompt still {over} tokens over the budget of {budget}: the question's first and last "
                                "texts, the answer and the rubric are never cut")
    return prompt


def _without(items: list[Item], dropped: list[int]) -> list[Item]:
    """The items less the dropped ones, with one marker where the first of them was."""
    gone = set(dropped)
    kept = [item for i, item in enumerate(items) if i not in gone]
    kept.insert(sum(1 for i in range(dropped[0]) if i not in gone), CONTEXT_OMITTED)
    return kept


def _describe_cut(dropped: list[Item], budget: int) -> str:
    texts = [item for item in dropped if isinstance(item, str)]
    images = [f"Image-{item}" for item in dropped if isinstance(item, int)]
    parts = [f"{len(texts)} text(s) ({sum(map(len, texts))} characters)"] if texts else []
    parts += [f"{len(images)} image(s) ({', '.join(images)})"] if images else []
    return f"oldest question context omitted to fit {budget} prompt tokens: {' and '.join(parts)}"
