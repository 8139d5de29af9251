# The two commands of the README: `make demo` and `make test`.
# Both create .venv from scratch when it is missing. torch is pinned first, on its own,
# so that nothing later resolves `torch` to a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dpex-installed

.PHONY: install demo test bench clean

install: $(STAMP)

# --no-compile: pip would byte-compile every file of torch and ray (about 80 s on 2 cores);
# Python compiles just the modules it imports, once, on first use.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile torch==2.13.0
	$(PY) -m pip install -q --no-compile -e ".[test]"
	touch $(STAMP)

demo: install
	$(PY) examples/accuracy_table.py --setups single --epochs 2 --head-address embedded

test: install
	$(PY) -m pytest -q -ra

bench: install
	$(VENV)/bin/dpex bench

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
