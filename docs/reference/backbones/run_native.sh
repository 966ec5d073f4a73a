#!/bin/bash
# Natively released checkpoints (Qwen2.5-VL, Qwen3-VL, InternVL's -hf) against transformers' own generate with the
# official processor (docs/backbones.md). usage: run_native.sh WORK_DIR [FAMILY...]
set -e
work=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
ours=$(cd "$here/../../.." && pwd)/.venv/bin/python
mkdir -p "$work"
[ -d "$work/data" ] || "$ours" "$here/samples.py" "$work/data" 30 1
for name in ${@:-qwen2.5-vl-7b qwen3-vl-4b internvl3-1b-hf}; do
  rm -rf "$work/$name"
  "$ours" -m mmjudge.judge.testing checkpoint --family "$name" "$work/$name"
  "$ours" "$here/ours.py" "$work/$name" "$work/data" 4 24 "$work/$name.ours.pt"
  "$ours" "$here/hf_reference.py" "$work/$name" "$work/$name.ours.pt" 24 4 "$work/$name.reference.pt"
  echo "== $name"
  "$ours" "$here/compare.py" "$work/$name.ours.pt" "$work/$name.reference.pt"
done
