# The two commands of the README: `make demo` and `make test`.
# Both create .venv from scratch when it is missing. torch is pinned first, on its own,
# so that nothing later resolves `torch` to a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dpex-installed
DOCS_STAMP := $(VENV)/.dpex-docs-installed

.PHONY: install demo test test-slow test-versions bench docs docs-build clean

install: $(STAMP)

# Everything installed is byte-compiled. Worth it: where PYTHONDONTWRITEBYTECODE is set
# (this machine, many container images) Python never writes .pyc files itself, and every
# process -- each Ray worker, torchrun rank, test subprocess -- would compile torch, ray and
# lightning from source again (+2.5 s CPU for `import torch, ray` alone; the suite ran 24
# min instead of 12). pip compiles one file at a time (about a minute); compileall on
# every core after it is 15-20 s quicker on 2 cores. Like pip, it goes past a file that
# does not compile (torch ships one written for Python 3.12): hence the `|| true`.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile torch==2.13.0
	$(PY) -m pip install -q --no-compile -e ".[test]"
	$(PY) -m compileall -qq -j 0 $(VENV)/lib || true
	touch $(STAMP)

demo: install
	$(PY) examples/accuracy_table.py --setups single --epochs 2 --repeats 3 --head-address embedded

# The suite in two tiers, each on two pytest-xdist processes that take a test module at a
# time, longest first (tests/conftest.py: NOTE [ The `ray start` record under parallel
# tests ]). `make test`: all but the tests marked slow, whole programs run end to end (how a
# training process ends, a real TorchTrainer, the examples, the bench's own runs); `make
# test-slow`: those. .ci/run runs both. `$(PY) -m pytest` runs everything in one process.
XDIST := -n 2 --dist loadfile --no-loadscope-reorder
test: install
	$(PY) -m pytest -q -ra $(XDIST) -m "not slow"

test-slow: install
	$(PY) -m pytest -q -ra $(XDIST) -m slow

# The corners of the supported versions (oldest: Python 3.10, torch 2.4, Ray 2.40; newest:
# torch 2.15, Ray 2.60), each in its own .venv-versions/<corner>, each running the version
# subset of the suite. CORNERS="oldest" runs one. See scripts/test_versions.sh.
CORNERS ?= oldest newest
test-versions:
	bash scripts/test_versions.sh $(CORNERS)

bench: install
	$(VENV)/bin/dpex bench

# The documentation site (mkdocs.yml; the pages are docs/*.md). The docs extra goes into the
# same .venv, after the install above (so its torch stays the CPU one). `docs` serves the site
# at http://127.0.0.1:8000 and rebuilds it on every edit; `docs-build` builds it into site/
# with --strict, which fails on a broken link, anchor or API reference (.ci/run runs it).
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(VENV)/bin/mkdocs serve

docs-build: $(DOCS_STAMP)
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) .venv-versions build dist src/*.egg-info .pytest_cache
