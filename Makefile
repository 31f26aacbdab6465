# make demo: the main job on the shipped defaults.  make test: the test suite.
# Both create .venv/ on first use: torch==2.13.0 (CPU wheel) first, then the package with [dev].
PY      := .venv/bin/python
VENV_OK := .venv/.installed

.PHONY: demo test venv bench clean

$(VENV_OK): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,decode]'
	touch $(VENV_OK)

venv: $(VENV_OK)

test: $(VENV_OK)
	$(PY) -m pytest -q tests

demo: $(VENV_OK)
	bash scripts/demo.sh

bench: $(VENV_OK)
	$(PY) benchmarks/tokenize_bench.py

clean:
	rm -rf demo_out .pytest_cache
