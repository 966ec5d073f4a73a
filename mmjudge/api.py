"""The Python API: the toolkit's engine from Python, the same one the command lines run.

    import mmjudge

    judge = mmjudge.Judge.load("OpenGVLab/InternVL2-4B")     # once: a Hub id, a local folder, a judge-train output
    records = judge.score("mmie/data.json")                   # a file, MMIE-shaped dicts or Samples; batched
    record = judge.score_one("What is shown?", "A cat on a mat.", images=["cat.png"], category="SA")
    verdicts = judge.compare(pairs, samples=3, temperature=0.7)   # pairs in memory or a file; options per call
    report = mmjudge.calibrate(records, "annotations.json")   # agreement with people: a calibration Report
    trained = mmjudge.fine_tune("OpenGVLab/InternVL2-4B", "train.json", "my-judge", config="tiny")

A door over the commands' engines, which never import it: `Judge` is infer/loaded.py's LoadedJudge (the
judge judge-score's local backend and judge-serve load, scoring through the same `score_batches`) with
judge-score's reading of inputs in front, so `Judge.score` returns the records judge-score writes to
eval_result.json and `Judge.compare` those it writes for pairs; `calibrate` is calibration/run.py's, which
judge-calibrate runs, and `fine_tune` train/run.py's, which judge-train runs.
What only the command lines do stays theirs: the journal that resumes a run, ranks under torchrun, the
benchmarks' own output files, the image probe.

Arguments have the names of the command lines' flags (`input_dir`, `config`, `rubrics` for --rubric) and
take the same values: a bundled file by name (`rubrics="tiny"`, `deepspeed="zero2"`) or a path; scoring
options and rubrics may also be given per call. Mistakes raise `mmjudge.judge.data.UsageError` (a setting) or
`InputError` (every problem of an input, each naming its record and field), before any model is used, their
messages naming the Python keywords (`keywords_named`). Every backbone is a checkpoint `Judge.load` reads
(judge/model.py), not another class. Nothing here imports torch until a judge is loaded (`calibrate` never
does), so `import mmjudge` stays cheap.
"""

from __future__ import annotations

import functools
import json
import re
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from mmjudge.calibration import run as calibration_run
from mmjudge.configs import DEFAULT_RUBRICS, bundled, by_name, rubric_paths
from mmjudge.infer.inputs import read_benchmark
from mmjudge.infer.loaded import LoadedJudge
from mmjudge.judge.cpu import use_free_cores
from mmjudge.judge.data import InputError, Pair, Problem, Sample, UsageError, is_pair_record, validate_samples
from mmjudge.train import run as train_run
from mmjudge.train.run import TrainResult

if TYPE_CHECKING:
    import torch
    from PIL import Image

    from mmjudge.judge.calibrator import Calibrator
    from mmjudge.judge.formats import BenchmarkInput, Format
    from mmjudge.judge.model import Judge as Model
    from mmjudge.judge.prompts import Rubric

PathLike = str | Path


class OptionalScoreFields(TypedDict, total=False):
    """A ScoreRecord's fields that only some judges write: a calibrator's three, where `score` was given one;
    `reward`, where the judge is a reward model (judge-train --objective bradley_terry)."""

    calibrated_score: float | None
    score_set: list[int | float] | None  # [lowest, highest] level of the calibrator's conformal set
    escalate: bool | None
    reward: float


class ScoreRecord(OptionalScoreFields):
    """A scored sample as `score` returns it: a record of judge-score's eval_result.json, field for field
    (judge.data.JudgeResult's fields; those of OptionalScoreFields only where they apply)."""

    id: str
    model: str | None
    category: str
    feedback: str
    score: int | float | None
    criteria: dict[str, int | float | None]
    score_distribution: dict[str, float] | None
    expected_score: float | None
    parse_error: str | None
    truncated: list[str]
    n_images: int
    n_tiles: int | None
    prompt_tokens: int
    generated_tokens: int
    judge_fingerprint: str | None
    rubric_fingerprint: str | None


class OrderRecord(TypedDict):
    """One judgement of a pair in one order (judge.data.OrderJudgement): `first` is the answer shown first."""

    first: Literal["A", "B"]
    feedback: str
    verdict: Literal["A", "B", "tie"] | None
    label: str | None
    criteria: dict[str, Literal["A", "B", "tie"] | None]
    verdict_distribution: dict[str, float] | None
    parse_error: str | None
    truncated: list[str]
    n_tiles: int | None
    prompt_tokens: int
    generated_tokens: int


class VerdictRecord(TypedDict):
    """A judged pair as `compare` returns it: a record of judge-score's eval_result.json for pairs, field for
    field (judge.data.PairResult's fields)."""

    id: str
    model_a: str | None
    model_b: str | None
    category: str
    group: str | None
    verdict: Literal["A", "B", "tie"] | None
    verdict_distribution: dict[str, float] | None
    rule: str
    swap_consistent: bool | None
    forward: list[OrderRecord]
    reverse: list[OrderRecord]
    scores: dict[str, ScoreRecord] | None  # a pointwise judge's: "A" and "B"
    n_images: int
    judge_fingerprint: str | None
    rubric_fingerprint: str | None


@dataclass(repr=False)
class Judge(LoadedJudge):
    """A judge model, loaded once with `Judge.load`, that scores samples by judge-score's protocol.

    Attributes: `path` (the checkpoint's folder), `model` (judge.model.Judge: the network, its tokenizer and
    settings), `device`, `fingerprint` (of its weights, judge/identity.py: each record names it, and a calibrator
    fitted on another judge's records is refused), and what `load` was given for scoring: `rubrics` (None: each
    input's own), `config` and `options`.
    """

    rubrics: list[Path] | None = None  # None: MMIE's for samples in memory, a benchmark format's for its files
    config: Path | None = None  # None: the input's format preset (configs/score/), MMIE's defaults for MMIE
    options: dict[str, Any] = field(default_factory=dict)  # ScoreOptions fields set by the caller, over the config

    @classmethod
    def load(cls, model_path: PathLike, *, device: str | None = None, dtype: str | torch.dtype | None = None, revision: str | None = None,
             rubrics: PathLike | Sequence[PathLike] | None = None, config: PathLike | None = None, **options) -> Judge:
        """Load a judge checkpoint once, ready to score.

        model_path: a local folder or a Hugging Face Hub id of any supported backbone (InternVL2/2.5/3 in its
            original or -hf layout, Qwen2.5-VL, Qwen3-VL, Qwen3.5), or a judge-train output (LoRA adapter or full weights).
            (judge-score --model_path)
        device: "cpu", "cuda" or "cuda:N" (default: cuda:LOCAL_RANK if a GPU is present, else cpu).
        dtype: "bfloat16", "float16", "float32" or a torch.dtype (default: bfloat16 on GPU, float32 on CPU).
        revision: branch, tag or commit where model_path is a Hub id (default: main).
        rubrics: rubric YAML files or folders, or bundled rubrics by name (default: each input's own, MMIE's
            sa, pbl, msr for MMIE samples). (--rubric)
        config: a scoring preset, YAML or bundled name such as "milebench" (default: the input format's). (--config)
        **options: scoring options (infer.options.ScoreOptions' fields: mode, max_new_tokens, token_budget,
            image_token_budget, prompt_token_budget, max_tiles, workers, structured, deterministic, ignore_stop) over the config.
        """
        use_free_cores()  # before torch loads, as every command (judge/cpu.py)
        from mmjudge.infer.options import options_for

        from mmjudge.judge.prompts import load_rubrics

        with keywords_named():  # every argument checked before the weights load, each named by its keyword
            _known_options(options)
            problems = [f"--{name}: give {wanted}, not {type(value).__name__}" for name, value, kinds, wanted in (
                ("model_path", model_path, (str, Path), "a local folder or a Hub id (a str or Path)"),
                ("revision", revision, (str, type(None)), "a branch, tag or commit name (a str)"),
                ("config", config, (str, Path, type(None)), "a scoring preset's path or bundled name (a str or Path)")) if not isinstance(value, kinds)]
            if isinstance(config, (str, Path)) and not by_name("score", config).is_file():
                problems.append(f"--config {config}: no such file, and no bundled scoring preset of that name "
                                f"({', '.join(bundled('score'))}; the training preset tiny is fine_tune's)")
            if problems:
                raise UsageError(problems[0] if len(problems) == 1 else "\n  ".join([f"{len(problems)} problems with the arguments:", *problems]))
            rubric_files = _rubric_files(rubrics)
            if rubric_files:
                load_rubrics(rubric_files)  # each rubric read and checked here, not at the first score()
            checked = options_for("mmie", config, options)  # every value that cannot work, refused before the weights load
            loaded = LoadedJudge.load(model_path, device, dtype, revision, checked.deterministic)
        return cls(loaded.path, loaded.model, loaded.device, loaded.fingerprint, rubric_files,
                   by_name("score", config) if config else None, options)

    def __repr__(self) -> str:
        return f"Judge({str(self.path)!r}, device={self.device!r})"

    def score(self, samples: PathLike | Iterable[dict | Sample | Pair], /, *, input_dir: PathLike | None = None, format: str | None = None,
              criteria_file: PathLike | None = None, calibrator: PathLike | Calibrator | None = None, allow_calibrator_mismatch: bool = False,
              rubrics: PathLike | Sequence[PathLike] | None = None, rubric: str | dict | Rubric | None = None, progress: bool = True,
              probe: str | None = None, probe_seed: int = 0, paraphrases: PathLike | list[dict] | None = None,
              **options) -> list[ScoreRecord] | list[VerdictRecord]:
        """Score samples (or judge pairs), batched by the engine; the records judge-score writes to
        eval_result.json, in input order.

        samples: a file judge-score reads (MMIE's JSON or JSONL, pairs, or another benchmark's file), or
            records in memory: MMIE-shaped dicts ({"id", "question", "answer", "category"?, "model"?,
            "gt_answer"?}, the question and answer each a text or a list of {"text"} / {"image"} segments)
            or `Sample`s; or pairs ({"id", "question", "answer_a", "answer_b", "category"?, ...}) or `Pair`s,
            judged in both orders as `compare` judges them. An image is a path or a PIL image (written
            losslessly to a temporary file for the engine).
        input_dir: the folder that relative image paths are read in (default: the file's folder; for records,
            the working directory). (--input_dir)
        format: the file's format, one of judge.formats.FORMATS (default: detected). (--format)
        criteria_file: MEGA-Bench's task rows, for its files only. (--criteria_file)
        calibrator: a judge-calibrate calibrator.json (or a Calibrator): adds calibrated_score, score_set and
            escalate to each record; for pairs, a pairwise judge's (a PairCalibrator) adds abstained and uncertainty;
            refused (UsageError) when fitted on another judge's scores or another rubric. (--calibrator)
        allow_calibrator_mismatch: apply such a calibrator anyway, with a warning. (--allow_calibrator_mismatch)
        rubrics: rubric files or folders, or bundled names, for this call (default: those `load` was given,
            else the input's own). (--rubric)
        rubric: one rubric given here, as a dict of a rubric file's keys ({"category", "instructions",
            "template", "criteria"?, "scale"?, ...}), its YAML text, or a Rubric: it judges its category in
            place of that category's rubric among the others.
        progress: show progress bars on stderr.
        probe: score perturbed copies instead, one of the bias suite's probes (judge/probes.py: blank, shuffle, blur,
            noise, quarter, reverse, contradict, verbosity, paraphrase): the records of the samples it applies to, each
            as judge-score writes it to probe_<probe>.json; compare them with `score`'s records by id. (--probe)
        probe_seed: the seed of the shuffle probe's draw and the noise probe's noise. (--probe_seed)
        paraphrases: for probe="paraphrase", [{"id", "answer"}] records or their JSON file. (--paraphrases)
        **options: scoring options for this call (infer.options.ScoreOptions' fields: max_new_tokens, mode,
            and for pairs samples, temperature, top_p, seed, pair_rule, ...), over those `load` was given;
            the judge is not loaded again.

        Every problem of the input (a missing image, a record without an answer, a category no rubric
        judges, a prompt past the judge's context unless prompt_token_budget cuts it) is raised at once as an
        InputError, before the model runs.
        """
        with keywords_named():
            return self._judged(samples, None, input_dir, format, criteria_file, calibrator, allow_calibrator_mismatch, rubrics, rubric,
                                progress, options, (probe, probe_seed, paraphrases) if probe is not None else None)

    def compare(self, pairs: PathLike | Iterable[dict | Pair], /, *, input_dir: PathLike | None = None, format: str | None = None,
                rubrics: PathLike | Sequence[PathLike] | None = None, rubric: str | dict | Rubric | None = None, progress: bool = True,
                **options) -> list[VerdictRecord]:
        """Judge pairs of answers, each in both orders; the records judge-score writes for pairs (a verdict
        A, B or tie, its distribution, each order's judgement), in input order.

        pairs: dicts ({"id", "question", "answer_a", "answer_b", "model_a"?, "model_b"?, "category"?,
            "group"?}; the question and answers as `score`'s samples have them) or `Pair`s, or a file of
            pairs (the toolkit's, or a judge benchmark's: VL-RewardBench, Multimodal RewardBench, MMRB2,
            OpenING). A pair of category general (the default) is judged by the pairwise rubric; one of
            MMIE's categories by scoring each answer with MMIE's rubric.
        input_dir, format, rubrics, rubric, progress: as `score`'s.
        **options: scoring options for this call, as `score`'s: samples (judgements per order, majority
            voted), temperature, top_p, seed, pair_rule, tie_margin, max_new_tokens, ...
        """
        with keywords_named():
            return self._judged(pairs, "pairs", input_dir, format, None, None, False, rubrics, rubric, progress, options)

    def score_one(self, question: str | list[dict], answer: str | list[dict], images: Sequence[PathLike | Image.Image] = (), *,
                  category: str | None = None, reference: str | None = None, model: str | None = None, **score_args) -> ScoreRecord:
        """Score one answer; its record as `score` returns it.

        question, answer: texts, or lists of MMIE segments ({"text": ...} / {"image": path or PIL image}).
        images: the answer's images, shown after its text (paths or PIL images; None: none).
        category: the rubric that judges it (default: the only rubric's, where one is loaded or given;
            MMIE's rubrics are SA, PBL and MSR).
        reference: a reference answer, for rubrics that show one (MMIE's MSR).
        model: the answering model's name, kept in the record.
        **score_args: `score`'s keywords (input_dir, calibrator, rubrics, rubric, progress) and scoring options.
        """
        from PIL import Image

        with keywords_named():
            if isinstance(images, (str, Path, Image.Image)):  # one image, not a sequence of characters (c, a, t, ...)
                images = [images]
            elif images is None:
                images = []
            answer_segments = _segments(answer, "answer") + [{"image": image} for image in images]
            given = _rubric(score_args.get("rubric"), None)
            record = {"id": "sample", "question": _segments(question, "question"), "answer": answer_segments,
                      "category": category or (given.category if given else self._only_category(score_args.get("rubrics"))), "model": model}
            if reference is not None:
                record["gt_answer"] = reference
        return self.score([record], **{"progress": False, **score_args})[0]

    def _judged(self, items, wanted: str | None, input_dir, format_name, criteria_file, calibrator, allow_calibrator_mismatch, rubrics, rubric,
                progress, given: dict, probe: tuple | None = None) -> list[dict]:
        """`score` and `compare`: the input read and checked as judge-score checks it, then the engine's
        records. `wanted`: "pairs" where only pairs may come; `probe`: (kind, seed, paraphrases) of `score`'s probe."""
        from mmjudge.infer.engine import STRUCTURED_PAIRS
        from mmjudge.infer.options import PAIR_OPTIONS, options_for
        from mmjudge.judge.calibrator import PairCalibrator, as_records, load_calibrator
        from mmjudge.judge.identity import stamp
        from mmjudge.judge.prompts import rubric_problems

        _known_options(given)
        with tempfile.TemporaryDirectory(prefix="mmjudge-images-") as images:
            rubric_set = _rubric_files(rubrics) or self.rubrics
            fmt, bench, image_root = self._read(items, wanted or "samples", input_dir, format_name, criteria_file, rubric_set,
                                                _rubric(rubric, Path(images)), Path(images))
            if problems := bench.problems + rubric_problems(bench.samples, bench.rubrics, bench.path):
                raise InputError(problems)
            pairs = bool(bench.samples) and isinstance(bench.samples[0], Pair)
            if wanted == "pairs" and not pairs:
                where = f"{bench.path} holds" if isinstance(items, (str, Path)) else "these are"
                raise UsageError(f"pairs: {where} single answers ({fmt.name}'s samples), not pairs; score them with score")
            if not pairs and (pair_options := [name for name in PAIR_OPTIONS if name in given]):
                raise UsageError(f"{', '.join(pair_options)}: for pairs of answers; these samples are single answers")
            options = options_for(fmt.name, self.config, {**self.options, **given})
            if pairs and options.structured and any(r.kind == "pairwise" for r in bench.rubrics.values()):
                raise UsageError(STRUCTURED_PAIRS)
            if calibrator is not None:
                scored = {c: bench.rubrics[c] for c in sorted({s.category for s in bench.samples})}
                where = calibrator if isinstance(calibrator, (str, Path)) else "(given)"
                calibrator = calibrator if isinstance(calibrator, PairCalibrator) else load_calibrator(calibrator, list(scored.values()), pairs)
                for warning in calibrator.check_fit(where, f"the judge {self.path}", self.fingerprint, scored, allow_calibrator_mismatch):
                    warnings.warn(warning, stacklevel=3)
            samples = bench.samples if probe is None else _probed(bench.samples, pairs, probe, image_root, Path(images))
            indexed = list(enumerate(samples))
            results = {r.id: r for batch in self.score_batches(indexed, bench.rubrics, options, image_root, progress, str(bench.path)) for r in batch}
        return as_records(stamp([results[s.id] for s in samples], self.fingerprint, bench.rubrics), calibrator)

    def _read(self, items, what: str, input_dir, format_name, criteria_file, rubric_set: list[Path] | None, rubric: Rubric | None,
              images: Path) -> tuple[Format, BenchmarkInput, Path]:
        """The input as judge-score reads it: a file through its format, records as MMIE samples or as pairs
        (their PIL images written into `images`), judged by `rubric_set` (None: the format's) and `rubric`."""
        from mmjudge.judge.formats import FORMATS, BenchmarkInput, detect_format
        from mmjudge.judge.prompts import load_rubrics

        if format_name is not None and format_name not in FORMATS:
            raise UsageError(f"--format {format_name}: one of {', '.join(FORMATS)}")
        if isinstance(items, (dict, Sample, Pair)):
            raise UsageError(f"{what}: give a list of {what} (or {'score_one' if what == 'samples' else 'a list of one'} for one)")
        if not isinstance(items, (str, Path, Iterable)):
            raise UsageError(f"{what}: give a file's path or a list of {what}, not {type(items).__name__}")
        if isinstance(items, (str, Path)):
            path = Path(items)
            fmt = FORMATS[format_name] if format_name else detect_format(path)
            root = Path(input_dir) if input_dir is not None else path.parent
            loaded = load_rubrics(rubric_set or fmt.default_rubrics)
            return fmt, read_benchmark(fmt, path, root, {**loaded, **_by_category(rubric)}, criteria_file), root
        if format_name not in (None, "mmie", "pairs") or criteria_file is not None:
            raise UsageError("format and criteria_file apply to a benchmark's file; records given in memory are MMIE's samples or pairs")
        records = [_with_image_files(s, i, images) for i, s in enumerate(items)]
        fmt = FORMATS["pairs" if records and _is_pair(records[0]) else "mmie"]
        root = Path(input_dir) if input_dir is not None else Path.cwd()
        valid, problems, notes = validate_samples(what, root, Pair if fmt.name == "pairs" else Sample, records=records)
        loaded = {**load_rubrics(rubric_set or fmt.default_rubrics), **_by_category(rubric)}
        return fmt, BenchmarkInput(Path(what), valid, problems, loaded, None, notes), root

    def _only_category(self, rubrics: PathLike | Sequence[PathLike] | None = None) -> str:
        from mmjudge.judge.prompts import load_rubrics

        # a pairwise rubric judges pairs, never one answer
        given = _rubric_files(rubrics) or self.rubrics or DEFAULT_RUBRICS
        categories = [category for category, rubric in load_rubrics(given).items() if rubric.kind != "pairwise"]
        if len(categories) != 1:
            raise UsageError(f"category: give the rubric that judges the answer, one of {', '.join(categories)}")
        return categories[0]


def _rubric_files(rubrics: PathLike | Sequence[PathLike] | None) -> list[Path] | None:
    """`rubrics=` as the rubric files or folders it names (rubric_paths), each a path or a bundled name that is
    there; None: none given."""
    from mmjudge.judge.cli import path_problems

    if rubrics is None:
        return None
    listed = list(rubrics) if isinstance(rubrics, (list, tuple)) else [rubrics]
    if problems := path_problems([("--rubric", by_name("rubrics", r) if isinstance(r, (str, Path)) and r else r, "file_or_dir") for r in listed]):
        raise UsageError(problems[0] if len(problems) == 1 else "\n  ".join([f"{len(problems)} problems with the rubrics:", *problems]))
    return rubric_paths(listed)


def _known_options(given: dict) -> None:
    """Scoring options by keyword: each a ScoreOptions field."""
    from mmjudge.infer.options import ScoreOptions

    known = [f.name for f in fields(ScoreOptions)]
    if unknown := sorted(set(given) - set(known)):
        raise UsageError(f"unknown scoring option(s) {', '.join(unknown)}; the options are {', '.join(known)}")


def _is_pair(record: object) -> bool:
    return isinstance(record, Pair) or is_pair_record(record)


def _rubric(rubric: str | dict | Rubric | None, folder: Path | None) -> Rubric | None:
    """One rubric given in a call: a Rubric, a dict of a rubric file's keys, or its YAML text, checked as
    judge-score checks a rubric file (its text is written into `folder` and read back; None: not kept)."""
    from mmjudge.judge.data import Problem
    from mmjudge.judge.prompts import Rubric, load_rubrics

    if rubric is None or isinstance(rubric, Rubric):
        return rubric
    if not isinstance(rubric, (str, dict)):
        raise UsageError(f"rubric: give a dict of a rubric file's keys, its YAML text or a Rubric, not {type(rubric).__name__}")
    import yaml

    with tempfile.TemporaryDirectory(prefix="mmjudge-rubric-") if folder is None else nullcontext(folder) as where:
        file = Path(where) / "rubric.yaml"
        file.write_text(rubric if isinstance(rubric, str) else yaml.safe_dump(rubric, allow_unicode=True), encoding="utf-8")
        try:
            [(_, loaded)] = load_rubrics([file]).items()
        except InputError as err:  # named as the caller gave it, not by the temporary file
            raise InputError([Problem("rubric", p.message, None, p.record_id, p.field)
                              for p in err.problems]) from None
        except ValueError:
            raise UsageError("rubric: one rubric, not a list of them; give rubrics= for several") from None
    return loaded


def _by_category(rubric: Rubric | None) -> dict:
    return {rubric.category: rubric} if rubric is not None else {}


def _segments(value: str | list[dict], name: str) -> list[dict]:
    if not isinstance(value, (str, list, tuple)):
        raise UsageError(f"{name}: give a text or a list of segments ({{'text': ...}} or {{'image': ...}}), not {type(value).__name__}")
    return [{"text": value}] if isinstance(value, str) else list(value)


# The modes a PNG holds without loss; another (CMYK, a float image) goes to TIFF, which holds those.
PNG_MODES = {"1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"}


def _with_image_files(sample: dict | Sample, index: int, images: Path) -> object:
    """A record of `sample` whose PIL images are files in `images`, written without loss (EXIF kept, for
    an orientation the tiling may read) and named by where they stand; Paths as text. The caller's
    objects are not changed; an image the judge cannot see (closed, empty, of a mode no file holds) is an
    InputError naming it."""
    from PIL import Image

    from mmjudge.judge.vision import image_problem

    if isinstance(sample, (Sample, Pair)):
        return sample.model_dump(exclude_none=True)
    if not isinstance(sample, dict):
        return sample  # the validator names what is wrong with it

    def as_file(segment: object, key: str, k: int) -> object:
        image = segment.get("image") if isinstance(segment, dict) else None
        if isinstance(image, Path):
            return {**segment, "image": str(image)}
        if not isinstance(image, Image.Image):
            return segment
        if (problem := image_problem(image)) is not None:
            raise InputError([Problem("samples", problem, index, sample.get("id"), f"{key}[{k}].image")])
        path = images / f"{index}-{key}-{k}.{'png' if image.mode in PNG_MODES else 'tiff'}"
        image.save(path, exif=image.getexif())
        return {**segment, "image": str(path)}

    return {key: [as_file(segment, key, k) for k, segment in enumerate(value)]
            if key in ("question", "answer", "answer_a", "answer_b", "gt_answer") and isinstance(value, list) else value
            for key, value in sample.items()}


# How the API names what the engines' messages name by the command lines' flags: a flag is the keyword of its
# name (--max_new_tokens is max_new_tokens=), but for these.
KEYWORDS = {"rubric": "rubrics", "by": "group_by", "predictions": "predictions", "input_file": "samples"}


def as_keywords(message: str) -> str:
    """A message of the engines' in the API's words: `--config tiny` as `config tiny`, `--rubric` as `rubrics`."""
    return re.sub(r"(?<![\w-])--([a-z][a-z0-9_]*)", lambda match: KEYWORDS.get(match[1], match[1]), message)


@contextmanager
def keywords_named() -> Iterator[None]:
    """A UsageError or InputError raised within names the Python keywords of what was given, not the command
    lines' flags."""
    try:
        yield
    except UsageError as err:
        raise UsageError(as_keywords(str(err))) from None
    except InputError as err:
        raise InputError([replace(p, file=as_keywords(p.file), message=as_keywords(p.message)) for p in err.problems]) from None


def _door(engine):
    """The engine's function as the API gives it: the same arguments and docstring, its errors in keywords."""
    @functools.wraps(engine)
    def door(*args, **kwargs):
        with keywords_named():
            return engine(*args, **kwargs)

    return door


calibrate = _door(calibration_run.calibrate)
fine_tune = _door(train_run.fine_tune)


def _probed(samples: list, pairs: bool, probe: tuple, image_root: Path, scratch: Path) -> list:
    """`score`'s probe: the perturbed copies of the samples it applies to (infer/probe.py), as judge-score's --probe makes them."""
    from mmjudge.infer.probe import probed_samples, read_paraphrases
    from mmjudge.judge.probes import PROBES

    kind, seed, paraphrases = probe
    if kind not in PROBES:
        raise UsageError(f"probe {kind!r}: one of {', '.join(PROBES)}")
    if pairs:
        raise UsageError("probe applies to samples, not pairs (judging both orders is the position probe)")
    if (kind == "paraphrase") != (paraphrases is not None):
        raise UsageError('probe="paraphrase" reads its rewordings from paraphrases: give both or neither')
    if isinstance(paraphrases, list):
        (scratch / "paraphrases.json").write_text(json.dumps(paraphrases))
        paraphrases = scratch / "paraphrases.json"
    rewordings = read_paraphrases(Path(paraphrases), samples) if paraphrases is not None else None
    probed, notes = probed_samples(samples, kind, seed, image_root, scratch, rewordings)
    for note in notes:
        warnings.warn(f"probe {kind}: {note}", stacklevel=4)
    return probed
