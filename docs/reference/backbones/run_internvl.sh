#!/bin/bash
# InternVL's original layouts against InternVL's own code (docs/backbones.md): for each family, a tiny checkpoint
# shipping InternVL's remote code, mmjudge's side (ours.py) and InternVL's (internvl_reference.py), compared.
# usage: run_internvl.sh WORK_DIR REFERENCE_VENV REMOTE_CODE INTERNVL_CHECKOUT [FAMILY...]
set -e
work=$1 venv=$2 remote=$3 internvl=$4; shift 4
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
ours=$repo/.venv/bin/python
switch=1150  # the long rope's (Phi-3) and dynamic NTK's (InternLM2) switch, inside the samples' prompt lengths
mkdir -p "$work"
[ -d "$work/data" ] || "$ours" "$here/samples.py" "$work/data" 30 1
for family in "${@:-internvl2-4b internvl2-1b internvl2-8b internvl2.5-8b internvl3-2b}"; do
  for name in $family; do
    dir=$work/${name//./_}  # transformers names a checkpoint's remote-code module after its folder: no dots (InternVL2_5-8B)
    rm -rf "$dir"
    "$ours" -c "from mmjudge.judge.testing.families import write_family_checkpoint as w; w('$name', '$dir', rope_switch=$switch)"
    cp "$remote"/*.py "$dir/"
    "$ours" "$here/ours.py" "$dir" "$work/data" 4 24 "$work/$name.ours.pt"
    "$venv/bin/python" "$here/internvl_reference.py" "$dir" "$work/$name.ours.pt" 24 4 "$internvl" "$work/$name.reference.pt"
    echo "== $name"
    "$ours" "$here/compare.py" "$work/$name.ours.pt" "$work/$name.reference.pt" $switch
  done
done
