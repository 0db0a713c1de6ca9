#!/usr/bin/env bash
# The course's GPU measurements, one entry point: bash scripts/gpu.sh PART [PART ...]
#   suite                 pytest tests, whole (CUDA tests included)        -> $OUT/pytest_gpu.txt
#   pytest                pytest $TESTS only (default tests)                -> $OUT/pytest_part.txt
#   clinic                python -m benchmarks.clinic --mps (real OOMs alone and beside another process, MPS)
#   kernels               python -m benchmarks.kernels (W4A16 kernels, every shape/group/M; KERNEL_ARGS="--phases G")
#                         -> $OUT/kernels.json
#   decode                python -m benchmarks.decode (whole-model decode, 8B architecture; DECODE_ARGS adds options,
#                         DECODE_FORMATS="bf16,W4A16 ours" the formats, whose names hold spaces)  -> $OUT/decode.json
#   notebooks             the notebooks in $NOTEBOOKS (default: all), one at a time, full profile
#                         (COURSE_PROFILE to change it) -> $OUT/notebooks/*.ipynb, $OUT/run_all.json
#   prebuild              scripts/prebuild.py (03-09 in the workshop profile, cache COURSE_CACHE, default /tmp/course-cache-workshop;
#                         PREBUILD_ONLY="07 08 09" for some) -> $OUT/prebuild/
#   workshop              the prebuild (of $PREBUILD_ONLY when set) unless the cache holds it, then scripts/workshop_run.py (PARTICIPANTS, default 4,
#                         under CAP_GIB, default 15, started together; one cache; NOTEBOOKS="notebooks/08_….ipynb …" for
#                         some) -> $OUT/workshop/workshop.json
#   xside                 python -m benchmarks.x_side (round 12: the one-row GEMV's loop with its activation side prepared
#                         once per call, alone and with the preparation, beside the rule and tinygemm; XSIDE_ARGS=--pad
#                         for round 13's padded K) -> $OUT/x_side.json
#   imports               python -m benchmarks.import_time (what a notebook's first cell waits for: import, first CUDA call)
#                         -> $OUT/import_time.json
#   ncu                   Nsight Compute on one W4A16 call per case (benchmarks.kernel_once; NCU_CASES="SHAPE:GROUP:ROWS;...",
#                         default the 8B gate/up and 70B down weights at g128, rows 1 and 8; NCU_FAMILY='{"PREPARED":true,
#                         "SUBNORMAL":true}' gives each case auto_config's config with those switches — the one-row cases:
#                         more rows run the tensor-core kernel, which ignores the prepared path's) -> $OUT/ncu.txt
#   budget [ARCH ...]     python -m benchmarks.budget_accuracy               -> $OUT/budget_accuracy.json
#   allocator             python -m benchmarks.allocator_agreement --random 40 (SEED_START=40 for held-out seeds)
#   quantizers            python -m benchmarks.quantizers (GPTQ/AWQ peak and time, ours vs llm-compressor; QUANT_ARGS adds options)
#   gptqblock             python -m benchmarks.gptq_block (one block of GPTQ's column loop: eager, graphs, Triton kernel)
#   trace                 python -m benchmarks.alloc_trace (one generate's real allocator events; TRACE_ARGS="--points ARCH:ATTN:SEQ:BATCH ..."
#                         for the blocks alive at whole models' prefill and decode peaks)
# Set-up on the lent machine: the wheels its image lacks travel in .whl/ (run ../shared/tools/gpu-wheels here,
# plus torchao 0.18.0, jupytext 1.19.6 and mdit-py-plugins 0.7.0 — README, "Running the GPU parts"), carry [".whl"].
# Each part writes under $OUT as it goes; PART_TIMEOUT (seconds, default 540) bounds each part.
set -uo pipefail
[ $# -gt 0 ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }   # no part: the header above
cd "$(dirname "$0")/.."
if [ -d .whl ]; then
  # bytecode compiled at install, as a learner's pip does (compiling at import prints torchao's SyntaxWarning in every cell);
  # once per machine and set of wheels (a later call of this script on the same machine skips it)
  stamp=$(cat .whl/*.whl | sha1sum | cut -c1-16)
  if [ "$(cat /tmp/site/.course-wheels 2>/dev/null)" != "$stamp" ]; then
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || { echo "wheel install failed"; exit 1; }
    echo "$stamp" > /tmp/site/.course-wheels
  fi
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
else
  export PYTHONPATH=$PWD
fi
# the commit the benchmarks record (the lent machine gets the files without .git: pass COURSE_COMMIT there)
export COURSE_COMMIT=${COURSE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
T=${PART_TIMEOUT:-540}
# the *_ARGS, TESTS and NOTEBOOKS below are split into words unquoted: never glob them (a JSON family such as
# [{"PDL":true}] or a test id's [param] is a pattern, which a one-letter file in this folder would match)
set -f
run_part() {
  local part=$1; shift
  local t0=$(date +%s)
  echo "=== $part ($(date -u +%H:%M:%S))"
  case "$part" in
    suite) timeout "$T" python3 -m pytest tests -q -p no:cacheprovider -rs --durations=40 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -30 ;;
    pytest) timeout "$T" python3 -m pytest ${TESTS:-tests} -q -p no:cacheprovider -rs 2>&1 | tee "$OUT/pytest_part.txt" | tail -15 ;;
    gptqblock) timeout "$T" python3 -m benchmarks.gptq_block --out "$OUT/gptq_block.json" 2>&1 | tee "$OUT/gptq_block.log" | tail -20 ;;
    clinic) timeout "$T" python3 -m benchmarks.clinic --out "$OUT/clinic.json" --mps 2>&1 | tee "$OUT/clinic.log" | tail -20 ;;
    kernels) timeout "$T" python3 -m benchmarks.kernels --out "$OUT/kernels.json" --budget-s "${KERNEL_BUDGET:-300}" ${KERNEL_ARGS:-} 2>&1 \
               | tee "$OUT/kernels.log" | grep -E "phase|best|failed|wrote|copy bandwidth" | tail -30 ;;
    decode) timeout "$T" python3 -m benchmarks.decode --out "$OUT/decode.json" ${DECODE_FORMATS:+--formats "$DECODE_FORMATS"} \
              ${DECODE_ARGS:-} 2>&1 | tee "$OUT/decode.log" | tail -30 ;;
    notebooks) COURSE_PROFILE=${COURSE_PROFILE:-full} timeout "$T" python3 scripts/run_all.py --out "$OUT/notebooks" \
                 ${NOTEBOOKS:-} 2>&1 | tee "$OUT/notebooks.log" | tail -30 ;;
    prebuild) COURSE_CACHE=${COURSE_CACHE:-/tmp/course-cache-workshop} timeout "$T" python3 scripts/prebuild.py \
                --out "$OUT/prebuild" ${PREBUILD_ONLY:+--only $PREBUILD_ONLY} 2>&1 | tee "$OUT/prebuild.log" | tail -12 ;;
    workshop) export COURSE_CACHE=${COURSE_CACHE:-/tmp/course-cache-workshop}
              # with PREBUILD_ONLY, rebuild what those notebooks use first (the variants check is then skipped:
              # 07-09 read checkpoints, not the variants of 03-06)
              if [ -n "${PREBUILD_ONLY:-}" ]; then run_part prebuild; skip=--skip-cache-check
              else python3 scripts/prebuild.py --check >/dev/null 2>&1 || run_part prebuild; skip=; fi
              timeout "$T" python3 scripts/workshop_run.py --participants "${PARTICIPANTS:-4}" --cap-gib "${CAP_GIB:-15}" \
                --time-limit-s "$(( T - 15 ))" --out "$OUT/workshop" $skip ${NOTEBOOKS:-} 2>&1 | tee "$OUT/workshop.log" | tail -14 ;;
    xside) timeout "$T" python3 -m benchmarks.x_side --out "$OUT/x_side.json" --budget-s "$(( T - 45 ))" ${XSIDE_ARGS:-} 2>&1 \
             | tee "$OUT/x_side.log" | tail -40 ;;
    imports) timeout "$T" python3 -m benchmarks.import_time --out "$OUT/import_time.json" 2>&1 | tee "$OUT/import_time.log" | tail -16 ;;
    ncu) if ! command -v ncu >/dev/null; then echo "ncu (Nsight Compute) is not on this machine"; return 2; fi
         IFS=';' read -ra cases <<< "${NCU_CASES:-8B gate/up 4096x14336:128:1;8B gate/up 4096x14336:128:8;70B down 28672x8192:128:8}"
         deadline=$(( $(date +%s) + T ))   # the part's budget, shared by its cases
         for c in "${cases[@]}"; do
           IFS=':' read -r shape group rows <<< "$c"
           left=$(( deadline - $(date +%s) ))
           [ "$left" -gt 10 ] || { echo "ncu: no time left for $c"; break; }
           # three calls: two compile and warm up, the third is profiled
           timeout "$left" ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
             --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats \
             --section ComputeWorkloadAnalysis -k "regex:_w4a16|_gemv_prepared" --launch-skip 2 \
             --launch-count 1 python3 -m benchmarks.kernel_once --shape "$shape" --group "$group" --rows "$rows" \
             --calls 3 ${NCU_FAMILY:+--family "$NCU_FAMILY"} > "$OUT/ncu_case.txt" 2>&1
           echo "ncu rc $? for $c"
           cat "$OUT/ncu_case.txt" >> "$OUT/ncu.txt"
           grep -E '^\{|Duration|DRAM Throughput|Achieved Occupancy|Registers Per' "$OUT/ncu_case.txt" | cut -c1-240
         done
         rm -f "$OUT/ncu_case.txt" ;;
    budget) timeout "$T" python3 -m benchmarks.budget_accuracy --out "$OUT/budget_accuracy.json" ${1:+--archs "$@"} 2>&1 \
              | tee "$OUT/budget_accuracy.log" | tail -40 ;;
    allocator) timeout "$T" python3 -m benchmarks.allocator_agreement --random "${RANDOM_N:-40}" --seed-start "${SEED_START:-0}" \
                 --out "$OUT/allocator_agreement${SEED_START:+_from_$SEED_START}.json" 2>&1 | tee "$OUT/allocator.log" | tail -8 ;;
    quantizers) timeout "$T" python3 -m benchmarks.quantizers --out "$OUT/quantizers.json" --arch Llama-3.2-1B,Qwen2.5-1.5B \
                  --bits 4 --group 128 --calib-samples 128 --methods "${METHODS:-gptq,awq}" ${QUANT_ARGS:-} 2>&1 | tee "$OUT/quantizers.log" | tail -12 ;;
    trace) timeout "$T" python3 -m benchmarks.alloc_trace --out "$OUT/alloc_trace.json" ${TRACE_ARGS:-} 2>&1 | tee "$OUT/alloc_trace.log" | tail -6 ;;
    *) echo "unknown part $part (see the header of scripts/gpu.sh)"; return 2 ;;
  esac
  # the device tool brings back a limited number of files: a folder of many (executed notebooks, plots,
  # run_all.json) also comes back whole as one tarball
  for d in notebooks workshop prebuild; do
    [ "$part" = "$d" ] && [ -d "$OUT/$d" ] && tar czf "$OUT/$d.tgz" -C "$OUT" "$d"
  done
  echo "=== $part done in $(( $(date +%s) - t0 )) s"
}
if [ "$1" = budget ]; then run_part "$@"; exit; fi
for part in "$@"; do run_part "$part"; done
