# Two targets a user needs: `make demo` and `make test`; `make docs` builds the documentation site. Both set up .venv first (once).
# torch is pinned to the CPU build used by the test suite; on a GPU machine install your CUDA build of
# torch first and run `make setup TORCH=` to keep it.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
DEEPSPEED ?= deepspeed==0.19.8
# DeepSpeed compiles its CPU ops on first use under a file lock. A per-checkout cache means a build
# killed elsewhere (whose lock never goes away) cannot hang this checkout's training.
export TORCH_EXTENSIONS_DIR ?= $(abspath $(VENV))/torch_extensions

.PHONY: setup test test-installed lock demo docs clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements/lock.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(TORCH),$(PY) -m pip install -q $(TORCH))
	$(PY) -m pip install -q -r requirements/lock.txt
	# DeepSpeed builds against the torch above; build isolation would pull a second, multi-GB torch.
	$(PY) -m pip install -q --no-build-isolation $(DEEPSPEED)
	# DeepSpeed's CPU ops (CPU Adam, shared-memory collectives) are compiled by the first --deepspeed run, not here:
	# 16 minutes of a busy machine for every user, most of whom never pass --deepspeed (train/run.py, docs/training.md).
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

# The whole suite, on requirements/lock.txt: every dependency at the lower bound of its range.
test: setup
	$(PY) -m pytest -q --durations=15

# What `pip install mmjudge` gets, on the newest versions the ranges allow (.ci/installed.sh): the wheel,
# built from the sdist, in a fresh venv; the README's commands in a user's folder; the quick loop from the
# sdist's tests against the installed package. CI runs it after `make test`.
test-installed:
	TORCH='$(TORCH)' bash .ci/installed.sh

# Rewrites requirements/lock.txt from pyproject.toml's lower bounds, for this Python (requirements/lock.py).
lock:
	python3 requirements/lock.py

demo: setup
	$(VENV)/bin/judge-demo --output_dir demo_outputs

# The documentation site (mkdocs.yml), in site/: MkDocs and Material in a venv of their own, pinned in
# requirements/docs.txt. --strict: a broken link, a missing heading or a page left out of the nav fails.
DOCS_VENV ?= .venv-docs
docs: $(DOCS_VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --site-dir site

$(DOCS_VENV)/.installed: requirements/docs.txt
	test -x $(DOCS_VENV)/bin/python || python3 -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install -q -r requirements/docs.txt
	touch $@

clean:
	rm -rf $(VENV) $(DOCS_VENV) demo_outputs eval_outputs site
