#!/usr/bin/env bash
# Second GPU call of a session: the test suite, then the benchmarks whose code moved
# (budget_accuracy: helpers.budget_check; kv_ab: helpers.generation), written under $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH || exit 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OUT=${OUT:-/tmp/out}
timeout 240 python3 -m pytest tests -q -p no:cacheprovider -rs -x 2>&1 | grep -v "Grid search\|Propagating\|Smoothing\|Calibrating" | tee "$OUT/pytest_h200.log"
echo "pytest rc=${PIPESTATUS[0]}" | tee -a "$OUT/pytest_h200.log"
timeout 200 python3 benchmarks/budget_accuracy.py --out "$OUT/budget_accuracy.json" 2>&1 | tail -20
timeout 120 python3 benchmarks/kv_ab.py --out "$OUT/kv_ab.json" --contexts 1024,4096,16384 2>&1 | tail -20
