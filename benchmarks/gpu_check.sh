#!/usr/bin/env bash
# The GPU check: every GPU-only test and every benchmark in one run of at most ~8 minutes on one H100 or
# H200. OUT receives five files, within the device tool's eight: log.txt (every step's output), steps.txt
# (each step's exit code and seconds), profile.txt (where scoring's time goes), summary.json (every figure)
# and summary.md (the short table benchmarks/gpu_report.py makes of them, also printed at the end).
#
#   bash benchmarks/gpu_wheels.sh           # here, once per change: what the GPU machine lacks, as wheels in .whl/
#   bash benchmarks/gpu_check.sh "$OUT"     # there, in the repository (the device tool: carry .whl)
#   GPU_CHECK_SMOKE=1 PYTHON=/path/to/python bash benchmarks/gpu_check.sh /tmp/out   # rehearsal on a CPU, tiny judge
#
# Steps run in order of what matters most, each under its own time limit and all under GPU_CHECK_SECONDS
# (default 480): a step that would start past it is skipped and said so, so the run always ends with a table.
# GPU_CHECK_STEPS="gpu_tests score ..." runs those steps alone; GPU_CHECK_SCORE="--samples 64 ..." replaces the
# scoring benchmark's arguments (score_throughput.py --help), GPU_CHECK_SCORE_SECONDS its time limit (300).
# GPU_CHECK_STRETCH=K multiplies every step's time limit by K: a rehearsal on a busy CPU (the test suite's) must
# not fail because a step a GPU runs in seconds took longer than its limit there.
set -u
OUT=$(realpath -m "${1:-gpu_check}")
REPO=$(realpath "$(dirname "$0")/..")
PY=${PYTHON:-python3}
SMOKE=${GPU_CHECK_SMOKE:-}
FIGURES=$(mktemp -d)  # each step's JSON, gathered into summary.json at the end
mkdir -p "$OUT"
DEADLINE=$((SECONDS + ${GPU_CHECK_SECONDS:-480}))
STRETCH=${GPU_CHECK_STRETCH:-1}
export PYTHONUNBUFFERED=1

WHEELS=$(realpath -m "${GPU_CHECK_WHEELS:-$REPO/.whl}")
if [ -d "$WHEELS" ]; then
  # The project's wheel and the dependencies the GPU machine lacks or holds too old (gpu_wheels.sh), beside
  # the machine's own torch: --no-deps, so its torch stays.
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --ignore-requires-python --target /tmp/site "$WHEELS"/*.whl || exit 2
  export PYTHONPATH=/tmp/site
fi
# Everything runs from an empty folder, as a user's commands do: the repository's mmjudge/ would otherwise
# shadow the installed package (its subpackages are the folders beside it).
cd "$(mktemp -d)" || exit 2

step() {  # step NAME SECONDS COMMAND...: run COMMAND under min(SECONDS, time left), its output in log.txt
  local name=$1 limit=$(($2 * STRETCH)) left=$((DEADLINE - SECONDS)) start=$SECONDS rc
  shift 2
  if [ -n "${GPU_CHECK_STEPS:-}" ] && [[ " $GPU_CHECK_STEPS report " != *" $name "* ]]; then
    return  # not asked for: GPU_CHECK_STEPS names the steps to run (the table is always made)
  fi
  ((left < limit)) && limit=$left
  if ((limit < 10)); then
    echo "$name skipped (out of time)" | tee -a "$OUT/steps.txt"
    return
  fi
  echo "=== $name: $*" >>"$OUT/log.txt"
  timeout "$limit" "$@" >>"$OUT/log.txt" 2>&1
  rc=$?
  echo "$name rc=$rc $((SECONDS - start))s" | tee -a "$OUT/steps.txt"
}

figure() {  # figure FILE KEY DEFAULT: a number from a JSON written by an earlier step
  $PY -c "import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], sys.argv[3]))" "$1" "$2" "$3" 2>/dev/null || echo "$3"
}

[ -n "$SMOKE" ] || step gpu 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
step versions 60 $PY -c "import torch, transformers, peft, mmjudge; print(torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, mmjudge.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"

if [ -n "$SMOKE" ]; then
  step limits 60 $PY $REPO/benchmarks/gpu_limits.py --device cpu --size 256 --copy_mib 16 --json "$FIGURES/limits.json"
else
  step limits 60 $PY $REPO/benchmarks/gpu_limits.py --json "$FIGURES/limits.json"
fi
PEAK=$(figure "$FIGURES/limits.json" matmul_tflops 798)
COPY=$(figure "$FIGURES/limits.json" copy_tb_s 3.0)

# The GPU-only tests, and the split-KV attention's and the batch-invariant products' (which run in Triton's
# interpreter where there is no GPU).
# The rehearsal leaves out the slow ones: the suite runs them on the CPU, and here they would take minutes.
[ -n "$SMOKE" ] && TEST_MARKS=(-m "not slow") || TEST_MARKS=()
step gpu_tests 180 $PY -m pytest -c "$REPO/pyproject.toml" --rootdir "$REPO" "${TEST_MARKS[@]}" "$REPO/tests/infer/test_decoding_gpu.py" \
  "$REPO/tests/infer/test_split_kv.py" "$REPO/tests/infer/test_batch_invariant.py" -q -p no:cacheprovider --junitxml="$FIGURES/gpu_tests.xml"

if [ -n "$SMOKE" ]; then
  SCALE=(--tiny --device cpu --samples 4 --reference_samples 1 --new_tokens 8 --max_tiles 1 --invariance_samples 2 --compare_deterministic)
  TRAIN=(--tiny --device cpu --steps 1 --seq_len 600 --tiles 1)
  SERVE=(--clients 1 4 --requests 4 --new_tokens 4 --time_limit_s 30)
  PROFILE=(--tiny --device cpu --samples 3 --new_tokens 3 --max_tiles 1)
else
  SCALE=(--samples 64 --reference_samples 2 --new_tokens 256 --invariance_samples 64)
  TRAIN=(--steps 5)
  SERVE=(--device cuda --clients 1 8 32 64 --requests 128 --new_tokens 64 --time_limit_s 20)
  PROFILE=(--samples 16 --new_tokens 64)
fi
[ -n "${GPU_CHECK_SCORE:-}" ] && read -r -a SCALE <<<"$GPU_CHECK_SCORE"
step score "${GPU_CHECK_SCORE_SECONDS:-300}" $PY $REPO/benchmarks/score_throughput.py "${SCALE[@]}" --peak_tflops "$PEAK" --copy_tb_s "$COPY" --json "$FIGURES/score.json"
step train 100 $PY $REPO/benchmarks/train_throughput.py "${TRAIN[@]}" --peak_tflops "$PEAK" --json "$FIGURES/train.json"
step train_zero2 100 $PY $REPO/benchmarks/train_throughput.py "${TRAIN[@]}" --peak_tflops "$PEAK" --deepspeed $REPO/configs/deepspeed/zero2.json --json "$FIGURES/train_zero2.json"
step serve 120 $PY $REPO/benchmarks/serve_load.py "${SERVE[@]}" --json "$FIGURES/serve.json"

step profile 100 $PY $REPO/benchmarks/profile_score.py "${PROFILE[@]}" --out "$OUT/profile.txt"

DEADLINE=$((SECONDS + 60)) step report 30 $PY $REPO/benchmarks/gpu_report.py "$FIGURES"
cp "$FIGURES/summary.json" "$FIGURES/summary.md" "$OUT/" 2>/dev/null
cat "$OUT/summary.md" 2>/dev/null
