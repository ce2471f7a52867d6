#!/usr/bin/env bash
# One GPU session's check of the streamed decode path, from the repository root on the device
# machine, with binaries prebuilt in .carry-decode/ (cuda_gpu_tests, cuda_bench_decode,
# libbenchmark.so.1debian): the full GPU conformance suite (GDN_CASES cases), compute-sanitizer
# memcheck/racecheck/initcheck on GDN_SANITIZE_CASES cases (in parallel with it), then the decode
# benchmark alone on the GPU (streamed and general kernels). Everything lands in $OUT.
set -u -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BIN=.carry-decode
CASES=${GDN_CASES:-1000}
SAN_CASES=${GDN_SANITIZE_CASES:-4}
export GDN_COMMIT=${GDN_COMMIT:-unknown}
LOG=$OUT/run.log
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
DEVICE=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
log "device: $DEVICE; commit $GDN_COMMIT; cases $CASES"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
export GDN_COMMAND="GDN_CASES=$CASES GDN_CONFORMANCE_JSON=conformance.json $BIN/cuda_gpu_tests (cuda/run_decode_h200.sh)"
( GDN_CASES=$CASES GDN_CONFORMANCE_JSON=$OUT/conformance.json timeout 200 "$BIN/cuda_gpu_tests" -r compact \
    > "$OUT/conformance.log" 2>&1; echo "conformance exit $?" >> "$OUT/conformance.log" ) &
for tool in memcheck racecheck initcheck; do
  ( GDN_CASES=$SAN_CASES timeout 200 "$CS" --tool $tool --error-exitcode 9 "$BIN/cuda_gpu_tests" -r compact \
      > "$OUT/san_$tool.log" 2>&1; echo "$tool exit $?" >> "$OUT/san_$tool.log" ) &
done
wait
tail -5 "$OUT/conformance.log" | tee -a "$LOG"
for tool in memcheck racecheck initcheck; do
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|exit|Invalid|Uninitialized|hazard" "$OUT/san_$tool.log" | head -12 | tee -a "$LOG"
done
export GDN_DEVICE="$DEVICE"
log "decode benchmark"
GDN_COMMAND="$BIN/cuda_bench_decode --benchmark_out=decode.json --benchmark_out_format=json (cuda/run_decode_h200.sh)" \
  timeout 150 "$BIN/cuda_bench_decode" --benchmark_out="$OUT/decode.json" --benchmark_out_format=json \
  --benchmark_counters_tabular=true > "$OUT/bench.log" 2>&1
echo "bench exit $?" >> "$OUT/bench.log"
grep -E "BM_|exit" "$OUT/bench.log" | sed -E 's/ +/ /g' | tee -a "$LOG" | tail -40
log "decode benchmark, streamed kernel with the L2 evict-first hint (GDN_STREAM_L2_HINT=1)"
GDN_STREAM_L2_HINT=1 GDN_COMMAND="GDN_STREAM_L2_HINT=1 $BIN/cuda_bench_decode --benchmark_filter=... (cuda/run_decode_h200.sh)" \
  timeout 60 "$BIN/cuda_bench_decode" --benchmark_filter='BM_copy|BM_decode/.*column_lanes:0/status:0/.*general:0' \
  --benchmark_out="$OUT/decode_l2_hint.json" --benchmark_out_format=json > "$OUT/bench_hint.log" 2>&1
grep -E "BM_" "$OUT/bench_hint.log" | sed -E 's/ +/ /g' | tee -a "$LOG"
log "done"
