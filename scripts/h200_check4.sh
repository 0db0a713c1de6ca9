#!/usr/bin/env bash
# The notebooks not yet run on the GPU after a restructure, CI profile, one kernel each, under $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH || exit 1
python3 -m ipykernel install --user --name python3 >/dev/null
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OUT=${OUT:-/tmp/out} COURSE_PROFILE=ci
timeout "${NB_TIMEOUT:-500}" python3 -m pytest notebooks/00_setup.ipynb notebooks/01_memory_budget.ipynb \
  notebooks/03_quantization_basics.ipynb notebooks/04_gptq.ipynb notebooks/05_awq.ipynb notebooks/06_perplexity.ipynb \
  --nbmake --nbmake-timeout=300 -q -p no:cacheprovider --durations=0 2>&1 | tee "$OUT/notebooks_h200_b.log" | tail -30
