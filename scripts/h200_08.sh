#!/usr/bin/env bash
# Notebook 08's GPU measurements on the lent H200: ./scripts/h200_08.sh kernels|decode|notebook (carry [".whl"]).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH || exit 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
case "${1:-kernels}" in
  kernels) python3 benchmarks/kernels.py --out "$OUT/kernels.json" "${@:2}" 2>&1 | tee "$OUT/kernels.log" | tail -80 ;;
  decode) python3 benchmarks/decode.py --out "$OUT/decode.json" "${@:2}" 2>&1 | tee "$OUT/decode.log" | tail -60 ;;
  *) echo "unknown part $1"; exit 2 ;;
esac
