"""The Python API: the toolkit's engine from Python, the same one the command lines run.

    import mmjudge

    judge = mmjudge.Judge.load("OpenGVLab/InternVL2-4B")     # once: a Hub id, a local folder, a judge-train output
    records = judge.score("mmie/data.json")                   # a file, MMIE-shaped dicts or Samples; batched
    record = judge.score_one("What is shown?", "A cat on a mat.", images=["cat.png"], category="SA")
    report = mmjudge.calibrate(records, "annotations.json")   # agreement with people: a calibration Report
    trained = mmjudge.fine_tune("OpenGVLab/InternVL2-4B", "train.json", "my-judge", config="tiny")

A door over the commands' engines, which never import it: `Judge` is infer/loaded.py's LoadedJudge (the
judge judge-score's local backend and judge-serve load, scoring through the same `score_batches`) with
judge-score's reading of inputs in front, so `Judge.score` returns the records judge-score writes to
eval_result.json; `calibrate` is calibration/run.py's, which judge-calibrate runs, and `fine_tune`
train/run.py's, which judge-train runs.
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

import tempfile
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmjudge.calibration.run import calibrate
from mmjudge.configs import DEFAULT_RUBRICS, by_name, rubric_paths
from mmjudge.infer.inputs import read_benchmark
from mmjudge.infer.loaded import LoadedJudge
from mmjudge.judge.cpu import use_free_cores
from mmjudge.judge.data import InputError, Sample, UsageError, validate_samples
from mmjudge.train.run import TrainResult, fine_tune

if TYPE_CHECKING:
    import torch
    from PIL import Image

    from mmjudge.judge.calibrator import Calibrator
    from mmjudge.judge.formats import BenchmarkInput, Format
    from mmjudge.judge.model import Judge as Model

PathLike = str | Path
IN_MEMORY = "samples"  # how a problem of samples given in memory names them


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
        loaded = LoadedJudge.load(model_path, device, dtype, revision, checked.deterministic)
        return cls(loaded.path, loaded.model, loaded.device, loaded.fingerprint, rubric_paths(rubrics),
                   by_name("score", config) if config else None, options)

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



