"""One judge-score run, once its flags are read, whichever backend scores it: the process group, the input
and its rubrics, the resumable journal of results, and rank 0's merge into the result files.

A backend is where the judge runs: here (infer/local_backend.py) or behind an OpenAI-compatible server
(infer/openai_backend.py). Each is made before --output_dir is taken (it refuses what cannot work, loading
nothing), then `load()`s the judge and says what of it a journal's results depend on, then `score()`s this
rank's samples, yielding their results as they finish, gives the `warnings()` the summary shows, and is
`close()`d at the end."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist

from mmjudge.infer.engine import STRUCTURED_PAIRS, prepare, refuse_past_context
from mmjudge.infer.inputs import read_benchmark
from mmjudge.infer.journal import Journal, Result, clear, file_sha256, fingerprint, journal_pattern, read_finished, setting_fingerprints
from mmjudge.infer.local_backend import LocalBackend
from mmjudge.infer.openai_backend import OpenAIBackend
from mmjudge.infer.options import PAIR_OPTIONS, ScoreOptions
from mmjudge.infer.probe import ProbePass, format_reliance, image_reliance, plot_file, plot_reliance, probe_pass, read_paraphrases, result_file
from mmjudge.infer.progress import Bar
from mmjudge.infer.ray_backend import RayBackend
from mmjudge.infer.reward_model import is_reward_checkpoint, pairwise_refusal
from mmjudge.infer.summary import SUMMARY, format_pairs_summary, format_summary, summarize, summarize_pairs
from mmjudge.judge.calibrator import Calibrator, PairCalibrator, as_records, load_calibrator
from mmjudge.judge.data import InputError, JudgeResult, Pair, PairResult, Problem, Sample, Segment, UsageError, resolve_image, write_json_atomically
from mmjudge.judge.distributed import end_process_group
from mmjudge.judge.formats import BenchmarkInput, Format
from mmjudge.judge.identity import stamp
from mmjudge.judge.model import Judge, checkpoint_format, judge_tokenizer, unloaded_settings
from mmjudge.judge.parsing import ScoreScale
from mmjudge.judge.outputs import locked, overwritten_inputs
from mmjudge.judge.parquet import results_file, write_results
from mmjudge.judge.probes import probe_kinds
from mmjudge.judge.prompts import Rubric, judgeable, rubric_problems
from mmjudge.judge.rope import context_length



class Backend(Protocol):
    judge_fingerprint: str | None  # of the judge's weights, read before it loads (judge/identity.py); None: not visible
    deterministic: bool  # each record the same bits whatever is batched beside it (infer/decoding.py)

    def load(self) -> dict:
        """The judge made ready; what of it must be unchanged for a journal's results to be resumed."""

    def score(self, samples: list[tuple[int, Sample | Pair]], bar: Callable[[str], Bar]) -> Iterator[list[Result]]:
        """The results of these samples or pairs (each with its index among the run's), a batch at a time as they
        finish; `bar(what)` makes a progress bar over the whole run's inputs (every rank's) to count them on."""

    def warnings(self, results: list[Result]) -> list[str]:
        """What the summary must say of how these results were made (a server's that does not decode as a
        local run does)."""

    def close(self) -> None: ...


def score(args, fmt: Format, options: ScoreOptions, pair_flags: list[str] = ()) -> int:
    """`pair_flags`: the options of pairs given as flags, refused for single answers."""
    with distributed() as (rank, world), ExitStack() as held:
        run = scoring_input(args, fmt, pair_flags, rank)
        backend: Backend = (RayBackend(args, options, run.rubrics, fmt) if args.ray
                            else LocalBackend(args, options, run.rubrics, rank) if args.backend == "local"
                            else OpenAIBackend(args, options, run.rubrics, run.samples))
        held.callback(backend.close)
        if args.backend == "local":
            refuse_past_context_unloaded(backend.model_dir, run, options, Path(args.input_dir), Path(args.input_file))
        run.judge_fingerprint = backend.judge_fingerprint
        if run.calibrator is not None:
            run.warnings += checked_calibrator(run, args.calibrator, args.model_path, args.allow_calibrator_mismatch, rank)
        output_dir = Path(args.output_dir)
        on_rank_zero(lambda: held.enter_context(locked(output_dir, "judge-score")), rank, world, "take --output_dir")  # held until the run ends

        settings = {**backend.load(), **input_fingerprint(args, options, run.rubrics, run.bench.samples)}
        run_id = fingerprint(settings)
        score_pass(args, backend, run, run.samples, args.output_file, run_id, rank, world, setting_fingerprints(settings))
        probes = []
        if kinds := probe_kinds(args):
            # The perturbed images live in a directory of this run's own, never among the user's inputs.
            blank_dir = Path(held.enter_context(tempfile.TemporaryDirectory(prefix="judge-score-probe-")))
            for kind in kinds:
                probes.append(probe := probe_pass(kind, args.probe_seed, run.samples, Path(args.input_dir), blank_dir, run_id, run.paraphrases))
                score_pass(args, backend, run, probe.samples, result_file(probe.kind), probe.run_id, rank, world)

        modes = {"structured": options.structured, "deterministic": backend.deterministic}
        on_rank_zero(lambda: merge(args, fmt, run, run_id, backend.warnings, probes, modes), rank, world)
        return 0


def score_pass(args, backend: Backend, run: ScoringInput, samples: list[Sample | Pair], output_file: str, run_id: str, rank: int, world: int,
               settings: dict[str, str] | None = None) -> None:
    """Score this rank's share of the samples (or pairs) that the journals of `output_file` do not hold yet, each result
    stamped with the judge and rubric that scored it. `settings`: each setting's fingerprint, for the journals."""
    finished = finished_results(args, output_file, run_id, rank, world, record_type(samples), settings, run.rubrics)
    left = [(i, s) for i, s in enumerate(samples) if s.id not in finished]
    mine = [(i, s) for i, s in left if i % world == rank]
    journal = Journal(Path(args.output_dir), output_file, rank, run_id, settings)
    try:
        for results in backend.score(mine, lambda what: Bar(what, len(left), rank, world, key=run_id)):
            journal.append(stamp(results, run.judge_fingerprint, run.rubrics))
    finally:
        journal.close()
    barrier(world)


def refuse_past_context_unloaded(model_dir: Path, run: ScoringInput, options: ScoreOptions, image_root: Path, input_path: Path) -> None:
    """Every prompt of the run counted before the judge's weights load, as the engine builds it (text tokens and
    each image's tokens): one that leaves its answer no room in the judge's context is refused by its record
    (engine.refuse_past_context, which every door applies), found before the weights load rather than after.
    --prompt_token_budget cuts the question's oldest context instead, recorded as truncated."""
    tokenizer = judge_tokenizer(model_dir)
    settings, config = unloaded_settings(model_dir, tokenizer)
    context = context_length(config.get_text_config())
    unloaded = Judge(None, tokenizer, settings, checkpoint_format(model_dir))  # prepare reads its tokenizer and settings only
    refuse_past_context(prepare(unloaded, enumerate(run.samples), run.rubrics, image_root, options), context, str(input_path))


@dataclass
class ScoringInput:
    """What a run scores, whichever backend scores it: the input, its rubrics, the samples or the pairs
    (after --skip_invalid and --limit), what was skipped, and the calibrator."""

    bench: BenchmarkInput
    samples: list[Sample | Pair]
    skipped: list[Problem]
    calibrator: Calibrator | PairCalibrator | None
    paraphrases: dict[str, list[Segment]] | None = None  # --paraphrases: each sample's answer reworded, by id
    judge_fingerprint: str | None = None  # the backend's (judge/identity.py), stamped on every record
    warnings: list[str] = field(default_factory=list)  # for the summary: a calibrator applied unchecked or against a mismatch

    @property
    def pairs(self) -> bool:
        return record_type(self.bench.samples) is PairResult

    @property
    def rubrics(self) -> dict[str, Rubric]:
        return self.bench.rubrics

    @property
    def score_scale(self) -> ScoreScale:  # the summary's: the first rubric's
        return next(iter(self.rubrics.values())).score_scale


def scoring_input(args, fmt: Format, pair_flags: list[str] = (), rank: int = 0) -> ScoringInput:
    """The input read and checked, all before any model or server is used; its notes said by rank 0."""
    input_path = Path(args.input_file)  # read in --input_dir (judge.cli resolved it)
    bench = read_input(fmt, input_path, args, rank == 0)
    skipped = bench.problems + rubric_problems(bench.samples, bench.rubrics, input_path)
    if skipped and not args.skip_invalid:
        raise InputError(skipped, "--skip_invalid judges the other records and lists these in summary.json")
    scorable = [s for s in bench.samples if judgeable(s, bench.rubrics)]
    samples = scorable[: args.limit] if args.limit else scorable
    categories = sorted({s.category for s in samples})
    if record_type(bench.samples) is PairResult and (refused := pair_refusals(args, [bench.rubrics[c] for c in categories])):
        raise UsageError("; ".join(refused))
    if record_type(bench.samples) is not PairResult and pair_flags:
        raise UsageError(f"{', '.join(pair_flags)} apply to pairs of answers; {input_path} holds single answers ({fmt.name})")
    pairs = record_type(bench.samples) is PairResult
    calibrator = load_calibrator(args.calibrator, [bench.rubrics[c] for c in categories], pairs) if args.calibrator else None
    paraphrases = read_paraphrases(Path(args.paraphrases), samples) if getattr(args, "paraphrases", None) else None
    return ScoringInput(bench, samples, skipped, calibrator, paraphrases)


def record_type(samples: list[Sample | Pair]) -> type[Result]:
    """What a run writes for its input: a JudgeResult per sample, or a PairResult per pair."""
    return PairResult if samples and isinstance(samples[0], Pair) else JudgeResult


def pair_refusals(args, rubrics: list[Rubric]) -> list[str]:
    """The flags that do not apply to pairs: the probe moves scores, the openai
    backend reads no verdict distribution, and --structured holds to score lines, not verdicts."""
    refused = [f"--{flag} applies to samples, not pairs" for flag in ("probe_images", "probe") if getattr(args, flag, None)]
    if args.structured and any(rubric.kind == "pairwise" for rubric in rubrics):
        refused.append(STRUCTURED_PAIRS)
    if args.backend != "local":
        refused.append("pairs are judged by --backend local (or by judge-serve's /v1/score); --backend openai scores samples only")
    elif is_reward_checkpoint(Path(args.model_path)):  # a local one, before its weights load (a Hub id's: when its pairs are scored)
        refused += pairwise_refusal({rubric.category for rubric in rubrics if rubric.kind == "pairwise"})
    return refused


def finished_results(args, output_file: str, run_id: str, rank: int, world: int, record: type[Result] = JudgeResult,
                     settings: dict[str, str] | None = None, rubrics: dict[str, Rubric] | None = None) -> dict[str, Result]:
    """The results an earlier run of the same settings left in the journals of `output_file` (none after
    --no_resume); with `rubrics`, a score off its rubric's scale is none."""
    output_dir = Path(args.output_dir)
    if args.no_resume and rank == 0:
        clear(output_dir, output_file)
    barrier(world)
    finished = read_finished(output_dir, output_file, run_id, record, settings, rubrics)
    barrier(world)  # every rank has read the journals before any opens its own: a journal just created has no header yet
    if rank == 0 and finished:
        print(f"resuming: {len(finished)} sample(s) already scored for {output_file} in {output_dir}", file=sys.stderr)
    return finished


def merge(args, fmt: Format, run: ScoringInput, run_id: str, warnings: Callable[[list[JudgeResult]], list[str]], probes: list[ProbePass],
          modes: dict[str, bool]) -> None:
    """The journals merged into the result file and summary, and the benchmark's own files written."""
    output_dir = Path(args.output_dir)
    finish(output_dir, args.output_file, run, run_id, warnings, probes, fmt.name, lambda results: fmt.write(run.bench, {r.id: r for r in results}, output_dir),
           modes, args.probe_images, args.parquet)


def read_input(fmt: Format, input_path: Path, args, notes: bool = True) -> BenchmarkInput:
    """The input in the toolkit's terms, its rubrics loaded, as the Python API reads it; refuses what cannot
    work before a model loads, and any input that the run's outputs would overwrite."""
    if not args.rubric and not fmt.default_rubrics:
        raise UsageError(f"--format {fmt.name} judges with {fmt.name}'s own prompt, which this toolkit does not ship: import it from the "
                         f"benchmark's repository, `judge-rubric import --benchmark {fmt.name} {fmt.prompt_source} -o {fmt.name}.yaml`, "
                         f"and give --rubric {fmt.name}.yaml")
    written = [args.output_file, *([results_file(args.output_file)] if args.parquet else []), SUMMARY, *fmt.outputs, journal_pattern(args.output_file)]
    for kind in probe_kinds(args):
        if args.output_file == result_file(kind):
            flag = "--probe_images" if kind == args.probe_images else "--probe"
            raise UsageError(f"--output_file {args.output_file}: {flag} {kind} writes its own results there; choose another name")
        written += [result_file(kind), journal_pattern(result_file(kind)), plot_file(kind)]
    inputs = [("--input_file", input_path), ("--criteria_file", args.criteria_file), ("--calibrator", args.calibrator), ("--config", args.config),
              ("--paraphrases", getattr(args, "paraphrases", None)),
              ("--model_path", args.model_path), *[("--rubric", path) for path in args.rubric or fmt.default_rubrics]]
    if problems := overwritten_inputs(Path(args.output_dir), written, inputs):  # before reading them: a rubric there may not parse
        raise UsageError("\n  ".join(problems))
    bench = read_benchmark(fmt, input_path, Path(args.input_dir), args.rubric, args.criteria_file, notes)
    images = sorted({resolve_image(image, args.input_dir) for sample in bench.samples for image in sample.images()})
    if problems := overwritten_inputs(Path(args.output_dir), written, [*bench.sources, *[("--input_file's image", image) for image in images]]):
        raise UsageError("\n  ".join(problems))
    return bench


def checked_calibrator(run: ScoringInput, path: str, model_path: str, allow_mismatch: bool, rank: int) -> list[str]:
    """The calibrator refused where it was fitted on another judge or rubric than this run's scores use, unless
    --allow_calibrator_mismatch (Calibrator.check_fit); the warnings, said once, for the summary."""
    categories = {s.category for s in run.samples}
    warnings = run.calibrator.check_fit(path, f"--model_path {model_path}", run.judge_fingerprint,
                                        {c: r for c, r in run.rubrics.items() if c in categories}, allow_mismatch)
    if rank == 0:
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
    return warnings


def journaled(output_dir: Path, output_file: str, samples: list[Sample | Pair], run_id: str, rubrics: dict[str, Rubric]) -> list[Result]:
    """Every rank's journal of `output_file` read back: a result per sample (or pair), in the input's order."""
    finished = read_finished(output_dir, output_file, run_id, record_type(samples), rubrics=rubrics)
    missing = [s.id for s in samples if s.id not in finished]
    if missing:
        raise RuntimeError(f"{len(missing)} sample(s) have no result in {output_file} (first: {missing[:3]}); rerun to finish them")
    return [finished[s.id] for s in samples]


def finish(output_dir: Path, output_file: str, run: ScoringInput, run_id: str, warnings: Callable[[list[JudgeResult]], list[str]],
           probes: list[ProbePass], format_name: str, write_benchmark_files: Callable[[list[JudgeResult]], list[Path]],
           modes: dict[str, bool], image_probe: str | None = None, parquet: bool = False) -> None:
    """Merge every rank's journal into the result file (and, with `parquet`, the same records into a Parquet file
    beside it, judge/parquet.py), in input order, write the benchmark's own files, and
    write the summary (naming those files, with each probe's figures, from its own journals: `probes`, and for
    --probe_images's probe, `image_reliance` as well).
    `modes`: how the records were made, as the summary says: structured (a grammar held the judge to its
    rubric's layout, --structured; exactness runs have it off) and deterministic (--deterministic)."""
    calibrator = run.calibrator
    results = journaled(output_dir, output_file, run.samples, run_id, run.rubrics)
    pairs = record_type(run.samples) is PairResult
    write_json_atomically(output_dir / output_file, records := as_records(results, calibrator))
    if parquet:
        write_results(output_dir / results_file(output_file), records)
    benchmark_files = write_benchmark_files(results)
    written = {**modes, "warnings": [*run.warnings, *warnings(results)], "benchmark_files": [path.name for path in benchmark_files]}
    if pairs:
        summary = {**summarize_pairs(results, run.samples, run.skipped, records if calibrator is not None else None), **written}
        write_json_atomically(output_dir / SUMMARY, summary)
        print(format_pairs_summary(summary))
    else:
        scale = run.score_scale
        summary = {**summarize(results, run.skipped, scale, calibrator), **written}
        if probes:
            summary["probes"] = {probe.kind: finish_probe(output_dir, probe, results, scale, run.rubrics) for probe in probes}
        if image_probe is not None:
            summary["image_reliance"] = summary["probes"][image_probe]
        write_json_atomically(output_dir / SUMMARY, summary)
        print(format_summary(summary))
        for entry in summary.get("probes", {}).values():
            print(format_reliance(entry))
    print(f"results: {output_dir / output_file}" + (f" and {output_dir / results_file(output_file)}" if parquet else "") + f"\nsummary: {output_dir / SUMMARY}")
    for path in benchmark_files:
        print(f"{format_name}: {path}")


def finish_probe(output_dir: Path, probe: ProbePass, results: list[JudgeResult], scale: ScoreScale, rubrics: dict[str, Rubric]) -> dict:
    """The probe's result file and plot written; the summary's image_reliance entry."""
    probed = journaled(output_dir, result_file(probe.kind), probe.samples, probe.run_id, rubrics)
    write_json_atomically(output_dir / result_file(probe.kind), as_records(probed, None))
    entry = image_reliance(probe.kind, probe.seed, results, {r.id: r for r in probed}, probe.notes, scale)
    if entry["criteria"]:
        plot_reliance(entry, output_dir / plot_file(probe.kind))
    return entry


@contextmanager
def distributed() -> Iterator[tuple[int, int]]:
    """(rank, world) for the run, its process group torn down at the end whatever happens."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            # NCCL's own tensors (barrier, broadcast) go to the current device: this rank's, not all to GPU 0.
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        yield int(os.environ.get("RANK", "0")), world
    finally:
        end_process_group()


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def on_rank_zero(work: Callable[[], None], rank: int, world: int, what: str = "merge the results") -> None:
    """Run `work` on rank 0 while the other ranks wait, and have every rank fail when it fails: a rank
    left waiting for a rank 0 that died would hang (on other nodes, until the collective times out)."""
    error = None
    if rank == 0:
        try:
            work()
        except BaseException as err:  # Ctrl-C too: the others must not wait for it
            error = err
    failed = [error is not None]
    if world > 1:
        dist.broadcast_object_list(failed, src=0)
    if error is not None:
        raise error
    if failed[0]:
        raise RuntimeError(f"rank 0 failed to {what} (its error says why); the journals are kept: rerun to finish")


def input_fingerprint(args, options: ScoreOptions, rubrics, samples: list[Sample]) -> dict:
    """The parts of a run's fingerprint that do not depend on where the judge runs: input, rubrics, mode."""
    input_path = Path(args.input_file)  # read in --input_dir (judge.cli resolved it)
    # The content, not only the path: results of an input edited since must not be resumed as its results.
    contents = {"input_sha256": file_sha256(input_path), "criteria_sha256": file_sha256(Path(args.criteria_file)) if args.criteria_file else None}
    # An image replaced under the same name is caught by its size and time, as the weights are: hashing
    # every image of a 20,000-sample benchmark would read gigabytes before the first batch.
    # Each image by its resolved path: the same folder named relatively once and absolutely the next time is the same input.
    images = sorted({resolve_image(image, args.input_dir).resolve() for sample in samples for image in sample.images()})
    contents["images"] = fingerprint([(str(path), path.stat().st_size, path.stat().st_mtime_ns) for path in images])
    pairs = {"pairs": {name: getattr(options, name) for name in PAIR_OPTIONS}} if (
        record_type(samples) is PairResult) else {}
    return {"rubrics": {k: r.model_dump() for k, r in rubrics.items()}, "mode": options.mode, "max_new_tokens": options.max_new_tokens,
            "image_token_budget": options.image_token_budget, "input": str(input_path.resolve()), **contents, **pairs}
