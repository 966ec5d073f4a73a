#!/usr/bin/env bash
# What `pip install mmjudge` gets, tested (`make test-installed`; CI runs it after `make test`):
#   1. the sdist, and the wheel built from it (as `python -m build` does, each in its own isolated env);
#   2. the wheel installed, not editable, into a fresh venv with the newest dependencies its ranges allow
#      (torch first: its CPU build, as the Makefile installs it);
#   3. from a folder of the user's (outside the checkout, holding its own train.py and serve/): one import
#      name, and the README's commands on a tiny random judge: score, train, score with the trained adapter,
#      calibrate, the Python API, serve;
#   4. the test, deepspeed, rl and ray extras added, the quick test loop from the sdist's tests against the installed
#      package. The sdist's copy of the package folders is removed first: no test can import the checkout.
# Usage: .ci/installed.sh [WORK_DIR]   (default: a new folder under $TMPDIR, removed when all passed)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
TORCH=${TORCH-torch==2.13.0}
WORK=${1:-$(mktemp -d "${TMPDIR:-/tmp}/mmjudge-installed.XXXXXX")}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} PIP_DISABLE_PIP_VERSION_CHECK=1
START=$SECONDS
step() { echo "== [$((SECONDS - START)) s] $*"; }
trap 'echo "make test-installed FAILED; its files are in $WORK"' ERR

step "build the sdist, then the wheel from it"
"$PYTHON" -m venv "$WORK/build-tools"
"$WORK/build-tools/bin/pip" install -q build
"$WORK/build-tools/bin/python" -m build --outdir "$WORK/dist" "$ROOT" > "$WORK/build.log"
SDIST=$(ls "$WORK"/dist/mmjudge-*.tar.gz)
WHEEL=$(ls "$WORK"/dist/mmjudge-*.whl)

step "a fresh venv: $TORCH, then $(basename "$WHEEL") with the newest dependencies its ranges allow"
"$PYTHON" -m venv "$WORK/venv"
VENV_BIN=$WORK/venv/bin
"$VENV_BIN/pip" install -q --upgrade pip
if [ -n "$TORCH" ]; then "$VENV_BIN/pip" install -q "$TORCH"; fi
"$VENV_BIN/pip" install -q "$WHEEL"
"$VENV_BIN/pip" check
"$VENV_BIN/pip" list --format=freeze > "$WORK/installed.txt"
grep -iE '^(torch|transformers|tokenizers|huggingface.hub|peft|accelerate|protobuf|sentencepiece|numpy|scipy|datasets|pydantic|starlette|uvicorn)==' "$WORK/installed.txt" | tr '\n' ' '
echo

USER_DIR=$WORK/user
mkdir -p "$USER_DIR/serve"
# A user's own modules of the generic names the toolkit's packages once had: never imported by it.
echo 'raise SystemExit("the user'"'"'s train.py was imported")' > "$USER_DIR/train.py"
echo 'raise SystemExit("the user'"'"'s serve/ was imported")' > "$USER_DIR/serve/__init__.py"
cd "$USER_DIR"

step "one import name, from site-packages"
"$VENV_BIN/python" - "$WORK/venv" <<'EOF'
import subprocess, sys
from pathlib import Path
import mmjudge
assert Path(mmjudge.__file__).is_relative_to(sys.argv[1]), f"mmjudge imported from {mmjudge.__file__}, not the fresh venv"
shown = subprocess.run([sys.executable, "-m", "pip", "show", "-f", "mmjudge"], capture_output=True, text=True, check=True).stdout
files = shown.split("\nFiles:\n", 1)[1].split()
top = {f.split("/")[0] for f in files if not f.startswith("..") and ".dist-info/" not in f}
assert top == {"mmjudge"}, f"pip show -f mmjudge: top-level {sorted(top)}"
print(f"import mmjudge: {mmjudge.__file__}; pip show -f mmjudge: top-level {sorted(top)}; mmjudge.__all__: {mmjudge.__all__}")
EOF

step "the README's commands on a tiny judge: checkpoint, score, train, score with the adapter, calibrate"
"$VENV_BIN/python" -m mmjudge.judge.testing checkpoint tiny-judge
"$VENV_BIN/python" -m mmjudge.judge.testing dataset --samples 8 --annotated data
DATA=(--input_dir data --input_file "$USER_DIR/data/data.json" --max_tiles 1)
# generate mode writes through the decoder's key/value cache (transformers' attention calls it); a random
# judge's feedback does not parse, so the scores to calibrate come from logits mode
"$VENV_BIN/judge-score" --model_path tiny-judge "${DATA[@]}" --max_new_tokens 8 --output_dir generated
"$VENV_BIN/judge-train" --model_path tiny-judge --train_file "$USER_DIR/data/data.json" --eval_file "$USER_DIR/data/data.json" \
  --input_dir data --output_dir my-judge --max_steps 2 --per_device_batch_size 2 --max_tiles 1 --eval_max_new_tokens 8
"$VENV_BIN/judge-score" --model_path tiny-judge "${DATA[@]}" --mode logits --output_dir scored
"$VENV_BIN/judge-score" --model_path my-judge "${DATA[@]}" --mode logits --output_dir scored-trained
"$VENV_BIN/judge-calibrate" --predictions scored/eval_result.json scored-trained/eval_result.json --names base trained \
  --human data/data.json --output_dir report
test -s report/report.html && test -s report/calibrator.json

step "the Python API: Judge.load, score, calibrate"
"$VENV_BIN/python" - <<'EOF'
import mmjudge
judge = mmjudge.Judge.load("tiny-judge", max_tiles=1, mode="logits")
records = judge.score("data/data.json", progress=False)
report = mmjudge.calibrate(records, "data/data.json", output_dir="api-report")
print(f"{judge!r}: {len(records)} records; calibrate: {sorted(report.judges)}")
EOF

step "judge-serve: /health, then /v1/score"
PORT=$("$VENV_BIN/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$VENV_BIN/judge-serve" --model_path tiny-judge --image_root data --port "$PORT" > serve.log 2>&1 &
SERVER=$!
"$VENV_BIN/python" - "$PORT" "$SERVER" <<'EOF' || { kill "$SERVER" 2>/dev/null; cat serve.log; exit 1; }
import json, os, sys, time, urllib.request
port, server = sys.argv[1], int(sys.argv[2])
base = f"http://127.0.0.1:{port}"
deadline = time.time() + 300
while True:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=5) as answer:
            break
    except OSError:
        os.kill(server, 0)  # fails if the server has exited
        if time.time() > deadline:
            raise SystemExit("judge-serve did not answer /health within 300 s")
        time.sleep(1)
samples = json.load(open("data/data.json"))[:2]
request = urllib.request.Request(f"{base}/v1/score", data=json.dumps({"samples": samples}).encode(), headers={"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=300) as answer:
    results = json.load(answer)["results"]
assert [r["id"] for r in results] == [s["id"] for s in samples], results
print(f"/v1/score: {len(results)} records, scores {[r['score'] for r in results]}")
EOF
kill "$SERVER"
wait "$SERVER" || true

step "the quick test loop, from the sdist's tests, against the installed package"
# the test tools, and DeepSpeed (built against the torch installed, as the Makefile builds it): the suite tests it
"$VENV_BIN/pip" install -q --no-build-isolation "$WHEEL[test,deepspeed,rl,ray]"
"$VENV_BIN/pip" check
"$VENV_BIN/pip" list --format=freeze | grep -iE '^(trl|datasets|accelerate|deepspeed)==' | tr '\n' ' '  # the extras' newest
echo
SOURCE=$WORK/sdist
mkdir -p "$SOURCE"
tar -xzf "$SDIST" -C "$SOURCE" --strip-components=1
# The sdist's copy of the package (every folder pyproject.toml maps into mmjudge) goes: the tests import the
# installed one, and any test reaching into the checkout fails here.
"$VENV_BIN/python" - "$SOURCE" <<'EOF'
import shutil, sys, tomllib
from pathlib import Path
source = Path(sys.argv[1])
for folder in set(tomllib.loads((source / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()):
    shutil.rmtree(source / folder)
EOF
mkdir -p "$WORK/tests-run"
cd "$WORK/tests-run"
"$VENV_BIN/python" -m pytest -q -p no:cacheprovider -m "not slow and not gpu" --rootdir "$SOURCE" -c "$SOURCE/pyproject.toml" "$SOURCE/tests"

step "all passed"
trap - ERR
cd /
rm -rf "$WORK"
