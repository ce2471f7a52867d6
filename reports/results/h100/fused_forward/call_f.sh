#!/usr/bin/env bash
# Device call F: P hi + lo for bf16 (the record's P lo tile, one more wgmma per k step of P Vnew).
#   1. the fused test (fused, two-pass and BV 64, bit for bit: the transposed instance's new
#      P lo product against chunked_forward_wg's);
#   2. speed, each alone on the GPU: the default and single rows of this commit and of ab90c92
#      (P once for bf16; the same kernels otherwise), cuda_chunked_bench_before in the archive;
#   3. the split1 failure of call E replayed on its case file, with the split and without;
#   4. the CLI fuzz of every chunked mode (scripts/gpu_run.sh --phases fuzz, a new seed) until
#      DEADLINE seconds into the call, and beside it the GPU suite at 1000 cases in the chunked
#      modes and the four sanitizers (--phases suite,sanitize --only chunked,single; its
#      [transposed] filter covers the fused schedule).
# Brings back call.log, the two benchmark JSONs, and each gpu_run.sh's run.log and results archive.
# Call G (a second argument `fuzz`): only a second CLI fuzz of every chunked mode, with a new seed,
# alone on the GPU, so that with call F's the fuzz of each mode adds up to more than ten minutes;
# it brings back call.log and the fuzz phase's run.log and results archive.
# Carries .carry/call_f.tar.xz (cuda_gpu_tests, cuda_chunked_bench, cuda_chunked_bench_before,
# gdn-testbed, libbenchmark: one xz stream).
# Built from main at 9f03f4a or later (P lo for bf16); calls F and G ran at 9f03f4a (call_f/README.md).
#   DEADLINE=540 bash reports/results/h100/fused_forward/call_f.sh COMMIT [fuzz]
set -uo pipefail
COMMIT=${1:?commit}
OUT=${OUT:-/tmp/out}
DEADLINE=${DEADLINE:-560}
mkdir -p "$OUT" /tmp/bin
tar -C /tmp/bin -xJf .carry/call_f.tar.xz
LOG=$OUT/call.log
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%Y-%m-%dT%H:%M:%SZ; echo "commit $COMMIT"; } > "$LOG"
if [ "${2:-}" = fuzz ]; then
  bash scripts/gpu_run.sh --bin /tmp/bin --phases fuzz --seed 20261211 --fuzz-seconds $((DEADLINE - SECONDS - 100)) \
    --commit "$COMMIT" --out "$OUT/fuzz" > /tmp/fuzz.log 2>&1
  echo "fuzz exit $? at ${SECONDS}s" >> "$LOG"
  { echo "== fuzz"; grep -E "merge exit|failures|cases|pass" "$OUT/fuzz/run.log" | head -20; } >> "$LOG" 2>&1
  cat "$LOG"
  exit 0
fi
{ echo "== [transposed]"; timeout 60 /tmp/bin/cuda_gpu_tests "[transposed]" 2>&1 | tail -3; } >> "$LOG"

FILTER='BM_chunked_(default|single)/'
LD_LIBRARY_PATH=/tmp/bin timeout 150 /tmp/bin/cuda_chunked_bench --benchmark_filter="$FILTER" \
  --benchmark_out="$OUT/bench_chunked.json" --benchmark_out_format=json > /tmp/bench.txt 2>&1
LD_LIBRARY_PATH=/tmp/bin timeout 150 /tmp/bin/cuda_chunked_bench_before --benchmark_filter="$FILTER" \
  --benchmark_out="$OUT/bench_chunked_before.json" --benchmark_out_format=json > /tmp/bench_before.txt 2>&1
{ echo "== after"; grep -E "^BM_" /tmp/bench.txt | awk '{print $1, $2, $3}'
  echo "== before (ab90c92)"; grep -E "^BM_" /tmp/bench_before.txt | awk '{print $1, $2, $3}'; } >> "$LOG"

CASE=reports/results/h100/fuzz_chunked/third_call/failures/cuda.chunked_prefill.split1-d7fd9fe548570548.safetensors
{ for impl in cuda.chunked_prefill.split1 cuda.chunked_prefill cuda.chunked_prefill.single; do
    echo "== replay $impl"; timeout 30 /tmp/bin/gdn-testbed replay --impl $impl "$CASE" 2>&1 | head -4
  done; } >> "$LOG"

# The fuzz beside the suite and the sanitizers (correctness runs: they share the GPU).
FUZZ=$((DEADLINE - SECONDS - 100))
FUZZ_PID=""
if [ "$FUZZ" -ge 60 ]; then
  bash scripts/gpu_run.sh --bin /tmp/bin --phases fuzz --seed 20261210 --fuzz-seconds "$FUZZ" --commit "$COMMIT" \
    --out "$OUT/fuzz" > /tmp/fuzz.log 2>&1 &
  FUZZ_PID=$!
fi
# Bounded so that the call returns what finished (gpu_run.sh packs its archive after each phase).
timeout $((DEADLINE + 20 - SECONDS)) bash scripts/gpu_run.sh --bin /tmp/bin --phases suite,sanitize --only chunked,single \
  --cases 1000 --sanitize-cases 4 --seed 20261202 --commit "$COMMIT" --out "$OUT/suite" > /tmp/suite.log 2>&1
echo "suite,sanitize exit $? at ${SECONDS}s" >> "$LOG"
[ -n "$FUZZ_PID" ] && wait "$FUZZ_PID"
echo "fuzz done at ${SECONDS}s" >> "$LOG"
{ echo "== suite"; grep -E "exit|Passed|failed|hazard|errors" "$OUT/suite/run.log" | head -40
  echo "== fuzz"; grep -E "merge exit|failures|cases|pass" "$OUT/fuzz/run.log" | head -20; } >> "$LOG" 2>&1
cat "$LOG"
