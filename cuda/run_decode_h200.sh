#!/usr/bin/env bash
# One GPU call comparing the streamed decode kernel's write-back modes (GDN_STREAM_WRITE_BACK =
# direct | staged | bulk, detail::StreamWriteBack; same bits in every mode), from the repository
# root on the device machine. Binaries: .carry-rec/rec.tar.xz (cuda/pack_recurrent.sh).
#   1. the GPU conformance suite (GDN_CASES cases) under each non-default mode, with
#      compute-sanitizer memcheck / racecheck / initcheck (GDN_SANITIZE_CASES cases) beside it;
#   2. the decode benchmark (streamed kernel, default tile) alone on the GPU, every mode twice,
#      interleaved (direct, staged, bulk, direct, staged, bulk), so the run-to-run spread shows.
# Everything lands in $OUT: conformance_<mode>.json, decode_<mode>_<round>.json, run.log.
# Environment: GDN_COMMIT, GDN_CASES (default 1000), GDN_SANITIZE_CASES (4), GDN_MODES
# (default "staged bulk": the modes whose conformance runs).
set -u -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BIN=.carry
mkdir -p "$BIN" && tar -C "$BIN" -xJf .carry-rec/rec.tar.xz || exit 3
CASES=${GDN_CASES:-1000}
SAN_CASES=${GDN_SANITIZE_CASES:-4}
MODES=${GDN_MODES:-staged bulk}
export GDN_COMMIT=${GDN_COMMIT:-unknown}
LOG=$OUT/run.log
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
DEVICE=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
export GDN_DEVICE="$DEVICE"
log "device: $DEVICE; commit $GDN_COMMIT; cases $CASES; modes $MODES"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

for mode in $MODES; do
  log "conformance ($CASES cases) + sanitizers ($SAN_CASES cases), GDN_STREAM_WRITE_BACK=$mode"
  export GDN_STREAM_WRITE_BACK=$mode
  export GDN_COMMAND="GDN_STREAM_WRITE_BACK=$mode GDN_CASES=$CASES GDN_CONFORMANCE_JSON=conformance_$mode.json $BIN/cuda_gpu_tests (cuda/run_decode_h200.sh)"
  ( GDN_CASES=$CASES GDN_CONFORMANCE_JSON=$OUT/conformance_$mode.json timeout 200 "$BIN/cuda_gpu_tests" -r compact \
      > "$OUT/conformance.log" 2>&1; echo "conformance exit $?" >> "$OUT/conformance.log" ) &
  for tool in memcheck racecheck initcheck; do
    ( GDN_CASES=$SAN_CASES timeout 200 "$CS" --tool $tool --error-exitcode 9 "$BIN/cuda_gpu_tests" -r compact \
        > "$OUT/san_$tool.log" 2>&1; echo "$tool exit $?" >> "$OUT/san_$tool.log" ) &
  done
  wait
  tail -4 "$OUT/conformance.log" | tee -a "$LOG"
  grep -B2 -A25 -m3 "FAILED" "$OUT/conformance.log" | head -90 >> "$LOG"
  for tool in memcheck racecheck initcheck; do
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|exit|Invalid|Uninitialized|hazard" "$OUT/san_$tool.log" | head -12 | tee -a "$LOG"
  done
  rm -f "$OUT"/conformance.log "$OUT"/san_*.log
  unset GDN_STREAM_WRITE_BACK
done

for round in 1 2; do
  for mode in direct staged bulk; do
    log "decode benchmark, GDN_STREAM_WRITE_BACK=$mode, round $round"
    GDN_STREAM_WRITE_BACK=$mode \
      GDN_COMMAND="GDN_STREAM_WRITE_BACK=$mode $BIN/cuda_bench_decode --benchmark_filter='BM_copy|BM_decode/.*column_lanes:0/status:0/.*general:0' (cuda/run_decode_h200.sh)" \
      timeout 60 "$BIN/cuda_bench_decode" --benchmark_filter='BM_copy|BM_decode/.*column_lanes:0/status:0/.*general:0' \
      --benchmark_out="$OUT/decode_${mode}_$round.json" --benchmark_out_format=json > "$OUT/bench.log" 2>&1
    echo "bench exit $?" >> "$OUT/bench.log"
    grep -E "BM_|exit" "$OUT/bench.log" | sed -E 's/ +/ /g' | tee -a "$LOG"
  done
done
rm -f "$OUT/bench.log"
log "done"
