#!/usr/bin/env bash
# TRL's GRPOTrainer rewarded by judge-serve (docs/rewards.md): 2 steps on a CPU, a tiny random Qwen2.5-VL policy,
# the tiny random judge. Run from the repository root with the project's .venv; TRL goes into a venv of its own.
#   bash docs/rewards/check_trl.sh [WORK_DIR]
# Writes the trainer's per-step log lines to WORK_DIR/trl.log; exits non-zero unless both steps ran, no judgement
# failed and the judge was shown the images.
set -euo pipefail
work=${1:-/tmp/mmjudge-trl-check}
mkdir -p "$work"
if [ ! -x "$work/venv/bin/python" ]; then
  python3 -m venv "$work/venv"
  "$work/venv/bin/pip" install -q torch==2.13.0 && "$work/venv/bin/pip" install -q trl torchvision datasets pillow httpx2
  "$work/venv/bin/pip" install -q --no-deps -e .  # mmjudge.rewards alone: it needs httpx2 only
fi
.venv/bin/python -m mmjudge.judge.testing checkpoint --family qwen2.5-vl-3b "$work/policy" >/dev/null
.venv/bin/python -m mmjudge.judge.testing checkpoint --format original "$work/judge" >/dev/null
port=$(.venv/bin/python -c "from mmjudge.serve.process import free_port; print(free_port())")
OMP_NUM_THREADS=1 .venv/bin/judge-serve --model_path "$work/judge" --reward score:SA --mode logits --max_tiles 1 --workers 1 \
  --port "$port" > "$work/judge-serve.log" 2>&1 &
server=$!
trap 'kill $server' EXIT
until curl -sf "127.0.0.1:$port/health" >/dev/null; do kill -0 $server; sleep 1; done
"$work/venv/bin/python" docs/rewards/trl_grpo.py "$work/policy" "http://127.0.0.1:$port" "$work/out" > "$work/trl.log" 2>&1
grep '^{' "$work/trl.log"
curl -s "127.0.0.1:$port/metrics" | grep 'handler="/get_reward"'
