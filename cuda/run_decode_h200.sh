#!/usr/bin/env bash
# One GPU call comparing variants of the streamed decode kernel (same bits in every variant), from
# the repository root on the device machine. A variant is a comma-separated list of tuning
# switches, VAR=value,... (cuda/launch.cpp), e.g. GDN_STREAM_WRITE_BACK = streaming (default) |
# direct; it is named by its values joined by '_'. (The wide tile is a benchmark argument.)
# Binaries: .carry-rec/rec.tar.xz (cuda/pack_recurrent.sh).
#   1. the GPU conformance suite (GDN_CASES cases) under each variant of GDN_MODES, with
#      compute-sanitizer memcheck / racecheck / initcheck (GDN_SANITIZE_CASES cases) beside it;
#   2. the decode benchmark (streamed kernel, default tile) alone on the GPU, every variant of
#      GDN_BENCH_MODES twice, interleaved, so the run-to-run spread shows; then the probe
#      (BM_stream_probe: the same data movement without the math).
# Everything lands in $OUT: conformance_<variant>.json, decode_<variant>_<round>.json,
# probe.json, run.log.
# Environment: GDN_COMMIT, GDN_CASES (default 1000), GDN_SANITIZE_CASES (4), GDN_MODES (default
# none), GDN_BENCH_MODES (default: GDN_STREAM_WRITE_BACK=streaming GDN_STREAM_WRITE_BACK=direct).
set -u -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BIN=.carry
mkdir -p "$BIN" && tar -C "$BIN" -xJf .carry-rec/rec.tar.xz || exit 3
CASES=${GDN_CASES:-1000}
SAN_CASES=${GDN_SANITIZE_CASES:-4}
MODES=${GDN_MODES:-}
BENCH_MODES=${GDN_BENCH_MODES:-GDN_STREAM_WRITE_BACK=streaming GDN_STREAM_WRITE_BACK=direct}
# "A=x,B=y" -> name x_y, assignments "A=x B=y"
name_of() { echo "$1" | tr ',' '\n' | sed 's/^[^=]*=//' | paste -sd_; }
env_of() { echo "$1" | tr ',' ' '; }
export GDN_COMMIT=${GDN_COMMIT:-unknown}
LOG=$OUT/run.log
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
DEVICE=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
export GDN_DEVICE="$DEVICE"
log "device: $DEVICE; commit $GDN_COMMIT; cases $CASES; conformance variants: ${MODES:-none}"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

for variant in $MODES; do
  mode=$(name_of "$variant")
  assignments=$(env_of "$variant")
  export $assignments
  log "conformance ($CASES cases) + sanitizers ($SAN_CASES cases), $assignments"
  export GDN_COMMAND="$assignments GDN_CASES=$CASES GDN_CONFORMANCE_JSON=conformance_$mode.json $BIN/cuda_gpu_tests (cuda/run_decode_h200.sh)"
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
  for a in $assignments; do unset "${a%%=*}"; done
done

FILTER='BM_copy|BM_decode/.*column_lanes:0/status:0/.*general:0'
for round in 1 2; do
  for variant in $BENCH_MODES; do
    wb=$(name_of "$variant")
    assignments=$(env_of "$variant")
    log "decode benchmark, $assignments, round $round"
    env $assignments \
      GDN_COMMAND="$assignments $BIN/cuda_bench_decode --benchmark_filter='$FILTER' (cuda/run_decode_h200.sh)" \
      timeout 90 "$BIN/cuda_bench_decode" --benchmark_filter="$FILTER" \
      --benchmark_out="$OUT/decode_${wb}_$round.json" --benchmark_out_format=json > "$OUT/bench.log" 2>&1
    echo "bench exit $?" >> "$OUT/bench.log"
    grep -E "BM_decode/batch:(256|1024)|exit" "$OUT/bench.log" | sed -E 's/ +/ /g' | tee -a "$LOG"
  done
done
log "stream probe"
GDN_COMMAND="$BIN/cuda_bench_decode --benchmark_filter='BM_stream_probe|BM_copy' (cuda/run_decode_h200.sh)" \
  timeout 60 "$BIN/cuda_bench_decode" --benchmark_filter='BM_stream_probe|BM_copy' \
  --benchmark_out="$OUT/probe.json" --benchmark_out_format=json > "$OUT/bench.log" 2>&1
grep -E "BM_|exit" "$OUT/bench.log" | sed -E 's/ +/ /g' | tee -a "$LOG"
rm -f "$OUT/bench.log"
log "done"
