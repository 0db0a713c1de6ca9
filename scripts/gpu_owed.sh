#!/usr/bin/env bash
# The GPU measurements the code of this commit still owes (README, "Measurements owed"), in calls of at
# most 10 minutes, one process on the card at a time:  COURSE_COMMIT=<hash> bash scripts/gpu_owed.sh CALL
#   1  what a notebook's first cell waits for (imports, first CUDA call); the GPU tests of the newest paths
#      (W4A16 kernels, split-KV decode attention, decode recipes, kernel_once); whole-model decode with that
#      attention (bf16 and ours, fused+attn and fused+head+attn, batch 1 compiled, 8, 16)
#   2  the W4A16 kernels: the tensor-core kernel (phases A and B, M = 2-16), both split rules on the held-out
#      shapes (phases S and T), the GEMV at M = 1 (phase G), then Nsight Compute on three calls
#   3  the rest of the test suite (one process)
#   4, 5  the reference run of all notebooks, full profile, one at a time (00-05, then 06-10: about 490 and
#      450 s in the last run; join the two folders with scripts/run_all.py --merge)
# Everything lands under $OUT (default /tmp/out); carry .whl (README, "Running the GPU parts").
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/out} PART_TIMEOUT=${PART_TIMEOUT:-540}
T0=$(date +%s)
# seconds left of a budget (default 585) since the call began, at least a floor (default 0)
left() { local t=$(( ${1:-585} - ($(date +%s) - T0) )); echo $(( t > ${2:-0} ? t : ${2:-0} )); }
gpu() { bash scripts/gpu.sh "$@"; }
case "${1:-}" in
  1) PART_TIMEOUT=150 gpu imports
     TESTS="tests/test_w4_kernel.py tests/test_decode_attention.py tests/test_decode_bench.py tests/test_kernel_once.py" \
       PART_TIMEOUT=200 gpu pytest
     if [ -d .whl ]; then export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH; else export PYTHONPATH=$PWD; fi
     t=$(left 585 60)
     echo "=== decode with the split-KV attention, $t s"
     timeout "$t" python3 -m benchmarks.decode --out "$OUT/decode_attn.json" --batches 1,8,16 --eager "" \
       --compile 1 --formats "bf16,W4A16 ours" --recipes "fused+attn,fused+head+attn" --profile compiled \
       > "$OUT/decode_attn.log" 2>&1
     echo "decode rc $?"; grep -E "tok/s|failed|Error" "$OUT/decode_attn.log" | cut -c1-200 | tail -14 ;;
  2) KERNEL_ARGS="--phases A,B --rows 2,8,16 --crossover-rows 4" KERNEL_BUDGET=200 PART_TIMEOUT=220 gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_AB.json"
     KERNEL_ARGS="--phases S,T --held-out --shapes= --rows 2,8,16" PART_TIMEOUT=$(left 300 60) gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_ST.json"
     KERNEL_ARGS="--phases G --rows 1" PART_TIMEOUT=$(left 500 60) gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_G.json"
     PART_TIMEOUT=$(left 585 30) gpu ncu ;;
  3) TESTS="tests --ignore=tests/test_w4_kernel.py --ignore=tests/test_decode_attention.py \
--ignore=tests/test_decode_bench.py --ignore=tests/test_kernel_once.py" PART_TIMEOUT=570 gpu pytest ;;
  4) NOTEBOOKS="notebooks/00_setup.ipynb notebooks/01_memory_budget.ipynb notebooks/02_allocator_fragmentation.ipynb \
notebooks/03_quantization_basics.ipynb notebooks/04_gptq.ipynb notebooks/05_awq.ipynb" PART_TIMEOUT=580 gpu notebooks ;;
  5) NOTEBOOKS="notebooks/06_perplexity.ipynb notebooks/07_kv_cache_ab.ipynb notebooks/08_quantized_inference.ipynb notebooks/09_clinic.ipynb \
notebooks/10_multi_gpu.ipynb" PART_TIMEOUT=580 gpu notebooks ;;
  *) echo "usage: COURSE_COMMIT=<hash> bash scripts/gpu_owed.sh 1|2|3|4|5 (see the header)"; exit 2 ;;
esac
echo "call ${1} done in $(( $(date +%s) - T0 )) s"
