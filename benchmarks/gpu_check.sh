#!/usr/bin/env bash
# The GPU check on a machine with one GPU and no package index: install the bundled wheels, then run
# benchmarks/gpu_check.py. The bundle is made by `make gpu-wheels` (gpu_wheels/ and gpu_shards/, copied with the tree).
# On the GPU machine:
#   bash benchmarks/gpu_check.sh            # writes $OUT/gpu_check.json and the generated texts under $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT"
# No network there: every wheel comes from gpu_wheels/ (DeepSpeed pure-Python and its small dependencies; with
# GPU_GENERATE=1 also RDKit, gemmi, spglib, lark, llguidance). The project runs from the tree. --no-deps keeps
# the machine's torch. Without the generation wheels, pass --parts train,zero3.
python -m pip install -q --no-index --no-deps --target "$OUT/site" gpu_wheels/*.whl
export PYTHONPATH="$PWD/$OUT/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export DS_BUILD_OPS=0 DS_SKIP_CUDA_CHECK=1 TOKENIZERS_PARALLELISM=false
timeout 290 python benchmarks/gpu_check.py --out "$OUT/gpu_check.json" --shards gpu_shards "$@"
# vLLM part (only where the GPU machine already has vLLM: its wheels do not fit the carry): the built-in engine
# against vLLM on the GPU, tiny and ~100M models, 16 and 128 rows, printed, BENCHMARKS.md untouched.
if python -c "import vllm" 2>/dev/null; then
    timeout 280 python benchmarks/vllm_bench.py --models tiny 100m --rows 16 128 --n 128 --no-write \
        > "$OUT/vllm_bench.md" 2>&1 || echo "vllm_bench failed (see $OUT/vllm_bench.md)"
else
    echo "no vLLM on this machine: vllm_bench skipped" > "$OUT/vllm_bench.md"
fi
