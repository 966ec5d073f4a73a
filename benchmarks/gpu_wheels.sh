#!/usr/bin/env bash
# What the GPU machine lacks, as wheels in .whl/ (git-ignored), for benchmarks/gpu_check.sh to install there
# beside its own torch: this project's wheel, built from the checkout; transformers inside the declared range
# (the machine has 5.17); DeepSpeed, built here (it ships as an sdist); and the pure-Python or abi3 packages
# the machine does not have (KINDS.md's list), for its Python 3.12. About 25 MiB, within the 64 MiB a call carries.
set -eu
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >>.git/info/exclude
rm -rf .whl && mkdir .whl
PLATFORMS=(--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64)
for pkg in transformers==5.24.0 peft==0.21.2 liger-kernel==0.8.5 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection \
  typing_extensions starlette uvicorn httpx2==2.16.2 httpcore2==2.16.2 truststore anyio idna llguidance rouge antlr4-python3-runtime==4.11.1 \
  datasets dill multiprocess hjson; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" -d .whl "$pkg" 2>&1 | grep -v '^WARNING' || true
done
PY=${PYTHON:-.venv/bin/python}
$PY -m pip wheel -q --no-deps --no-build-isolation -w .whl deepspeed==0.19.8 . 2>&1 | grep -v '^WARNING' || true
ls .whl && du -sh .whl
