#!/usr/bin/env bash
# Final GPU call of a session: the test suite, the notebooks whose GPU cells changed (CI profile),
# and the benchmarks whose code moved (kv_ab: helpers.generation; allocator_agreement), under $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH || exit 1
python3 -m ipykernel install --user --name python3 >/dev/null
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OUT=${OUT:-/tmp/out}
timeout 200 python3 -m pytest tests -q -p no:cacheprovider -rs 2>&1 | grep -v "Grid search\|Propagating\|Smoothing\|Calibrating" | tee "$OUT/pytest_h200.log" | tail -12
echo "pytest rc=${PIPESTATUS[0]}" | tee -a "$OUT/pytest_h200.log"
COURSE_PROFILE=ci timeout 240 python3 -m pytest notebooks/02_allocator_fragmentation.ipynb notebooks/07_kv_cache_ab.ipynb \
  --nbmake --nbmake-timeout=200 -q -p no:cacheprovider 2>&1 | tail -25 | tee "$OUT/notebooks_h200.log"
timeout 150 python3 benchmarks/kv_ab.py --out "$OUT/kv_ab.json" --contexts 1024,4096,16384,32768 2>&1 | grep "^{" | tail -20
timeout 60 python3 benchmarks/allocator_agreement.py --out "$OUT/allocator_agreement.json" 2>&1 | tail -8
