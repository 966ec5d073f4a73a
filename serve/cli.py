"""judge-serve: the judge as an HTTP service, loaded once, batching concurrent requests.

    judge-serve --model_path CKPT [--image_root DIR] [--port 8000]
    JUDGE_KEY=... judge-serve --model_path CKPT --host 0.0.0.0 --api_key_env JUDGE_KEY
    judge-serve --model_path CKPT --replicas 2                   # Ray Serve's replicas behind one address (mmjudge/ray/serve.py)

POST /v1/score takes MMIE samples and answers with the records judge-score writes; POST
/v1/chat/completions is OpenAI's API for any OpenAI client (streamed or whole, with logprobs); GET /v1/models,
/health and /metrics (vLLM's metric names). It listens on 127.0.0.1 unless --host says otherwise, and any other address needs an
API key. Scoring options are MMIE's defaults, changed by --config (a YAML, or a bundled preset by name such as milebench)
and then by their flags.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys

from mmjudge.infer.loaded import DTYPES
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.cli import CommandParser, add_common_flags, add_revision_flag, add_settings_flags, config_given, config_values, run, setting_problems
from mmjudge.judge.data import UsageError
from mmjudge.serve.load import judged_by
from mmjudge.serve.options import ServeOptions

def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    p = CommandParser(prog="judge-serve", description=__doc__)
    p.add_argument("--model_path", required=True,
                   help="judge checkpoint, a local directory or a Hugging Face Hub id: InternVL2/2.5/3 (original or -hf), Qwen2.5-VL, Qwen3-VL, Qwen3.5, or a judge-train output")
    add_revision_flag(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on; any but a loopback address needs --api_key_env (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    p.add_argument("--api_key_env",
                   help="name of the environment variable holding the API key that clients send as 'Authorization: Bearer KEY'; "
                        "the key itself never goes on a command line, where every user of the machine sees it (default: none, no key asked)")
    p.add_argument("--image_root", path="dir",
                   help="directory that image paths in requests are read under, and only under (default: none; images come as base64 data URLs)")
    p.add_argument("--rubric", nargs="+", path="file_or_dir", bundled="rubrics",
                   help="rubric YAML files or directories (default: MMIE's, sa pbl msr, and the pairwise rubric for pairs of category general)")
    p.add_argument("--config", path="file", bundled="score",
                   help="YAML of the scoring options that differ from the defaults (MMIE's), overridden by the flags given (default: none)")
    add_settings_flags(p, ScoreOptions, config_values(ScoreOptions, config_given(argv, "score"), argparse.Namespace()))
    add_settings_flags(p, ServeOptions, config_values(ServeOptions, None, argparse.Namespace()))
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda:0 if a GPU is present, else cpu)")
    p.add_argument("--dtype", choices=DTYPES, help="model dtype (default: bfloat16 on GPU, float32 on CPU)")
    add_common_flags(p)
    return p


def main(argv=None) -> int:
    return run(_main, argv)


def _main(argv) -> int:
    args = build_parser(argv).parse_args(argv)
    options, limits, api_key = settings(args)
    judged_by(args, limits)  # refused before the model loads
    if limits.replicas is not None:  # Ray Serve's replicas of the same Service behind one address (mmjudge/ray/serve.py)
        try:
            from mmjudge.ray.serve import serve_replicas
        except ImportError as err:
            raise UsageError(f"--replicas runs judge-serve on Ray Serve, which is not installed ({err}): pip install 'mmjudge[ray]'") from None
        return serve_replicas(args, options, limits, api_key)
    import uvicorn

    from mmjudge.serve.app import build_app
    from mmjudge.serve.load import load_service

    service = load_service(args, options, limits, api_key)
    print(f"judge-serve: {args.model_path} on {service.worker.device}, http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn.Config(build_app(service), host=args.host, port=args.port, log_level="info")).run()
    return 0


def ray_application(flags: dict):
    """`serve run`'s application builder (a config's import_path: mmjudge.serve.cli:ray_application): `args` are
    judge-serve's flags by name, `{model_path: CKPT, reward: score:SA}`; a flag without a value true, a list its values.
    The number of replicas (num_replicas, or autoscaling_config) is the config's, of the deployment named Judge; the
    address its http_options' (docs/past-one-machine.md)."""
    from mmjudge.ray.serve import application

    argv = []
    for name, value in flags.items():
        if value is False or value is None:
            continue
        argv += [f"--{name}", *([] if value is True else map(str, value) if isinstance(value, list) else [str(value)])]
    args = build_parser(argv).parse_args(argv)
    options, limits, api_key = settings(args, listening=False)
    judged_by(args, limits)
    return application(args, options, limits, api_key, limits.replicas)


def settings(args, listening: bool = True) -> tuple[ScoreOptions, ServeOptions, str | None]:
    """The scoring options, the server's limits and the API key; every flag that cannot work in one error,
    before the model loads. `listening` False: --host and --port are not this process's to check (a `serve run`
    config's http_options give Ray Serve's address)."""
    values = config_values(ScoreOptions, args.config, args)
    limits = config_values(ServeOptions, None, args)
    problems = setting_problems(ScoreOptions, values) + setting_problems(ServeOptions, limits)
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not api_key:
        problems.append(f"--api_key_env {args.api_key_env}: that environment variable is not set or empty")
    elif api_key and not (api_key.isascii() and api_key.isprintable()):  # HTTP headers carry Latin-1: a client's UTF-8 key never matched
        problems.append(f"--api_key_env {args.api_key_env}: the key must be printable ASCII, as every client can send it in a header")
    if not loopback(args.host) and not args.api_key_env:
        problems.append(f"--host {args.host} lets other machines in: give an API key with --api_key_env, or listen on 127.0.0.1")
    if listening and not 0 < args.port < 65536:
        problems.append(f"--port must be 1-65535, got {args.port}")
    elif listening and (taken := port_taken(args.host, args.port)):
        problems.append(f"--host {args.host} --port {args.port}: cannot listen there ({taken}); give another --port")
    if problems:
        raise UsageError("judge-serve cannot start:\n  " + "\n  ".join(problems))
    return ScoreOptions(**values), ServeOptions(**limits), api_key


def port_taken(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port, found before the model loads (uvicorn would find it after);
    None where it can. SO_REUSEADDR as uvicorn binds, so a port left in TIME_WAIT is free."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as err:
        return err.strerror or str(err)
    return None


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


if __name__ == "__main__":
    sys.exit(main())
