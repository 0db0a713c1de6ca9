#!/usr/bin/env bash
# The GPU measurements the code of this commit still owes (README, "Measurements owed"), in calls of at
# most 10 minutes, one process on the card at a time:  COURSE_COMMIT=<hash> bash scripts/gpu_owed.sh CALL
#   1  round 9's check, on any card, most important first: decode of Llama-2-7B (ours and tinygemm fused+head+attn
#      in one process, batch 1 compiled, compiled-step profiles; then bf16 fused+attn), of Llama-3.1-8B (bf16
#      fused+attn, ours fused+attn and fused+head+attn, batch 1 compiled, 8, 16, one process); then the narrow
#      rule (nearest-divisor split) at M = 1 on the held-out shapes, Llama-2-7B's two first (kernels phase N)
#   2  the GPU tests of the newest paths (PDL under graph capture, the loads-only kernel); the narrow-tile GEMV
#      at every split on the twelve shapes and the held-out ones, beside auto_config and tinygemm (kernels phase
#      N: the rows its shape rule is fitted on); the bar at each size on eight shapes (phase R)
#   3  whole-model decode with the split-KV attention (bf16 and ours, fused+attn and fused+head+attn, batch 1
#      compiled, 8, 16, compiled-step profiles); then ours fused+head+attn again with PDL
#   4  the W4A16 kernels: the tensor-core kernel (phases A and B, M = 2-16), its split rule on the held-out shapes
#      (phase T), the GEMV at M = 1 (phase G)
#   5  the rest of the test suite (one process)
#   8  the kernel tests (W4Linear moved across devices and cast, every kernel path) and the decode tests; then Nsight
#      Compute on the narrow-tile GEMV (auto_config at M = 1) on the 8B gate/up and down and the 14B-class weights
#   9  call 1 without the 8B decode, with the layer tests first (a short call when device time is short): W4Linear's
#      tests, Llama-2-7B decode (ours and tinygemm; then bf16), phase N on the held-out shapes
#   10 the next round's candidate (not yet on a GPU): phase U (the rule's tile at splits that need not divide the
#      steps, uneven_split) on the twelve shapes and the held-out ones; then decode of Llama-2-7B and Llama-3.1-8B
#      with --family {"UNEVEN":true} beside the rule (batch 1 compiled, fused+head+attn)
#   11 the kernel and decode tests (the GEMV's EVEN/uneven path changed the kernel), then phase U (call 10's first part)
#   12 call 10's decode in one process per architecture: ours at the rule and with UNEVEN (one --family list),
#      and tinygemm, Llama-2-7B then Llama-3.1-8B (batch 1 compiled, fused+head+attn)
#   13 graph_ms's warm replays (its GPU test; phase U timed the same config 15 % slower right after a compile):
#      phase U again, then phase N on the held-out shapes and on the twelve again, warm, to compare with the runs before
#   14 call 13 for a short budget: graph_ms's GPU test, phase U warm (the rule's config again last), then phase V
#      (the rule's tile at every span of steps per program, divisors or not) on the twelve and the held-out shapes
#   15 round 11's check: the uneven candidate's tests (its exactness at uneven splits), phase V on FRESH's shapes
#      (a second held-out set, chosen after the fit), then Llama-2-7B decode with the candidate ({"UNEVEN":true}) beside
#      the rule and tinygemm in one process (fused+head+attn), and bf16 (fused+attn) in the next
#   16 round 12's question (benchmarks/x_side.py): its tests on the GPU (the prepared activation side and the loop
#      that reads it, exact), then the loop alone (four tiles, with and without the next step's words prefetched,
#      splits around the rule's), with its preparation, the rule's kernel at the best tile (the control) and the
#      candidate shape rule (x_side.candidate_config, fitted on run X2's twelve weights), against the rule and
#      tinygemm at M = 1 on every weight of at least 16 MB of the three shape sets
#   17 round 12's prepared path in the layers (helpers/w4_kernel.py KERNEL="prepared", chosen by {"PREPARED":true}):
#      its tests and the kernel tests on the GPU, then decode, batch 1 compiled, fused+head+attn: Llama-3.1-8B and
#      Llama-2-7B, ours at the rule and prepared (one --family list) beside tinygemm, one process per architecture;
#      with call 5 after it, the whole suite at that commit (the three kernels' split-K reduction became one device
#      function, _serial_reduce, after the last GPU run)
#   18 call 17 for a short budget, with this session's changes on the GPU: the kernel tests, the variant store
#      (every tensor of the blocks), budget_check (static=False) and llm-compressor's tests; then round 13's padded
#      K (call 19's run, x_side --pad); then Llama-3.1-8B decode (ours at the rule and prepared beside tinygemm,
#      batch 1 compiled, fused+head+attn); then notebook 01 alone if time is left
#   19 round 13's question (benchmarks/x_side.py --pad): the candidate rule on K padded with zero columns to a whole
#      number of its tile's steps (at most 5 % more bytes) against it unpadded, the rule and tinygemm, on the ten
#      weights x groups whose K the tile's step does not divide (Llama-2-7B and Qwen2.5-72B downs among them); its
#      tests on the GPU first
#   20 round 13 in the layers (eleventh session): the prepared path's tests and the decode benchmark's on the GPU
#      (W4Linear padding its weight at pack time, family {"PREPARED": true, "PAD": true}); Llama-2-7B decode
#      (its down projection is padded, 11008 -> 11264) with ours at the rule, prepared, and prepared + padded
#      beside tinygemm, then bf16 in the next process; then notebook 08 in the full profile (the reference run
#      of 2026-12-06 ran the other ten)
#   21-23 the twelfth session's three calls (on one warm machine, in this order), each notebook alone on the card:
#      21 round 13's layer tests on the GPU (call 20's), notebooks 00-04 (full profile), then Llama-2-7B decode at the
#         rule / prepared / prepared + padded beside tinygemm (batch 1 compiled, fused+head+attn), then bf16
#      22 notebooks 05-08, then Llama-3.1-8B bf16 decode (fused+attn; batch 1 compiled, 8 and 16 with graphs)
#      23 notebooks 09-10, then Llama-3.1-8B ours at the rule and prepared beside tinygemm (fused+head+attn; batch 1
#         compiled, 8 and 16 with graphs) -- with 22, the card's decode file for #31's targets; the three notebook
#         parts join into one reference run with scripts/run_all.py --merge
#   24 T4-sized (COURSE_GPU_GIB=15), full profile, one at a time: notebooks 05-10 (the ones that changed most since
#      the last T4-sized run, bf05d30)
#   25 the card's decode file for #31's targets in two processes: Llama-3.1-8B bf16 (fused+attn), then ours at the
#      rule and prepared beside tinygemm (fused+head+attn); batch 1 compiled, 8 and 16 with graphs
#   26 call 20 for a short budget (CALL_BUDGET seconds, default 420): round 13's layer tests on the GPU, then
#      Llama-2-7B decode, prepared + padded first, then prepared, the rule and tinygemm (as long as the budget lasts)
#   27 the H200's reference run, the notebooks the thirteenth session left (it ran 00-04, 08 and 10 at 7685a95):
#      05, 06 and 07 (full profile, one at a time; about 280 s on the H100 at 63bfe74, 429 s on the H200 at 462e774)
#   28 call 25 again (the 8B decode file: bf16, then ours at the rule and prepared beside tinygemm; 215 s on the H200
#      on 2026-12-07) -- the second run the prepared path needed before it became the one-row default (it ran on an
#      H100 as call 30, 2026-12-07) -- then notebook 09 (full profile; 136 s on the H200 at 0f2f1de)
#   29 round 14 (the prepared path as auto_config's one-row default): the kernel and decode tests on the GPU (call 11's),
#      then notebook 08 in the full profile (its layers now take the prepared path at one row)
#   30 calls 28 and 29 for a short budget, one call: the 8B decode file (bf16, then ours at the rule and prepared
#      beside tinygemm), then the kernel and decode tests (call 29's) as long as the call lasts (317 s on the H100 at
#      90d6dbf, 2026-12-07; the H200's run at round 14's code is still owed)
#   31 the reference run's notebooks that changed since their rows (round 14's 08, and 09 and 07: their rows are
#      from 462e774 / 0f2f1de), full profile, one at a time, 08 first (about 370 s on the H100 at 90d6dbf)
#   32 the rest of it: 05 then 06 (full profile; 205 s and 60 s on the H200 at 462e774; 06 after 05 reuses its AWQ
#      variants — run before it on 2026-12-07, 06 built them: 169 s on the H100), then the whole test suite as long
#      as the call lasts (call 5's)
#   33 round 15 (the preparation in torch ops, fused by torch.compile into the kernel that writes x: family
#      FUSED_PREP): its tests on the GPU (test_x_side.py: inductor's fusion counted, test_decode_bench.py), then
#      Llama-3.1-8B decode, batch 1 compiled, fused+head+attn: ours prepared with and without FUSED_PREP beside
#      tinygemm, compiled-step profiles (one process); bf16 fused+attn in the next; then Qwen2.5-1.5B (held out:
#      biases, another width) ours with and without FUSED_PREP, then its bf16
#   34 round 15's question in a short budget (call 33 found inductor's kernels around a per-group preparation in torch
#      ops, family FUSED_PREP since removed, to be more, not fewer): benchmarks.prep_fusion (the kernels and µs of
#      RMSNorm / SiLU·mul followed by each way of writing the preparation) after test_x_side.py on the GPU, then
#      T4-sized (COURSE_GPU_GIB=15) notebooks 08 and 09 as long as the call lasts (CALL_BUDGET, default 380 s)
#   35 where the prepared loop's fixed microseconds go (#31's next round): Nsight Compute on one row at the default
#      (prepare_x, then the loop; the regex of `gpu.sh ncu` catches the loop) on three ≥ 16 MB weights at g128
#   36 round 16 (PDL on the prepared path: the loop launched while its preparation runs, its first step of the weight
#      asked of L2 before it waits for the planes): the kernel and x-side tests on the GPU (the PDL test's prepared
#      configs: exact, and equal to the plain launch, under graph replay too), then Llama-3.1-8B decode, batch 1
#      compiled, fused+head+attn, ours prepared with and without PDL in one process (compiled-step profiles), after
#      benchmarks.x_side --pdl (the candidate rule with its preparation, plain and with PDL, beside tinygemm, on the
#      >= 16 MB weights for about 200 s); CALL_BUDGET (default 585 s) bounds the whole call
#   37 round 16 where it was not tried first: decode, batch 1 compiled, fused+head+attn, ours prepared with and
#      without PDL in one process per architecture — Llama-2-7B (its down projection's step holds few codes), then
#      Qwen2.5-1.5B (biases, another width, small weights: where fixed costs weigh most; head+attn: fused_projections
#      takes no biases — the first run at 01c34f0 asked for fused+head+attn and got nothing for Qwen)
#   38 the kernel test files on the GPU (call 11's and test_stream_read.py), then T4-sized (COURSE_GPU_GIB=15) 10 and 07
#   39 round 17 (the codes as fp16 subnormals, config SUBNORMAL, each word's chain started from a centring plane:
#      19.4 -> 15.8 instructions a word in the sm_90 SASS): tests/test_w4_kernel.py and test_x_side.py on the GPU (the PTX path's error, the refusals; the
#      CPU-tensor refusal found at 291bce0), then benchmarks.x_side --subnormal (the candidate rule's loop alone and
#      with its preparation, centred and subnormal codes, beside tinygemm, >= 16 MB weights), then Llama-3.1-8B
#      decode, batch 1 compiled, fused+head+attn, ours prepared with and without SUBNORMAL (compiled-step profiles)
#   40 round 17 where it was not tried first, then round 16's owed Qwen: Llama-2-7B decode prepared with and without
#      SUBNORMAL (fused+head+attn), then Qwen2.5-1.5B (head+attn) prepared, with PDL, with SUBNORMAL, then its bf16
#   41 T4-sized (COURSE_GPU_GIB=15) notebook 06, the one of 05-10 never run T4-sized
#   42 why round 17's subnormal loop (fewer instructions) was no faster: Nsight Compute on the prepared loop, centred and
#      with SUBNORMAL, one row, on two pairs that each differ in one thing: K = 3584 at g128 with N 18944 (lost most)
#      and 28672 (gained), and the 8B gate|up joined at g128 (lost) and g64 (gained); and two the waves of programs
#      do not explain (README, round 17's "Waves"): the 14B-class 5120 x 13824 at g64 (a second wave by this
#      machine's compile, no loss) and the 8B down at g128 (under one wave either way, lost 11 %); then, where 150 s
#      are left, round 16's
#      one gain in the other order: Qwen2.5-1.5B decode (head+attn, batch 1 compiled), prepared with PDL first, then
#      plain (run 2026-12-07i had PDL second: +6.6 %)
#   6, 7  the reference run of all notebooks, full profile, one at a time (00-05, then 06-10: about 490 and
#      450 s in the last run; join the two folders with scripts/run_all.py --merge)
# Everything lands under $OUT (default /tmp/out); carry .whl (README, "Running the GPU parts").
# A kernels/decode file joins results/CARD/ with scripts/add_run.py (a run name each).
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/out} PART_TIMEOUT=${PART_TIMEOUT:-540}
T0=$(date +%s)
# seconds left of a budget (default 585) since the call began, at least a floor (default 0)
left() { local t=$(( ${1:-585} - ($(date +%s) - T0) )); echo $(( t > ${2:-0} ? t : ${2:-0} )); }
gpu() { bash scripts/gpu.sh "$@"; }
# a decode part's decode.json and .log kept as NAME.json, NAME.log
keep_decode() { mv "$OUT/decode.json" "$OUT/$1.json"; mv "$OUT/decode.log" "$OUT/$1.log"; }
# round 13's decode check on Llama-2-7B, batch 1 compiled: ours with each family of the JSON list $2 beside tinygemm
# (fused+head+attn), and bf16 (fused+attn), each part bounded by $1 seconds
llama2_w4() { DECODE_FORMATS="W4A16 ours,W4A16 tinygemm" DECODE_ARGS="--arch Llama-2-7B --batches 1 --eager= --compile 1 \
--recipes fused+head+attn --family $2" PART_TIMEOUT=$1 gpu decode; keep_decode decode_Llama-2-7B_padded; }
# a round of the prepared path ($1: its name, the x_side switch --$1; $5: its family key): the test files $2 on the
# GPU ($3 s), then x_side --$1 until $4 s into the call, then Llama-3.1-8B decode, batch 1 compiled, fused+head+attn,
# ours prepared without and with $5 in one process (compiled-step profiles), bounded by CALL_BUDGET (default 585)
prepared_round() {
  TESTS="$2" PART_TIMEOUT=$3 gpu pytest; mv "$OUT/pytest_part.txt" "$OUT/pytest_$1.txt"
  XSIDE_ARGS=--$1 PART_TIMEOUT=$(left "$4" 45) gpu xside
  DECODE_FORMATS="W4A16 ours" DECODE_ARGS="--batches 1 --eager= --compile 1 --recipes fused+head+attn \
--family [{\"PREPARED\":true},{\"PREPARED\":true,\"$5\":true}] --profile compiled" \
    PART_TIMEOUT=$(left "${CALL_BUDGET:-585}" 30) gpu decode; keep_decode "decode_8B_$1"
}
llama2_bf16() { DECODE_FORMATS="bf16" DECODE_ARGS="--arch Llama-2-7B --batches 1 --eager= --compile 1 --recipes fused+attn" \
  PART_TIMEOUT=$1 gpu decode; keep_decode decode_Llama-2-7B_bf16; }
# the Llama-3.1-8B decode file in two processes (a part timeout each): bf16 fused+attn, then ours at the rule and
# prepared beside tinygemm, fused+head+attn; batch 1 compiled, 8 and 16 with graphs
bf16_8b() { DECODE_FORMATS="bf16" DECODE_ARGS="--batches 1,8,16 --eager= --compile 1 --recipes fused+attn" \
  PART_TIMEOUT=$1 gpu decode; keep_decode decode_8B_bf16; }
w4_8b() { DECODE_FORMATS="W4A16 ours,W4A16 tinygemm" DECODE_ARGS="--batches 1,8,16 --eager= --compile 1 \
--recipes fused+head+attn --family [{\"PREPARED\":false},{\"PREPARED\":true}]" PART_TIMEOUT=$1 gpu decode; keep_decode decode_8B_w4; }
# round 16's one gain in the other order: Qwen2.5-1.5B, head+attn, batch 1 compiled, ours prepared with PDL first, then plain
qwen_pdl_first() { DECODE_FORMATS="W4A16 ours" DECODE_ARGS="--arch Qwen2.5-1.5B --batches 1 --eager= --compile 1 \
--recipes head+attn --family [{\"PREPARED\":true,\"PDL\":true},{\"PREPARED\":true}]" PART_TIMEOUT=$1 gpu decode
  keep_decode decode_qwen_pdl_first; }
PADDED='[{"PREPARED":false},{"PREPARED":true},{"PREPARED":true,"PAD":true}]'
case "${1:-}" in
  1) DECODE_FORMATS="W4A16 ours,W4A16 tinygemm" DECODE_ARGS="--arch Llama-2-7B --batches 1 --eager= --compile 1 \
--recipes fused+head+attn --profile compiled" PART_TIMEOUT=200 gpu decode
     mv "$OUT/decode.json" "$OUT/decode_llama2_w4.json"; mv "$OUT/decode.log" "$OUT/decode_llama2_w4.log"
     DECODE_FORMATS="bf16" DECODE_ARGS="--arch Llama-2-7B --batches 1 --eager= --compile 1 --recipes fused+attn" \
       PART_TIMEOUT=$(left 290 40) gpu decode
     mv "$OUT/decode.json" "$OUT/decode_llama2_bf16.json"; mv "$OUT/decode.log" "$OUT/decode_llama2_bf16.log"
     DECODE_FORMATS="bf16,W4A16 ours" DECODE_ARGS="--batches 1,8,16 --eager= --compile 1 \
--recipes fused+attn,fused+head+attn" PART_TIMEOUT=$(left 500 60) gpu decode
     mv "$OUT/decode.json" "$OUT/decode_8B.json"; mv "$OUT/decode.log" "$OUT/decode_8B.log"
     KERNEL_ARGS="--phases N --held-out --shapes= --rows 1" PART_TIMEOUT=$(left 585 30) gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_N_held.json"; mv "$OUT/kernels.log" "$OUT/kernels_N_held.log" ;;
  2) TESTS="tests/test_stream_read.py tests/test_w4_kernel.py::test_programmatic_dependent_launch_changes_no_output \
tests/test_w4_kernel.py::test_pdl_is_a_flag_passed_through_auto_config" PART_TIMEOUT=150 gpu pytest
     KERNEL_ARGS="--phases N --held-out --rows 1" PART_TIMEOUT=$(left 400 60) gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_N.json"
     KERNEL_ARGS="--phases R --rows 1,16 --shapes=8B_q/o_4096x4096,8B_gate/up_4096x14336,8B_down_14336x4096,\
14B-class_5120x13824,14B-class_13824x5120,7B-class_3584x18944,70B_gate/up_8192x28672,8B_q|k|v_4096x6144" \
       PART_TIMEOUT=$(left 585 30) gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_R.json" ;;
  3) if [ -d .whl ]; then export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH; else export PYTHONPATH=$PWD; fi
     DECODE_FORMATS="bf16,W4A16 ours" DECODE_ARGS="--batches 1,8,16 --eager= --compile 1 \
--recipes fused+attn,fused+head+attn --profile compiled" PART_TIMEOUT=$(left 430 60) gpu decode
     mv "$OUT/decode.json" "$OUT/decode_attn.json"; mv "$OUT/decode.log" "$OUT/decode_attn.log"
     DECODE_FORMATS="W4A16 ours" DECODE_ARGS="--batches 1,8,16 --eager= --compile 1 --recipes fused+head+attn \
--family {\"PDL\":true}" PART_TIMEOUT=$(left 585 30) gpu decode
     mv "$OUT/decode.json" "$OUT/decode_pdl.json"; mv "$OUT/decode.log" "$OUT/decode_pdl.log" ;;
  4) KERNEL_ARGS="--phases A,B --rows 2,8,16 --crossover-rows 4" KERNEL_BUDGET=200 PART_TIMEOUT=220 gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_AB.json"
     KERNEL_ARGS="--phases T --held-out --shapes= --rows 2,8,16" PART_TIMEOUT=$(left 300 60) gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_T.json"
     KERNEL_ARGS="--phases G --rows 1" PART_TIMEOUT=$(left 585 60) gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_G.json" ;;
  5) TESTS="tests --ignore=tests/test_w4_kernel.py --ignore=tests/test_stream_read.py \
--ignore=tests/test_decode_attention.py --ignore=tests/test_decode_bench.py --ignore=tests/test_kernel_once.py" \
       PART_TIMEOUT=570 gpu pytest ;;
  6) NOTEBOOKS="notebooks/00_setup.ipynb notebooks/01_memory_budget.ipynb notebooks/02_allocator_fragmentation.ipynb \
notebooks/03_quantization_basics.ipynb notebooks/04_gptq.ipynb notebooks/05_awq.ipynb" PART_TIMEOUT=580 gpu notebooks ;;
  7) NOTEBOOKS="notebooks/06_perplexity.ipynb notebooks/07_kv_cache_ab.ipynb notebooks/08_quantized_inference.ipynb \
notebooks/09_clinic.ipynb notebooks/10_multi_gpu.ipynb" PART_TIMEOUT=580 gpu notebooks ;;
  8) TESTS="tests/test_w4_kernel.py tests/test_decode_bench.py tests/test_decode_attention.py tests/test_kernel_once.py" \
       PART_TIMEOUT=240 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_kernels.txt"
     NCU_CASES="8B gate/up 4096x14336:128:1;8B down 14336x4096:128:1;14B-class 13824x5120:128:1;70B gate/up 8192x28672:128:1" \
       PART_TIMEOUT=$(left 420 30) gpu ncu ;;
  9) TESTS="tests/test_w4_kernel.py -k w4linear" PART_TIMEOUT=60 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_w4linear.txt"
     DECODE_FORMATS="W4A16 ours,W4A16 tinygemm" DECODE_ARGS="--arch Llama-2-7B --batches 1 --eager= --compile 1 \
--recipes fused+head+attn --profile compiled" PART_TIMEOUT=$(left 260 60) gpu decode
     mv "$OUT/decode.json" "$OUT/decode_llama2_w4.json"; mv "$OUT/decode.log" "$OUT/decode_llama2_w4.log"
     DECODE_FORMATS="bf16" DECODE_ARGS="--arch Llama-2-7B --batches 1 --eager= --compile 1 --recipes fused+attn" \
       PART_TIMEOUT=$(left 360 40) gpu decode
     mv "$OUT/decode.json" "$OUT/decode_llama2_bf16.json"; mv "$OUT/decode.log" "$OUT/decode_llama2_bf16.log"
     KERNEL_ARGS="--phases N --held-out --shapes= --rows 1" PART_TIMEOUT=$(left 420 30) gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_N_held.json"; mv "$OUT/kernels.log" "$OUT/kernels_N_held.log" ;;
  10) KERNEL_ARGS="--phases U --held-out --rows 1" PART_TIMEOUT=200 gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_U.json"; mv "$OUT/kernels.log" "$OUT/kernels_U.log"
     for arch in Llama-2-7B Llama-3.1-8B; do
       for fam in '{"UNEVEN":false}' '{"UNEVEN":true}'; do
         DECODE_FORMATS="W4A16 ours" DECODE_ARGS="--arch $arch --batches 1 --eager= --compile 1 --recipes fused+head+attn \
--family $fam" PART_TIMEOUT=$(left 585 30) gpu decode
         mv "$OUT/decode.json" "$OUT/decode_${arch}_$(echo "$fam" | tr -dc a-z).json"
       done
     done ;;
  11) TESTS="tests/test_w4_kernel.py tests/test_decode_bench.py tests/test_decode_attention.py tests/test_kernel_once.py" \
       PART_TIMEOUT=240 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_kernels.txt"
     KERNEL_ARGS="--phases U --held-out --rows 1" PART_TIMEOUT=$(left 585 30) gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_U.json"; mv "$OUT/kernels.log" "$OUT/kernels_U.log" ;;
  12) for arch in Llama-2-7B Llama-3.1-8B; do
       DECODE_FORMATS="W4A16 ours,W4A16 tinygemm" DECODE_ARGS="--arch $arch --batches 1 --eager= --compile 1 \
--recipes fused+head+attn --family [{\"UNEVEN\":false},{\"UNEVEN\":true}]" \
         PART_TIMEOUT=$( [ $arch = Llama-2-7B ] && left 290 60 || left 585 30 ) gpu decode
       mv "$OUT/decode.json" "$OUT/decode_${arch}_uneven.json"; mv "$OUT/decode.log" "$OUT/decode_${arch}_uneven.log"
     done ;;
  13) TESTS="tests/test_loading_timing.py -k graph_ms" PART_TIMEOUT=60 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_graph_ms.txt"
     KERNEL_ARGS="--phases U --held-out --rows 1" PART_TIMEOUT=150 gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_U_warm.json"; mv "$OUT/kernels.log" "$OUT/kernels_U_warm.log"
     KERNEL_ARGS="--phases N --held-out --shapes= --rows 1" PART_TIMEOUT=$(left 420 30) gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_N_held_warm.json"; mv "$OUT/kernels.log" "$OUT/kernels_N_held_warm.log"
     KERNEL_ARGS="--phases N --rows 1" PART_TIMEOUT=$(left 440 20) gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_N_warm.json"; mv "$OUT/kernels.log" "$OUT/kernels_N_warm.log" ;;
  14) TESTS="tests/test_loading_timing.py -k graph_ms" PART_TIMEOUT=60 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_graph_ms.txt"
     KERNEL_ARGS="--phases U --held-out --rows 1" PART_TIMEOUT=100 gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_U_warm.json"; mv "$OUT/kernels.log" "$OUT/kernels_U_warm.log"
     KERNEL_ARGS="--phases V --held-out --rows 1" PART_TIMEOUT=$(left 585 20) gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_V.json"; mv "$OUT/kernels.log" "$OUT/kernels_V.log" ;;
  15) TESTS="tests/test_w4_kernel.py -k uneven" PART_TIMEOUT=90 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_uneven.txt"
     KERNEL_ARGS="--phases V --shapes= --fresh --rows 1" PART_TIMEOUT=$(left 260 60) gpu kernels
     mv "$OUT/kernels.json" "$OUT/kernels_V_fresh.json"; mv "$OUT/kernels.log" "$OUT/kernels_V_fresh.log"
     DECODE_FORMATS="W4A16 ours,W4A16 tinygemm" DECODE_ARGS="--arch Llama-2-7B --batches 1 --eager= --compile 1 \
--recipes fused+head+attn --family [{\"UNEVEN\":false},{\"UNEVEN\":true}]" PART_TIMEOUT=$(left 480 60) gpu decode
     mv "$OUT/decode.json" "$OUT/decode_llama2_candidate.json"; mv "$OUT/decode.log" "$OUT/decode_llama2_candidate.log"
     DECODE_FORMATS="bf16" DECODE_ARGS="--arch Llama-2-7B --batches 1 --eager= --compile 1 --recipes fused+attn" \
       PART_TIMEOUT=$(left 585 30) gpu decode
     mv "$OUT/decode.json" "$OUT/decode_llama2_bf16.json"; mv "$OUT/decode.log" "$OUT/decode_llama2_bf16.log" ;;
  16) TESTS="tests/test_x_side.py" PART_TIMEOUT=90 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_x_side.txt"
     PART_TIMEOUT=$(left 585 60) gpu xside ;;
  17) TESTS="tests/test_x_side.py tests/test_w4_kernel.py" PART_TIMEOUT=150 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_prepared.txt"
     for arch in Llama-3.1-8B Llama-2-7B; do
       DECODE_FORMATS="W4A16 ours,W4A16 tinygemm" DECODE_ARGS="--arch $arch --batches 1 --eager= --compile 1 \
--recipes fused+head+attn --family [{\"PREPARED\":false},{\"PREPARED\":true}]" \
         PART_TIMEOUT=$( [ $arch = Llama-3.1-8B ] && left 370 60 || left 585 30 ) gpu decode
       mv "$OUT/decode.json" "$OUT/decode_${arch}_prepared.json"; mv "$OUT/decode.log" "$OUT/decode_${arch}_prepared.log"
     done ;;
  18) TESTS="tests/test_x_side.py tests/test_w4_kernel.py tests/test_variants.py tests/test_budget_check.py \
tests/test_llm_compressor.py" PART_TIMEOUT=200 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_session.txt"
     XSIDE_ARGS=--pad PART_TIMEOUT=180 gpu xside
     mv "$OUT/x_side.json" "$OUT/x_side_pad.json"; mv "$OUT/x_side.log" "$OUT/x_side_pad.log"
     DECODE_FORMATS="W4A16 ours,W4A16 tinygemm" DECODE_ARGS="--arch Llama-3.1-8B --batches 1 --eager= --compile 1 \
--recipes fused+head+attn --family [{\"PREPARED\":false},{\"PREPARED\":true}]" PART_TIMEOUT=$(left 540 60) gpu decode
     mv "$OUT/decode.json" "$OUT/decode_Llama-3.1-8B_prepared.json"; mv "$OUT/decode.log" "$OUT/decode_Llama-3.1-8B_prepared.log"
     NOTEBOOKS="notebooks/01_memory_budget.ipynb" PART_TIMEOUT=$(left 585 30) gpu notebooks ;;
  19) TESTS="tests/test_x_side.py" PART_TIMEOUT=90 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_x_side.txt"
     XSIDE_ARGS=--pad PART_TIMEOUT=$(left 585 60) gpu xside ;;
  20) TESTS="tests/test_x_side.py tests/test_decode_bench.py" PART_TIMEOUT=150 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_padded.txt"
     llama2_w4 "$(left 400 60)" "$PADDED"
     llama2_bf16 "$(left 500 40)"
     NOTEBOOKS="notebooks/08_quantized_inference.ipynb" PART_TIMEOUT=$(left 585 30) gpu notebooks ;;
  21) TESTS="tests/test_x_side.py tests/test_decode_bench.py" PART_TIMEOUT=150 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_padded.txt"
     NOTEBOOKS="notebooks/00_setup.ipynb notebooks/01_memory_budget.ipynb notebooks/02_allocator_fragmentation.ipynb \
notebooks/03_quantization_basics.ipynb notebooks/04_gptq.ipynb" PART_TIMEOUT=300 gpu notebooks
     mv "$OUT/notebooks" "$OUT/notebooks_a"; mv "$OUT/notebooks.log" "$OUT/notebooks_a.log"; mv "$OUT/notebooks.tgz" "$OUT/notebooks_a.tgz"
     llama2_w4 "$(left 490 60)" "$PADDED"
     llama2_bf16 "$(left 570 30)" ;;
  22) NOTEBOOKS="notebooks/05_awq.ipynb notebooks/06_perplexity.ipynb notebooks/07_kv_cache_ab.ipynb \
notebooks/08_quantized_inference.ipynb" PART_TIMEOUT=440 gpu notebooks
     mv "$OUT/notebooks" "$OUT/notebooks_b"; mv "$OUT/notebooks.log" "$OUT/notebooks_b.log"; mv "$OUT/notebooks.tgz" "$OUT/notebooks_b.tgz"
     bf16_8b "$(left 570 30)" ;;
  23) NOTEBOOKS="notebooks/09_clinic.ipynb notebooks/10_multi_gpu.ipynb" PART_TIMEOUT=260 gpu notebooks
     mv "$OUT/notebooks" "$OUT/notebooks_c"; mv "$OUT/notebooks.log" "$OUT/notebooks_c.log"; mv "$OUT/notebooks.tgz" "$OUT/notebooks_c.tgz"
     w4_8b "$(left 570 30)" ;;
  24) NOTEBOOKS="notebooks/05_awq.ipynb notebooks/06_perplexity.ipynb notebooks/07_kv_cache_ab.ipynb \
notebooks/08_quantized_inference.ipynb notebooks/09_clinic.ipynb notebooks/10_multi_gpu.ipynb" COURSE_GPU_GIB=15 \
       PART_TIMEOUT=580 gpu notebooks ;;
  33) TESTS="tests/test_x_side.py tests/test_decode_bench.py" PART_TIMEOUT=150 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_fused_prep.txt"
     FUSED='[{"PREPARED":true},{"PREPARED":true,"FUSED_PREP":true}]'
     DECODE_FORMATS="W4A16 ours,W4A16 tinygemm" DECODE_ARGS="--batches 1 --eager= --compile 1 --recipes fused+head+attn \
--family $FUSED --profile compiled" PART_TIMEOUT=$(left 340 60) gpu decode; keep_decode decode_8B_fused
     DECODE_FORMATS="bf16" DECODE_ARGS="--batches 1 --eager= --compile 1 --recipes fused+attn" PART_TIMEOUT=$(left 420 30) \
       gpu decode; keep_decode decode_8B_bf16
     DECODE_FORMATS="W4A16 ours" DECODE_ARGS="--arch Qwen2.5-1.5B --batches 1 --eager= --compile 1 --recipes head+attn \
--family $FUSED" PART_TIMEOUT=$(left 530 30) gpu decode; keep_decode decode_qwen_fused
     DECODE_FORMATS="bf16" DECODE_ARGS="--arch Qwen2.5-1.5B --batches 1 --eager= --compile 1 --recipes attn" \
       PART_TIMEOUT=$(left 585 20) gpu decode; keep_decode decode_qwen_bf16 ;;
  34) TESTS="tests/test_x_side.py" PART_TIMEOUT=90 gpu pytest   # installs the wheels into /tmp/site first
     timeout $(left 240 30) env PYTHONPATH="/tmp/site:$PWD" python3 -m benchmarks.prep_fusion --out "$OUT/prep_fusion.json" \
       2>&1 | grep -v -E "Warning|warn" | tail -12
     NOTEBOOKS="notebooks/08_quantized_inference.ipynb notebooks/09_clinic.ipynb" COURSE_GPU_GIB=15 \
       PART_TIMEOUT=$(left "${CALL_BUDGET:-380}" 20) gpu notebooks ;;
  35) NCU_CASES="8B gate/up 4096x14336:128:1;8B down 14336x4096:128:1;14B-class 5120x13824:128:1" PART_TIMEOUT=420 gpu ncu ;;
  36) prepared_round pdl "tests/test_x_side.py tests/test_w4_kernel.py::test_programmatic_dependent_launch_changes_no_output \
tests/test_w4_kernel.py::test_pdl_prepared_calls_back_to_back_share_their_buffers_safely" 120 260 PDL ;;
  37) PDLS='[{"PREPARED":true},{"PREPARED":true,"PDL":true}]'
     DECODE_FORMATS="W4A16 ours" DECODE_ARGS="--arch Llama-2-7B --batches 1 --eager= --compile 1 --recipes fused+head+attn \
--family $PDLS" PART_TIMEOUT=$(left 330 60) gpu decode; keep_decode decode_Llama-2-7B_pdl
     DECODE_FORMATS="W4A16 ours" DECODE_ARGS="--arch Qwen2.5-1.5B --batches 1 --eager= --compile 1 --recipes head+attn \
--family $PDLS" PART_TIMEOUT=$(left 585 30) gpu decode; keep_decode decode_qwen_pdl ;;
  25) bf16_8b "200"
     w4_8b "$(left 585 30)" ;;
  26) TESTS="tests/test_x_side.py tests/test_decode_bench.py" PART_TIMEOUT=150 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_padded.txt"
     llama2_w4 "$(left "${CALL_BUDGET:-420}" 30)" '[{"PREPARED":true,"PAD":true},{"PREPARED":true},{"PREPARED":false}]' ;;
  27) NOTEBOOKS="notebooks/05_awq.ipynb notebooks/06_perplexity.ipynb notebooks/07_kv_cache_ab.ipynb" \
       PART_TIMEOUT=570 gpu notebooks ;;
  28) bf16_8b "200"
     w4_8b "$(left 400 60)"
     NOTEBOOKS="notebooks/09_clinic.ipynb" PART_TIMEOUT=$(left 585 30) gpu notebooks ;;
  29) TESTS="tests/test_w4_kernel.py tests/test_x_side.py tests/test_decode_bench.py tests/test_decode_attention.py \
tests/test_kernel_once.py" PART_TIMEOUT=300 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_kernels.txt"
     NOTEBOOKS="notebooks/08_quantized_inference.ipynb" PART_TIMEOUT=$(left 585 30) gpu notebooks ;;
  30) bf16_8b "150"
     w4_8b "$(left 330 60)"
     TESTS="tests/test_w4_kernel.py tests/test_x_side.py tests/test_decode_bench.py tests/test_decode_attention.py \
tests/test_kernel_once.py" PART_TIMEOUT=$(left 585 30) gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_kernels.txt" ;;
  31) NOTEBOOKS="notebooks/08_quantized_inference.ipynb notebooks/09_clinic.ipynb notebooks/07_kv_cache_ab.ipynb" \
       PART_TIMEOUT=580 gpu notebooks ;;
  32) NOTEBOOKS="notebooks/05_awq.ipynb notebooks/06_perplexity.ipynb" PART_TIMEOUT=400 gpu notebooks
     PART_TIMEOUT=$(left 585 30) gpu suite ;;
  38) TESTS="tests/test_w4_kernel.py tests/test_stream_read.py tests/test_decode_bench.py tests/test_decode_attention.py \
tests/test_kernel_once.py" PART_TIMEOUT=300 gpu pytest
     mv "$OUT/pytest_part.txt" "$OUT/pytest_kernels.txt"
     NOTEBOOKS="notebooks/10_multi_gpu.ipynb notebooks/07_kv_cache_ab.ipynb" COURSE_GPU_GIB=15 \
       PART_TIMEOUT=$(left "${CALL_BUDGET:-585}" 30) gpu notebooks ;;
  39) prepared_round subnormal "tests/test_w4_kernel.py tests/test_x_side.py" 200 330 SUBNORMAL ;;
  40) SUBS='[{"PREPARED":true},{"PREPARED":true,"SUBNORMAL":true}]'
     DECODE_FORMATS="W4A16 ours" DECODE_ARGS="--arch Llama-2-7B --batches 1 --eager= --compile 1 --recipes fused+head+attn \
--family $SUBS" PART_TIMEOUT=$(left 250 60) gpu decode; keep_decode decode_Llama-2-7B_subnormal
     DECODE_FORMATS="W4A16 ours" DECODE_ARGS="--arch Qwen2.5-1.5B --batches 1 --eager= --compile 1 --recipes head+attn \
--family [{\"PREPARED\":true},{\"PREPARED\":true,\"PDL\":true},{\"PREPARED\":true,\"SUBNORMAL\":true}]" \
       PART_TIMEOUT=$(left 450 60) gpu decode; keep_decode decode_qwen_w4
     DECODE_FORMATS="bf16" DECODE_ARGS="--arch Qwen2.5-1.5B --batches 1 --eager= --compile 1 --recipes attn" \
       PART_TIMEOUT=$(left "${CALL_BUDGET:-585}" 20) gpu decode; keep_decode decode_qwen_bf16 ;;
  41) NOTEBOOKS="notebooks/06_perplexity.ipynb" COURSE_GPU_GIB=15 PART_TIMEOUT=$(left "${CALL_BUDGET:-585}" 30) gpu notebooks ;;
  42) SUBCASES="7B-class 3584x18944:128:1;14B-class 5120x13824:64:1;8B down 14336x4096:128:1;3584x28672:128:1;\
8B gate|up joined 4096x28672:128:1;8B gate|up joined 4096x28672:64:1"   # the first three first: a short budget
     NCU_CASES="$SUBCASES" PART_TIMEOUT=$(( (${CALL_BUDGET:-585} - 45) / 2 )) gpu ncu
     mv "$OUT/ncu.txt" "$OUT/ncu_centred_${COURSE_COMMIT:-unknown}.txt"
     NCU_CASES="$SUBCASES" NCU_FAMILY='{"PREPARED":true,"SUBNORMAL":true}' PART_TIMEOUT=$(left $(( ${CALL_BUDGET:-585} - 45 )) 30) gpu ncu
     mv "$OUT/ncu.txt" "$OUT/ncu_subnormal_${COURSE_COMMIT:-unknown}.txt"
     [ "$(left "${CALL_BUDGET:-585}")" -ge 150 ] && qwen_pdl_first "$(left "${CALL_BUDGET:-585}" 30)" ;;
  *) echo "usage: COURSE_COMMIT=<hash> bash scripts/gpu_owed.sh 1|2|...|42 (see the header)"; exit 2 ;;
esac
echo "call ${1} done in $(( $(date +%s) - T0 )) s"
