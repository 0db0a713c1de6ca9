#!/usr/bin/env bash
# Notebooks 08-09's GPU measurements on the lent H200: ./scripts/h200_08.sh kernels|decode|notebooks|clinic (carry [".whl"]).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH || exit 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
case "${1:-kernels}" in
  kernels) python3 benchmarks/kernels.py --out "$OUT/kernels.json" "${@:2}" 2>&1 | tee "$OUT/kernels.log" | tail -80 ;;
  decode) python3 benchmarks/decode.py --out "$OUT/decode.json" "${@:2}" 2>&1 | tee "$OUT/decode.log" | tail -60 ;;
  notebooks)  # the suite and notebooks 07–09 on the GPU, CI profile
    python3 -m ipykernel install --user --name python3 >/dev/null
    timeout 200 python3 -m pytest tests -q -p no:cacheprovider -x 2>&1 | tee "$OUT/pytest_h200.txt" | tail -5
    COURSE_REPORT="$OUT/key_numbers.json" COURSE_PROFILE=ci timeout "${NB_TIMEOUT:-360}" python3 -m pytest ${NOTEBOOKS:-notebooks/07_kv_cache_ab.ipynb notebooks/08_quantized_inference.ipynb \
      notebooks/09_clinic.ipynb} --nbmake --nbmake-timeout=300 -q -p no:cacheprovider --durations=0 2>&1 \
      | tee "$OUT/notebooks_h200.log" | tail -25 ;;
  clinic)  # the real-OOM verdicts and the shared-GPU recipe of notebook 09 (tests/test_clinic.py's GPU tests)
    python3 -m pytest tests/test_clinic.py tests/test_measure_kv_leaks.py -q -p no:cacheprovider -rA 2>&1 \
      | tee "$OUT/clinic_h200.txt" | tail -15 ;;
  *) echo "unknown part $1"; exit 2 ;;
esac
