"""The Python API: the toolkit's engine from Python, the same one the command lines run.

    import mmjudge

    judge = mmjudge.Judge.load("OpenGVLab/InternVL2-4B")     # once: a Hub id, a local folder, a judge-train output
    records = judge.score("mmie/data.json")                   # a file, MMIE-shaped dicts or Samples; batched
    record = judge.score_one("What is shown?", "A cat on a mat.", images=["cat.png"], category="SA")
    report = mmjudge.calibrate(records, "annotations.json")   # agreement with people: a calibration Report
    trained = mmjudge.fine_tune("OpenGVLab/InternVL2-4B", "train.json", "my-judge", config="tiny")

Two doors, one engine: `Judge.score` returns the records judge-score writes to eval_result.json, made by the
same code (judge-score's local backend loads its judge with `Judge.load` and scores through
`Judge.score_batches`); judge-calibrate is `calibrate` and judge-train is `fine_tune` with flags in front.
What only the command lines do stays theirs: the journal that resumes a run, ranks under torchrun, the
benchmarks' own output files, the image probe.

Arguments have the names of the command lines' flags (`input_dir`, `config`, `rubrics` for --rubric) and
take the same values: a bundled file by name (`config="tiny"`, `rubrics="tiny"`, `deepspeed="zero2"`) or a
path. Mistakes raise `mmjudge.judge.data.UsageError` (a setting) or `InputError` (every problem of an input,
each naming its record and field), before any model is used.

The shape leaves room for what comes next: pairwise judging adds `compare` / `compare_one` beside `score` /
`score_one` on the same `Judge`, returning verdict records; another backbone is another checkpoint that
`Judge.load` reads (judge/model.py), not another class. Nothing here imports torch until a judge is loaded
(`calibrate` never does), so `import mmjudge` stays cheap.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmjudge.configs import DEFAULT_RUBRICS, by_name
from mmjudge.judge.cpu import use_free_cores
from mmjudge.judge.data import InputError, Pair, PairResult, Sample, UsageError, validate_samples

if TYPE_CHECKING:
    import torch
    from PIL import Image

    from mmjudge.calibration.analysis import Report
    from mmjudge.infer.options import ScoreOptions
    from mmjudge.infer.progress import Bar
    from mmjudge.judge.calibrator import Calibrator
    from mmjudge.judge.data import JudgeResult
    from mmjudge.judge.formats import BenchmarkInput, Format
    from mmjudge.judge.model import Judge as Model
    from mmjudge.judge.prompts import Rubric

PathLike = str | Path
DTYPES = ("bfloat16", "float16", "float32")
IN_MEMORY = "samples"  # how a problem of samples given in memory names them


class Judge:
    """A judge model, loaded once with `Judge.load`, that scores samples by judge-score's protocol.

    Attributes: `path` (the checkpoint's folder), `model` (judge.model.Judge: the network, its tokenizer and
    settings), `device`, `fingerprint` (of its weights, judge/identity.py: each record names it, and a calibrator
    fitted on another judge's records is refused), and what `load` was given for scoring: `rubrics` (None: each
    input's own), `config` and `options`.
    """

    def __init__(self, path: Path, model: Model, device: str, rubrics: list[Path] | None = None, config: Path | None = None,
                 options: dict[str, Any] | None = None, fingerprint: str | None = None):
        self.path, self.model, self.device, self.fingerprint = path, model, device, fingerprint
        self.rubrics = rubrics  # None: MMIE's for samples in memory, a benchmark format's for its files
        self.config = config  # None: the input's format preset (configs/score/), MMIE's defaults for MMIE
        self.options = options or {}  # ScoreOptions fields set by the caller, over the config

    @classmethod
    def load(cls, model_path: PathLike, *, device: str | None = None, dtype: str | torch.dtype | None = None, revision: str | None = None,
             rubrics: PathLike | Sequence[PathLike] | None = None, config: PathLike | None = None, **options) -> Judge:
        """Load a judge checkpoint once, ready to score.

        model_path: a local folder or a Hugging Face Hub id of any supported backbone (InternVL2/2.5/3 in its
            original or -hf layout, Qwen2.5-VL, Qwen3-VL), or a judge-train output (LoRA adapter or full weights).
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
        from mmjudge.infer.options import ScoreOptions, options_for

        known = [f.name for f in fields(ScoreOptions)]
        if unknown := sorted(set(options) - set(known)):
            raise UsageError(f"unknown scoring option(s) {', '.join(unknown)}; the options are {', '.join(known)}")
        checked = options_for("mmie", config, options)  # every value that cannot work, refused before the weights load
        import torch

        from mmjudge.judge.identity import weights_fingerprint
        from mmjudge.judge.model import load_judge, weight_files

        if isinstance(dtype, str) and dtype not in DTYPES:
            raise UsageError(f"--dtype {dtype}: one of {', '.join(DTYPES)}")
        device = checked_device(device or default_device(), checked.deterministic)
        path = find_checkpoint(model_path, revision).path
        fingerprint = weights_fingerprint(weight_files(path))
        model = load_judge(path, device, getattr(torch, dtype) if isinstance(dtype, str) else dtype)
        return cls(path, model, device, rubric_paths(rubrics), by_name("score", config) if config else None, options, fingerprint)

    def __repr__(self) -> str:
        return f"Judge({str(self.path)!r}, device={self.device!r})"

    def score(self, samples: PathLike | Iterable[dict | Sample], *, input_dir: PathLike | None = None, format: str | None = None,
              criteria_file: PathLike | None = None, calibrator: PathLike | Calibrator | None = None, allow_calibrator_mismatch: bool = False,
              progress: bool = True) -> list[dict]:
        """Score samples, batched by the engine; the records judge-score writes to eval_result.json, in input order.

        samples: a file judge-score reads (MMIE's JSON or JSONL, or a MileBench, Inst-It or MEGA-Bench file),
            or MMIE-shaped records: dicts ({"id", "question", "answer", "category"?, "model"?, "gt_answer"?},
            the question and answer each a text or a list of {"text"} / {"image"} segments) or `Sample`s.
            An image is a path or a PIL image (written losslessly to a temporary file for the engine).
        input_dir: the folder that relative image paths are read in (default: the file's folder; for records,
            the working directory). (--input_dir)
        format: the file's benchmark format, mmie, milebench, instit or megabench (default: detected). (--format)
        criteria_file: MEGA-Bench's task rows, for its files only. (--criteria_file)
        calibrator: a judge-calibrate calibrator.json (or a Calibrator): adds calibrated_score, score_set and
            escalate to each record; refused (UsageError) when fitted on another judge's scores or another
            rubric. (--calibrator)
        allow_calibrator_mismatch: apply such a calibrator anyway, with a warning. (--allow_calibrator_mismatch)
        progress: show progress bars on stderr.

        Every problem of the input (a missing image, a record without an answer, a category no rubric
        judges) is raised at once as an InputError, before the model runs.
        """
        from mmjudge.infer.options import options_for
        from mmjudge.judge.calibrator import as_records, load_calibrator
        from mmjudge.judge.identity import stamp
        from mmjudge.judge.prompts import rubric_problems

        with tempfile.TemporaryDirectory(prefix="mmjudge-images-") as images:
            fmt, bench, image_root = self._read(samples, input_dir, format, criteria_file, Path(images))
            if problems := bench.problems + rubric_problems(bench.samples, bench.rubrics, bench.path):
                raise InputError(problems)
            options = options_for(fmt.name, self.config, self.options)
            if calibrator is not None:
                scored = {c: bench.rubrics[c] for c in sorted({s.category for s in bench.samples})}
                where = calibrator if isinstance(calibrator, (str, Path)) else "(given)"
                calibrator = load_calibrator(calibrator, list(scored.values()))
                for warning in calibrator.check_fit(where, f"the judge {self.path}", self.fingerprint, scored, allow_calibrator_mismatch):
                    warnings.warn(warning, stacklevel=2)
            indexed = list(enumerate(bench.samples))
            results = {r.id: r for batch in self.score_batches(indexed, bench.rubrics, options, image_root, progress) for r in batch}
        return as_records(stamp([results[s.id] for s in bench.samples], self.fingerprint, bench.rubrics), calibrator)

    def score_one(self, question: str | list[dict], answer: str | list[dict], images: Sequence[PathLike | Image.Image] = (), *,
                  category: str | None = None, reference: str | None = None, model: str | None = None, **score_args) -> dict:
        """Score one answer; its record as `score` returns it.

        question, answer: texts, or lists of MMIE segments ({"text": ...} / {"image": path or PIL image}).
        images: the answer's images, shown after its text (paths or PIL images).
        category: the rubric that judges it (default: the only rubric's, where one is loaded; MMIE's
            rubrics are SA, PBL and MSR).
        reference: a reference answer, for rubrics that show one (MMIE's MSR).
        model: the answering model's name, kept in the record.
        **score_args: `score`'s keywords (input_dir, calibrator, progress).
        """
        from PIL import Image

        if isinstance(images, (str, Path, Image.Image)):  # one image, not a sequence of characters (c, a, t, ...)
            images = [images]
        answer_segments = _segments(answer, "answer") + [{"image": image} for image in images]
        record = {"id": "sample", "question": _segments(question, "question"), "answer": answer_segments,
                  "category": category or self._only_category(), "model": model}
        if reference is not None:
            record["gt_answer"] = reference
        return self.score([record], **{"progress": False, **score_args})[0]

    def score_batches(self, samples: list[tuple[int, Sample | Pair]], rubrics: dict[str, Rubric], options: ScoreOptions, input_dir: PathLike,
                      progress: bool | Callable[[str], Bar] = False) -> Iterator[list[JudgeResult | PairResult]]:
        """The engine (infer/engine.py) on samples already checked, each with its index in the input: their
        results a batch at a time as they finish, in no set order. judge-score's local backend scores
        through this with its journal; `score` is this plus reading and checking the input. `progress`: bars
        of these samples on stderr, or none; or what makes each bar (judge-score's count every rank's samples)."""
        from mmjudge.infer.engine import prepare
        from mmjudge.infer.progress import Bar, counted
        from mmjudge.infer.rewards import scorer_for

        bar = progress if callable(progress) else (lambda what: Bar(what, len(samples), show=progress))
        scorer = scorer_for(self.model, rubrics, options, self.device)
        with bar("preparing") as preparing:
            items = prepare(self.model, counted(samples, preparing), rubrics, Path(input_dir), options)
        with bar("scoring") as scoring:  # moved by every token written, so that a batch of all the samples moves it too
            for batch in scorer.judged(items, progress=scoring.update):
                yield [result for _, result in batch]

    def _read(self, samples, input_dir, format_name, criteria_file, images: Path) -> tuple[Format, BenchmarkInput, Path]:
        """The input as judge-score reads it: a file through its format, records as MMIE samples (their PIL
        images written into `images`)."""
        from mmjudge.judge.formats import FORMATS, BenchmarkInput, detect_format
        from mmjudge.judge.prompts import load_rubrics

        if format_name is not None and format_name not in FORMATS:
            raise UsageError(f"--format {format_name}: one of {', '.join(FORMATS)}")
        if isinstance(samples, (dict, Sample)):
            raise UsageError("samples: give a list of samples (or score_one for one answer)")
        if not isinstance(samples, (str, Path, Iterable)):
            raise UsageError(f"samples: give a file's path or a list of samples, not {type(samples).__name__}")
        if isinstance(samples, (str, Path)):
            path = Path(samples)
            fmt = FORMATS[format_name] if format_name else detect_format(path)
            root = Path(input_dir) if input_dir is not None else path.parent
            return fmt, read_benchmark(fmt, path, root, self.rubrics, criteria_file), root
        if format_name not in (None, "mmie") or criteria_file is not None:
            raise UsageError("format and criteria_file apply to a benchmark's file; samples given in memory are MMIE's")
        records = [_with_image_files(s, i, images) for i, s in enumerate(samples)]
        root = Path(input_dir) if input_dir is not None else Path.cwd()
        fmt = FORMATS["mmie"]
        valid, problems, notes = validate_samples(IN_MEMORY, root, records=records)
        return fmt, BenchmarkInput(Path(IN_MEMORY), valid, problems, load_rubrics(self.rubrics or fmt.default_rubrics), None, notes), root

    def _only_category(self) -> str:
        from mmjudge.judge.prompts import load_rubrics

        # a pairwise rubric judges pairs, never one answer
        categories = [category for category, rubric in load_rubrics(self.rubrics or DEFAULT_RUBRICS).items() if rubric.kind != "pairwise"]
        if len(categories) != 1:
            raise UsageError(f"category: give the rubric that judges the answer, one of {', '.join(categories)}")
        return categories[0]


def read_benchmark(fmt: Format, path: Path, input_dir: Path, rubrics: Sequence[PathLike] | None, criteria_file: PathLike | None,
                   notes: bool = True) -> BenchmarkInput:
    """A benchmark's file read as judge-score reads it, with its rubrics (`rubrics`, or the format's): every
    problem of the file listed in the result, nothing of a model used yet. `notes`: print what the reader
    noticed (once per run: judge-score's rank 0)."""
    from mmjudge.judge.prompts import load_rubrics

    if criteria_file and fmt.name != "megabench":
        raise UsageError(f"--criteria_file applies to --format megabench only, not {fmt.name}")
    bench = fmt.read(path, input_dir, load_rubrics(rubrics or fmt.default_rubrics), Path(criteria_file) if criteria_file else None)
    bench.problems.sort(key=lambda p: (p.index is not None, p.index or 0))
    for note in bench.notes if notes else ():
        print(f"note: {note}", file=sys.stderr)
    return bench


def rubric_paths(rubrics: PathLike | Sequence[PathLike] | None) -> list[Path] | None:
    """Rubric files or folders, each a bundled one's name or a path."""
    if rubrics is None:
        return None
    return [by_name("rubrics", r) for r in ([rubrics] if isinstance(rubrics, (str, Path)) else rubrics)]


def find_checkpoint(name: PathLike, revision: str | None, flag: str = "--model_path"):
    """The checkpoint `name` names (judge.hub.Checkpoint: a local folder, or a Hub id's files fetched into
    the cache); where it names none, the error names its flag."""
    from mmjudge.judge.model import find_checkpoint as find

    try:
        return find(name, revision)
    except UsageError as err:
        named = f"{flag} {err}" if name and str(err).startswith(f"{name}: ") else f"{flag} {name}: {err}" if name else f"{flag}: {err}"
        raise UsageError(named) from None


def default_device() -> str:
    import torch

    return f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"


def checked_device(device: str, deterministic: bool | None = None) -> str:
    """The device, refused before anything loads where torch cannot use it, or where a `deterministic` run's
    kernels cannot run (Triton's, on a CUDA GPU: infer/batch_invariant.py)."""
    import torch

    from mmjudge.infer.batch_invariant import triton_runs_on

    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise UsageError(f"--device {device}: not a device; give cpu, cuda or cuda:N") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: torch sees no CUDA GPU here (use --device cpu, or a CUDA build of torch)")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: torch sees {torch.cuda.device_count()} GPU(s), numbered from 0")
    if deterministic and not triton_runs_on(parsed):
        where = "Triton is not installed (it comes with PyTorch's CUDA builds)" if parsed.type == "cuda" else f"--device {device} is not a CUDA GPU"
        raise UsageError(f"--deterministic runs batch-invariant Triton kernels on a CUDA GPU, and {where}; "
                         "leave --deterministic out to score here")
    return device


def _segments(value: str | list[dict], name: str) -> list[dict]:
    if not isinstance(value, (str, list, tuple)):
        raise UsageError(f"{name}: give a text or a list of segments ({{'text': ...}} or {{'image': ...}}), not {type(value).__name__}")
    return [{"text": value}] if isinstance(value, str) else list(value)


# The modes a PNG holds without loss; another (CMYK, a float image) goes to TIFF, which holds those.
PNG_MODES = {"1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"}


def _with_image_files(sample: dict | Sample, index: int, images: Path) -> object:
    """A record of `sample` whose PIL images are files in `images`, written without loss (EXIF kept, for
    an orientation the tiling may read) and named by where they stand; Paths as text. The caller's
    objects are not changed."""
    from PIL import Image

    if isinstance(sample, Sample):
        return sample.model_dump(exclude_none=True)
    if not isinstance(sample, dict):
        return sample  # the validator names what is wrong with it

    def as_file(segment: object, where: str) -> object:
        image = segment.get("image") if isinstance(segment, dict) else None
        if isinstance(image, Path):
            return {**segment, "image": str(image)}
        if not isinstance(image, Image.Image):
            return segment
        path = images / f"{where}.{'png' if image.mode in PNG_MODES else 'tiff'}"
        image.save(path, exif=image.getexif())
        return {**segment, "image": str(path)}

    return {key: [as_file(segment, f"{index}-{key}-{k}") for k, segment in enumerate(value)]
            if key in ("question", "answer", "gt_answer") and isinstance(value, list) else value
            for key, value in sample.items()}


@dataclass(frozen=True)
class TrainResult:
    """What `fine_tune` made: the trained judge's folder (load it with `Judge.load`), the optimizer steps
    run, and the held-out overall Pearson its checkpoint was chosen by (None: no eval_file, or undefined
    at every evaluation)."""

    output_dir: Path
    global_step: int
    best: float | None  # the held-out measure the checkpoint was chosen by
    measure: str  # which: the overall Pearson, or on pairs the accuracy with ties
    evaluated: bool  # an eval_file chose the checkpoint


def fine_tune(model_path: PathLike, train_file: PathLike, output_dir: PathLike, *, input_dir: PathLike | None = None,
              eval_file: PathLike | None = None, config: PathLike | None = None, rubrics: PathLike | Sequence[PathLike] | None = None,
              deepspeed: PathLike | None = None, resume: bool = False, revision: str | None = None, **settings) -> TrainResult:
    """Fine-tune a judge on human-rated annotations by the recipe of train/recipe.py (judge-train).

    model_path: the base judge, a local folder or a Hub id. (--model_path)
    train_file: annotations to learn from (JSON list or JSONL). (--train_file)
    output_dir: a new or empty folder for the trained judge and its checkpoints (unless resume). (--output_dir)
    input_dir: the folder that image paths in the annotations are read in (default: train_file's folder). (--input_dir)
    eval_file: held-out annotations scored at every checkpoint; the best by overall Pearson is kept. (--eval_file)
    config: a training preset, YAML or bundled name such as "tiny" (default: none). (--config)
    rubrics: rubric files or folders, or bundled names (default: sa, pbl, msr). (--rubric)
    deepspeed: a DeepSpeed JSON or bundled name: zero2, zero3, zero3_offload (default: none). (--deepspeed)
    resume: continue from the last checkpoint in output_dir. (--resume)
    revision: branch, tag or commit where model_path is a Hub id. (--revision)
    **settings: train.config.TrainConfig's fields (learning_rate, lora_r, max_steps, ...) over the config.

    Under torchrun or the deepspeed launcher every rank calls it, as every rank runs judge-train.
    """
    use_free_cores()  # before torch loads, as every command (judge/cpu.py)
    from mmjudge.judge.cli import settings_from_config
    from mmjudge.train.config import TrainConfig, config_problems, unused_settings

    known = [f.name for f in fields(TrainConfig)]
    if unknown := sorted(set(settings) - set(known)):
        raise UsageError(f"unknown training setting(s) {', '.join(unknown)}; the settings are {', '.join(known)}")
    config = by_name("train", config) if config else None
    deepspeed = str(by_name("deepspeed", deepspeed)) if deepspeed else None
    rubric_files = rubric_paths(rubrics) or list(default_rubrics(Path(train_file)))
    cfg = settings_from_config(TrainConfig, config, argparse.Namespace(**settings))
    out, train_file = Path(output_dir), Path(train_file)
    inputs = [("--model_path", model_path), ("--train_file", train_file), ("--eval_file", eval_file), ("--config", config),
              ("--deepspeed", deepspeed), *[("--rubric", path) for path in rubric_files]]
    from mmjudge.train.checkpoints import run_problems

    # A setting's problem names the config it may come from; the others name their flag or file.
    problems = [f"{config} (or its flag): {p}" if config else p for p in config_problems(cfg)] + unused_settings(cfg, settings)
    problems += run_problems(out, resume, deepspeed, inputs)
    if problems:
        raise UsageError(problems[0] if len(problems) == 1 else f"{len(problems)} problems with the settings and flags:\n  " + "\n  ".join(problems))
    from mmjudge.judge.distributed import end_process_group
    from mmjudge.judge.outputs import locked
    from mmjudge.judge.prompts import load_rubrics
    from mmjudge.train.data import check_scales, read_annotations
    from mmjudge.train.recipe import train

    # Every problem of the inputs, then of the base, before output_dir is taken: a run refused leaves none behind.
    loaded = load_rubrics(rubric_files)
    image_root = Path(input_dir) if input_dir is not None else train_file.parent
    annotations = read_annotations(train_file, Path(eval_file) if eval_file else None, image_root, loaded, cfg.scale, cfg.objective)
    check_scales(annotations[0] + annotations[1], loaded, cfg.scale)
    base = find_checkpoint(model_path, revision)
    # Rank 0 holds output_dir for the run; the others wait for it in the Trainer's process group.
    with locked(out, "judge-train") if int(os.environ.get("RANK", "0")) == 0 else nullcontext():
        try:
            if cfg.objective == "bradley_terry":
                from mmjudge.train.bradley_terry import train_reward_head

                result = train_reward_head(base, annotations, train_file, image_root, out, loaded, cfg, deepspeed, resume, Path(eval_file) if eval_file else None)
            else:
                result = train(base, annotations, train_file, image_root, out, loaded, cfg, deepspeed, resume)
        finally:
            end_process_group()  # torchrun's ranks (initialised by the Trainer) must exit cleanly, failed or not
    return TrainResult(out, result["global_step"], result["best"], result["measure"], eval_file is not None)


def default_rubrics(train_file: Path) -> tuple[Path, ...]:
    """MMIE's rubrics, and for pairs the toolkit's pairwise one beside them (judge-score's defaults for pairs)."""
    from mmjudge.judge.data import holds_pairs
    from mmjudge.judge.formats import FORMATS

    return FORMATS["pairs"].default_rubrics if holds_pairs(train_file) else DEFAULT_RUBRICS


def calibrate(predictions: PathLike | list[dict] | Sequence[PathLike | list[dict]] | dict[str, PathLike | list[dict]],
              human: PathLike | list[dict], *, names: Sequence[str] | None = None, output_dir: PathLike | None = None,
              calibrator_of: str | None = None, **options) -> Report:
    """How far one or more judges agree with people, and the calibration maps (judge-calibrate). Imports no torch.

    predictions: one judge's predictions, as a file (judge-score's eval_result.json, a JSON list of {id,
        overall, ...}, an Inst-It or MEGA-Bench scored file) or as records (what `Judge.score` returns);
        several judges' as a list of those, or as {name: file or records}. (--predictions)
    human: the human scores: annotation records (several annotators per id allowed) or a flat
        [{id, overall, ...}] list, as a file or records. (--human)
    names: a name per judge (default: the dict's keys, the files' names, or judge, judge_2, ...). (--names)
    output_dir: where report.json, report.md, report.html, plots/ and calibrator.json go (default: nowhere,
        the report is only returned). (--output_dir)
    calibrator_of: the judge (by its name) whose map calibrator.json holds (default: the first). (--calibrator_of)
    **options: calibration.analysis.Options' fields, with judge-calibrate's defaults: criteria, group_by
        (--by), bootstrap, seed, fit, folds, scale ((low, high) or (low, high, step)), overall, coverage,
        target_agreement, agreement.

    Returns the Report (calibration/analysis.py) that report.json holds: `report.judges[name].criteria[c].all`
    has n, Pearson with its interval, MSE, QWK; `.calibration.calibrator` the fitted map.
    """
    from dataclasses import replace

    from mmjudge.calibration.analysis import Options, analyse
    from mmjudge.calibration.inputs import compared_criteria, coverage_notes, expected_as_overall, load_ratings, source_name
    from mmjudge.calibration.report import slug, write_reports
    from mmjudge.judge.outputs import locked, overwritten_inputs

    sources, names = _judges(predictions, names)
    opts, problems = _options(Options, options)
    human_name, _ = source_name(human, "human")
    if len(names) != len(sources):
        problems.append(f"--names has {len(names)} name(s) for {len(sources)} predictions file(s)")
    elif len(set(names)) != len(names):
        problems.append(f"judge names must differ, got {names}: give --names")
    elif len({slug(n) for n in names}) != len(names):  # their plots and calibrator files would overwrite each other
        problems.append(f"judge names {names} give the same file names {[slug(n) for n in names]}: give --names that differ in letters or digits")
    elif calibrator_of is not None and calibrator_of not in names:
        problems.append(f"--calibrator_of {calibrator_of}: no judge of that name; the judges are {', '.join(names)}")
    if problems:
        raise UsageError("; ".join(problems))
    out = Path(output_dir) if output_dir is not None else None
    files = [("--human", human), *[("--predictions", s) for s in sources]]
    if out and (problems := overwritten_inputs(out, ["report.json", "report.md", "report.html", "plots/*", "calibrator*.json"],
                                               [(flag, s) for flag, s in files if isinstance(s, (str, Path))])):
        raise UsageError("\n  ".join(problems))
    ratings = load_ratings(sources, names, human, opts.scale)
    if opts.overall == "expected_score":
        ratings = expected_as_overall(ratings)
    opts = replace(opts, criteria=compared_criteria(ratings, opts.criteria, human_name))
    report, paired = analyse(ratings, opts, human_name, coverage_notes(ratings, human_name))
    calibrators = {name: j.calibration.calibrator for name, j in report.judges.items() if j.calibration and j.calibration.calibrator}
    chosen = calibrator_of or next(iter(calibrators), None)
    report.calibrator_of = chosen if chosen in calibrators else None
    if out is None:
        return report
    written = {name: [*(["calibrator.json"] if name == report.calibrator_of else []), *([f"calibrator_{slug(name)}.json"] if len(report.judges) > 1 else [])]
               for name in calibrators}
    with locked(out, "judge-calibrate"):
        # An earlier run's map must not stay beside a report that fitted none (or another judge's): judge-score
        # --calibrator would apply it. No input is among them (overwritten_inputs refused that above).
        stale = sorted({f.name for f in out.glob("calibrator*.json")} - {f for names in written.values() for f in names})
        for name in stale:
            (out / name).unlink()
        report.removed_calibrators = stale
        write_reports(report, paired, out)
        for name, calibrator in calibrators.items():
            for file_name in written[name]:
                calibrator.save(out / file_name)
    return report


def _judges(predictions, names: Sequence[str] | None) -> tuple[list, list[str]]:
    """Each judge's predictions (a path or records) and its name."""
    if isinstance(predictions, dict):
        return list(predictions.values()), list(names or predictions)
    one = isinstance(predictions, (str, Path)) or (isinstance(predictions, list) and (not predictions or isinstance(predictions[0], dict)))
    sources = [predictions] if one else list(predictions)
    defaults = [Path(s).stem if isinstance(s, (str, Path)) else "judge" if k == 0 else f"judge_{k + 1}" for k, s in enumerate(sources)]
    return sources, list(names or defaults)


def _options(options_class, given: dict) -> tuple[Any, list[str]]:
    """calibration.analysis.Options from keyword arguments, and what cannot work in them."""
    from mmjudge.judge.parsing import ScoreScale

    known = [f.name for f in fields(options_class)]
    if unknown := sorted(set(given) - set(known)):
        raise UsageError(f"unknown calibration option(s) {', '.join(unknown)}; the options are {', '.join(known)}")
    problems = []
    if isinstance(given.get("scale"), (tuple, list)):
        try:
            given = {**given, "scale": ScoreScale(*given["scale"])}
        except (TypeError, ValueError) as err:
            problems.append(f"--scale LOW HIGH, --step STEP: {err}")
            given = {k: v for k, v in given.items() if k != "scale"}
    opts = options_class(**given)
    if opts.bootstrap < 0:
        problems.append(f"--bootstrap must be 0 or more, got {opts.bootstrap}")
    if opts.folds < 2:
        problems.append(f"--folds must be at least 2, got {opts.folds}")
    for name in ("coverage", "target_agreement"):
        if not 0 < getattr(opts, name) < 1:
            problems.append(f"--{name} must lie between 0 and 1 (exclusive), got {getattr(opts, name)}")
    return opts, problems


