# make demo: the main job on the shipped defaults.  make test: the test suite.
# Both create .venv/ on first use: torch==2.13.0 (CPU wheel) first, then the package with [dev].
PY      := .venv/bin/python
VENV_OK := .venv/.installed

.PHONY: demo test fuzz venv bench clean

$(VENV_OK): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,decode]'
	touch $(VENV_OK)

venv: $(VENV_OK)

test: $(VENV_OK)
	$(PY) -m pytest -q tests

# Longer fuzzing of every encoder and detokenizer (hundreds of examples per property, more file
# mutations); make test runs the same properties on a one-minute budget. LOGOS_FUZZ_SEED varies the files.
fuzz: $(VENV_OK)
	LOGOS_FUZZ=long $(PY) -m pytest -q tests/test_fuzz.py tests/test_isolation.py

demo: $(VENV_OK)
	bash scripts/demo.sh

bench: $(VENV_OK)
	$(PY) benchmarks/tokenize_bench.py

clean:
	rm -rf demo_out .pytest_cache
