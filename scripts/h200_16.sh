#!/usr/bin/env bash
# The GPU measurements issue 16 (and the GPU tests of 20/21) still need, on the lent H200 (carry [".whl"]):
#   bash scripts/h200_16.sh suite                  # pytest tests, whole (the clinic verdicts, the participant cap)
#   bash scripts/h200_16.sh budget [ARCH ...]      # benchmarks/budget_accuracy.py (default: all ten architectures)
#   bash scripts/h200_16.sh allocator              # benchmarks/allocator_agreement.py --random 40 (both modes)
#   SEED_START=40 bash scripts/h200_16.sh allocator   # 40 fresh seeds per mode: held out from the simulator's port
#   bash scripts/h200_16.sh quantizers             # benchmarks/quantizers.py: peak and time, Llama-3.2-1B and Qwen2.5-1.5B
#   bash scripts/h200_16.sh trace                  # benchmarks/alloc_trace.py: one generate's real allocator events
# .whl: ../shared/tools/gpu-wheels, torchao 0.18.0, and jupytext (the suite's notebook checks import it; the image lacks it):
#   pip download --no-deps torchao==0.18.0 jupytext==1.19.6 mdit-py-plugins==0.7.0 -d .whl
# Each part writes under $OUT; a part that runs past the call's limit keeps what it wrote (rows are written as they come).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH || exit 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
case "${1:-suite}" in
  suite) python3 -m ipykernel install --user --name python3 >/dev/null
         timeout "${SUITE_TIMEOUT:-560}" python3 -m pytest tests -q -p no:cacheprovider -rs 2>&1 | tee "$OUT/pytest_h200.txt" | tail -25 ;;
  budget) archs=(); [ $# -gt 1 ] && archs=(--archs "${@:2}")
          python3 benchmarks/budget_accuracy.py --out "$OUT/budget_accuracy.json" "${archs[@]}" 2>&1 \
            | tee "$OUT/budget_accuracy.log" | tail -40 ;;
  allocator) python3 benchmarks/allocator_agreement.py --random "${RANDOM_N:-40}" --seed-start "${SEED_START:-0}" \
            --out "$OUT/allocator_agreement${SEED_START:+_from_$SEED_START}.json" 2>&1 \
            | tee "$OUT/allocator_agreement.log" | tail -8 ;;
  quantizers) python3 benchmarks/quantizers.py --out "$OUT/quantizers.json" --arch Llama-3.2-1B,Qwen2.5-1.5B \
            --bits 4 --group 128 --calib-samples 128 --methods gptq,awq 2>&1 | tee "$OUT/quantizers.log" | tail -12 ;;
  trace) python3 benchmarks/alloc_trace.py --out "$OUT/alloc_trace.json" 2>&1 | tee "$OUT/alloc_trace.log" | tail -6 ;;
  *) echo "unknown part $1"; exit 2 ;;
esac
