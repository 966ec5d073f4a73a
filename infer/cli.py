"""judge-score: score interleaved answers with a judge on any supported backbone (InternVL2/2.5/3, Qwen2.5-VL, Qwen3-VL, Qwen3.5).

    judge-score --model_path CKPT --input_dir DATA --input_file data.json [--output_dir eval_outputs]

Reads MMIE samples, or another benchmark's files (--format milebench|instit|megabench), or pairs of answers
(--format pairs, and the judge benchmarks vlrewardbench|mmrewardbench|mmrb2|opening), the format detected
when unambiguous, and writes eval_result.json and summary.json, plus the benchmark's own result files.
Scoring options are MMIE's defaults, changed by the format's preset (configs/score/<format>.yaml) or by
--config, and then by the flag of each option's name; --help shows the values that apply (give --format or
--config with it to see theirs).
Under `torchrun --nproc_per_node N` the same command shards the samples by rank; rank 0 merges.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from dataclasses import fields
from pathlib import Path

from mmjudge.infer.loaded import DTYPES
from mmjudge.infer.options import PAIR_OPTIONS, ScoreOptions, options_for, preset
from mmjudge.judge.cli import CommandParser, add_common_flags, add_revision_flag, add_settings_flags, config_given, config_values, flag_given, run
from mmjudge.judge.data import UsageError
from mmjudge.judge.parquet import results_file
from mmjudge.infer.summary import SUMMARY
from mmjudge.judge.formats import FORMATS, Format, detect_format
from mmjudge.judge.probes import PROBES, SEEDED, probe_kinds
from mmjudge.judge.outputs import LOCK_FILE

BACKENDS = ("local", "openai")
# --backend openai: one sample's request in all, every try and every wait between tries. Each try is cut after
# 600 s (openai_backend.ANSWER_TIMEOUT_S), and with the 6 tries of --max_retries 5 a server trickling its
# answers held a run for about an hour on one sample.
REQUEST_TIMEOUT_S = 900.0
IMAGE_PROBES = ("blank", "shuffle")  # --probe_images: the first two of the bias suite's probes (judge/probes.py)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    p = CommandParser(prog="judge-score", description=__doc__)
    p.add_argument("--model_path", required=True,
                   help="judge checkpoint, a local directory or a Hugging Face Hub id: InternVL2/2.5/3 (original or -hf), Qwen2.5-VL, Qwen3-VL, Qwen3.5, or a judge-train output; "
                        "with --backend openai, the model's name on the server")
    add_revision_flag(p)
    p.add_argument("--input_dir", required=True, path="dir", help="directory that image paths in the input are relative to")
    p.add_argument("--input_file", "--input_name", required=True, path="file", under="input_dir",
                   help="JSON list or JSONL of samples, read in --input_dir as MMIE-Eval reads it (--input_dir D --input_file F is D/F; "
                        "an absolute path is read as it is)")
    p.add_argument("--output_dir", default="eval_outputs", path="output_dir", help="where results, summary and journal go (default: %(default)s)")
    p.add_argument("--output_file", "--output_name", default="eval_result.json", help="result file name, in --output_dir (default: %(default)s)")
    p.add_argument("--parquet", action="store_true",
                   help="also write the records as Parquet beside the result file, a column per field: eval_result.parquet for "
                        "eval_result.json (default: JSON only)")
    p.add_argument("--format", choices=list(FORMATS), help="the input's benchmark format (default: detected from the file)")
    p.add_argument("--criteria_file", path="file", help="MEGA-Bench only: the tasks' rows of MEGA-Bench's dataset, JSON Lines or a JSON list, for each "
                                                        "task's metric_info and each query's eval_context (default: none; --format megabench needs one)")
    p.add_argument("--rubric", nargs="+", path="file_or_dir", bundled="rubrics",
                   help="rubric YAML files or directories (default: the format's, sa pbl msr for MMIE)")
    p.add_argument("--config", path="file", bundled="score", help="YAML of the scoring options that differ from the defaults, overridden by the flags given "
                                                                  "(default: the format's preset, where there is one)")
    add_option_flags(p, config_given(argv, "score"), flag_given(argv, "format"))
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda:LOCAL_RANK if a GPU is present, else cpu)")
    p.add_argument("--dtype", choices=DTYPES, help="model dtype (default: bfloat16 on GPU, float32 on CPU)")
    p.add_argument("--limit", type=int, help="score only the first N (at least 1) valid samples (default: all)")
    p.add_argument("--skip_invalid", action="store_true", help="skip invalid records and list them in the summary instead of stopping (default: stop)")
    p.add_argument("--no_resume", action="store_true", help="ignore and delete the journal of an earlier run (default: resume it)")
    p.add_argument("--calibrator", path="file",
                   help="calibrator.json from judge-calibrate; adds calibrated_score to each record, and its score_set and escalate where the "
                        "calibrator has them; refused when fitted on another judge or rubric than this run's (default: none, no calibration)")
    p.add_argument("--allow_calibrator_mismatch", action="store_true",
                   help="apply --calibrator even when it was fitted on another judge's scores or another rubric, with a warning (default: refuse)")
    p.add_argument("--probe_images", choices=IMAGE_PROBES,
                   help="score each sample whose answer has images a second time with them replaced - blank: mid-grey images of the same size; "
                        "shuffle: other samples' answer images of the same category - and report per criterion how the scores moved "
                        "(default: none, one pass)")
    p.add_argument("--probe", nargs="+", choices=list(PROBES), metavar="KIND",
                   help="the bias suite: score perturbed copies of the samples, one pass per probe, each into probe_<KIND>.json - "
                        + "; ".join(f"{kind}: {probe.changes}" for kind, probe in PROBES.items())
                        + "; judge-calibrate --probes reports each one's effect and gate (default: none)")
    p.add_argument("--paraphrases", path="file",
                   help="for --probe paraphrase: a JSON list of {id, answer}, each sample's answer reworded (a string, or segments as the "
                        "input's answers) (default: none)")
    p.add_argument("--probe_seed", type=int, default=0, help="seed of the shuffle probe's draw and the noise probe's noise (default: %(default)s)")
    add_backend_flags(p)
    add_ray_flags(p)
    add_common_flags(p)
    return p


def add_backend_flags(parser: argparse.ArgumentParser) -> None:
    remote = parser.add_argument_group("the judge on an OpenAI-compatible server (README: judge-serve, vllm serve, GPT-4o)")
    remote.add_argument("--backend", choices=BACKENDS, default="local",
                        help="local: load --model_path here; openai: send each sample to the chat-completions API at --base_url, "
                             "--model_path then naming the model there (default: %(default)s)")
    remote.add_argument("--base_url", help="the API's root, e.g. http://127.0.0.1:8000/v1 (default: none; --backend openai needs one)")
    remote.add_argument("--api_key_env",
                        help="name of the environment variable holding the API key, sent as a Bearer token; "
                             "the key itself never goes on a command line, where every user sees it (default: none, no key sent)")
    remote.add_argument("--concurrency", type=int, default=8, help="requests in flight at once (default: %(default)s)")
    remote.add_argument("--max_retries", type=int, default=5,
                        help="tries after the first of a request answered 429 or 5xx or not at all, with exponential backoff (default: %(default)s)")
    remote.add_argument("--request_timeout", type=float, default=REQUEST_TIMEOUT_S,
                        help="seconds one sample's request may take in all, every try and every wait between tries "
                             "(each try is cut after 600 s at most) (default: %(default)g)")


def add_ray_flags(parser: argparse.ArgumentParser) -> None:
    cluster = parser.add_argument_group("the judge on a Ray cluster (docs/past-one-machine.md; pip install 'mmjudge[ray]')")
    cluster.add_argument("--ray", metavar="ADDRESS",
                         help="judge the samples as a Ray Data job, each actor a copy of the judge; this process reads the input and writes "
                              "the same results and summary - local: start a Ray cluster on this machine; auto: join the one `ray start` "
                              "started; or HOST:PORT, ray://HOST:PORT (default: none, judge in this process)")
    cluster.add_argument("--ray_actors", help="copies of the judge: N, or MIN:MAX for Ray Data to scale between (default: 1)")
    cluster.add_argument("--ray_gpus", type=float, help="GPUs each actor takes (default: 1 where the cluster has GPUs, else 0)")
    cluster.add_argument("--ray_cpus", type=float, help="CPUs each actor takes (default: 1)")
    cluster.add_argument("--ray_batch_size", type=int,
                         help="samples an actor takes at a time, the unit Ray runs again when an actor dies (default: 16)")


RAY_DEFAULTS = {"ray_actors": "1", "ray_cpus": 1.0, "ray_batch_size": 16}


def ray_problems(args) -> list[str]:
    """What cannot work in the --ray flags, found before anything loads or starts; their defaults filled in."""
    flags = ("ray_actors", "ray_gpus", "ray_cpus", "ray_batch_size")
    if args.ray is None:
        return [f"--{name} applies to --ray only" for name in flags if getattr(args, name) is not None]
    for name, value in RAY_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    problems = []
    if importlib.util.find_spec("ray") is None:
        problems.append("--ray needs Ray, which is not installed: pip install 'mmjudge[ray]'")
    if args.backend != "local":
        problems.append("--ray runs the judge in Ray actors, --backend openai on a server: give one of them")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        problems.append("--ray spreads the samples over Ray actors: run judge-score --ray once, not under torchrun")
    if args.probe_images:
        problems.append("--probe_images writes its blank and shuffled images on this machine, which the actors may not see: run it without --ray")
    if not args.ray.strip():
        problems.append("--ray needs an address: local, auto, HOST:PORT or ray://HOST:PORT")
    if not re.fullmatch(r"[1-9][0-9]*(:[1-9][0-9]*)?", args.ray_actors) or (
            ":" in args.ray_actors and int(args.ray_actors.split(":")[0]) > int(args.ray_actors.split(":")[1])):
        problems.append(f"--ray_actors {args.ray_actors}: give N, or MIN:MAX with 1 <= MIN <= MAX")
    if args.ray_gpus is not None and not args.ray_gpus >= 0:
        problems.append(f"--ray_gpus must be at least 0, got {args.ray_gpus:g}")
    if not args.ray_cpus > 0:
        problems.append(f"--ray_cpus must be above 0, got {args.ray_cpus:g}")
    if args.ray_batch_size < 1:
        problems.append(f"--ray_batch_size must be at least 1, got {args.ray_batch_size}")
    return problems


def backend_problems(args, options: ScoreOptions) -> list[str]:
    """What cannot work in the chosen backend's flags, found before anything loads or connects."""
    if args.backend == "local":
        given = [f"--{name}" for name in ("base_url", "api_key_env") if getattr(args, name) is not None]
        return [f"{flag} applies to --backend openai only" for flag in given]
    problems = []
    if args.base_url is None or not args.base_url.startswith(("http://", "https://")):
        problems.append(f"--backend openai needs --base_url http(s)://HOST:PORT/v1, got {args.base_url!r}")
    elif problem := url_problem(args.base_url):
        problems.append(f"--base_url {args.base_url!r}: {problem}")
    problems += [f"--{name} applies to the local backend only: the server chooses its own"
                 for name in ("device", "dtype", "revision") if getattr(args, name) is not None]
    if args.concurrency < 1:
        problems.append(f"--concurrency must be at least 1, got {args.concurrency}")
    if args.max_retries < 0:
        problems.append(f"--max_retries must be at least 0, got {args.max_retries}")
    if not args.request_timeout > 0:  # NaN too
        problems.append(f"--request_timeout must be a number of seconds above 0, got {args.request_timeout:g}")
    if args.api_key_env is not None and not os.environ.get(args.api_key_env):
        problems.append(f"--api_key_env {args.api_key_env}: that environment variable is not set or empty")
    if options.deterministic:
        problems.append("--deterministic applies to the local backend: how the server batches is its own")
    if options.mode == "logits":
        problems.append("--mode logits reads the score after a forced '### Score' heading, which a chat API cannot add; use --mode generate")
    if options.prompt_token_budget is not None:
        problems.append(f"prompt_token_budget {options.prompt_token_budget} counts the judge's tokens, and its tokenizer is on the server; "
                        "give a --config with prompt_token_budget: null")
    return problems


def url_problem(url: str) -> str | None:
    """Why the HTTP client cannot send to `url`, or None."""
    import httpx2  # light, but only --backend openai needs it

    try:
        parsed = httpx2.URL(url)
    except httpx2.InvalidURL as err:
        return f"not a URL ({err})"
    if not parsed.host:
        return "names no host"
    if parsed.port is not None and not 0 < parsed.port < 65536:
        return f"port {parsed.port} is not a TCP port (1-65535)"
    return None


def add_option_flags(parser: argparse.ArgumentParser, config: Path | None, format_name: str | None) -> None:
    """A flag for each ScoreOptions field that has one, showing the value that applies: --config's, or
    --format's preset's, or each format's where they differ."""
    if config or format_name in FORMATS:
        add_settings_flags(parser, ScoreOptions, config_values(ScoreOptions, config or preset(format_name), argparse.Namespace()))
        return
    presets = {name: config_values(ScoreOptions, preset(name), argparse.Namespace()) for name in FORMATS}
    add_settings_flags(parser, ScoreOptions, {f.name: preset_defaults(f.name, presets) for f in fields(ScoreOptions)})


def preset_defaults(name: str, presets: dict[str, dict]) -> str:
    """'4', or each format's value where the presets differ: '1024 for mmie, pairs; 512 for milebench, instit'
    (spaced, so that --help wraps a long list of formats between names, not inside one)."""
    formats_by_value: dict[str, list[str]] = {}
    for format_name, values in presets.items():
        value = values[name]
        formats_by_value.setdefault("none" if value is None else str(value), []).append(format_name)
    if len(formats_by_value) == 1:
        return next(iter(formats_by_value))
    return "; ".join(f"{value} for {', '.join(names)}" for value, names in formats_by_value.items())


def score_options(args, fmt: Format) -> ScoreOptions:
    """The format's preset (or --config) overridden by the flags given; every value that cannot work, the
    CLI-only --limit's too, in one error."""
    limit = [f"--limit must be at least 1, got {args.limit}"] if args.limit is not None and args.limit < 1 else []
    return options_for(fmt.name, args.config, vars(args), limit)


def main(argv=None) -> int:
    return run(_main, argv)


def check_output_paths(args, fmt: Format) -> None:
    name = args.output_file
    if name in ("", ".", "..") or Path(name).name != name:
        raise UsageError(f"--output_file {name!r}: a file name, not a path; the directory is --output_dir")
    # The results would overwrite the run's lock (the next run then truncates them) or another file it writes.
    if name in (LOCK_FILE, SUMMARY, *fmt.outputs):
        raise UsageError(f"--output_file {name}: judge-score writes its own {name} in --output_dir; give another name")
    if args.parquet and results_file(name) == name:
        raise UsageError(f"--output_file {name} --parquet: the Parquet file is written beside the JSON result file, as {name}; "
                         "give --output_file a name ending in .json")


def _main(argv) -> int:
    args = build_parser(argv).parse_args(argv)
    fmt = FORMATS[args.format] if args.format else detect_format(Path(args.input_file))
    options = score_options(args, fmt)
    if problems := ray_problems(args) + backend_problems(args, options):
        raise UsageError("\n  ".join(["the backend's flags cannot work:", *problems]))
    check_output_paths(args, fmt)
    kinds = probe_kinds(args)
    if flag_given(argv, "probe_seed") is not None and not set(kinds) & set(SEEDED):
        raise UsageError(f"--probe_seed applies to the {' and '.join(SEEDED)} probes only: the others draw nothing")
    if ("paraphrase" in kinds) != (args.paraphrases is not None):
        raise UsageError("--probe paraphrase reads its rewordings from --paraphrases FILE: give both or neither")
    from mmjudge.infer.run import score  # torch and transformers load here: --help and --version need neither

    return score(args, fmt, options, [f"--{name}" for name in PAIR_OPTIONS if flag_given(argv, name) is not None])


if __name__ == "__main__":
    sys.exit(main())
