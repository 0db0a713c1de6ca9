#!/usr/bin/env bash
# The GPU checks of a session, in one device call (see README "Reference results"):
#   the whole test suite on the GPU, then the quantizer benchmark on two architectures.
# Expects the wheels of ../shared/tools/gpu-wheels in .whl/ and writes under $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH || exit 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/device.txt"
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest tests -q -p no:cacheprovider -rs 2>&1 | tee "$OUT/pytest_h200.log"
echo "pytest rc=${PIPESTATUS[0]}" | tee -a "$OUT/pytest_h200.log"
timeout "${BENCH_TIMEOUT:-240}" python3 benchmarks/quantizers.py --out "$OUT/quantizers.json" \
  --arch "${ARCHS:-SmolLM2-135M,Qwen2.5-0.5B}" --methods gptq,awq --impls "${IMPLS:-ours}" --bits 4
