#!/usr/bin/env bash
# One GPU session's run of the CUDA kernels, from the repository root on the device machine:
#   A: conformance suite (GDN_CASES random cases per kernel and property) and compute-sanitizer
#      memcheck / racecheck / initcheck on a small case count, side by side;
#   B: Google Benchmark decode and recurrent prefill (alone on the GPU);
#   C: the flash-linear-attention peer (fla-core wheel from .whl/).
# Binaries come prebuilt in .carry/ or packed in .carry-rec/rec.tar.xz (cuda_gpu_tests, cuda_bench_decode, cuda_bench_recurrent,
# libbenchmark.so.1debian beside them). Everything lands in $OUT: conformance.json, decode.json,
# recurrent.json, fla_recurrent.json, run.log, sanitize.log.
# Environment: GDN_COMMIT (what was built), GDN_CASES (default 1000), GDN_SANITIZE_CASES (6),
# GDN_PHASES (default "ABC").
set -u -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BIN=.carry
# xz-packed binaries (cuda/pack_recurrent.sh), unpacked into .carry/ when present.
if [ -f .carry-rec/rec.tar.xz ]; then mkdir -p "$BIN" && tar -C "$BIN" -xJf .carry-rec/rec.tar.xz; fi
CASES=${GDN_CASES:-1000}
SAN_CASES=${GDN_SANITIZE_CASES:-6}
PHASES=${GDN_PHASES:-ABC}
export GDN_COMMIT=${GDN_COMMIT:-unknown}
LOG=$OUT/run.log
SAN=$OUT/sanitize.log
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
DEVICE=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
log "device: $DEVICE; commit $GDN_COMMIT; cases $CASES"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if command -v cuobjdump >/dev/null; then
  cuobjdump --list-elf "$BIN/cuda_gpu_tests" 2>&1 | sort | uniq -c | head -5 | tee -a "$LOG"
  cuobjdump --dump-sass "$BIN/cuda_gpu_tests" 2>/dev/null | grep -m3 -E "arch = |LDG.E.128|STG.E.128" | tee -a "$LOG"
fi

if [[ $PHASES == *A* ]]; then
  log "A: conformance ($CASES cases) + sanitizers ($SAN_CASES cases) in parallel"
  export GDN_COMMAND="GDN_CASES=$CASES GDN_CONFORMANCE_JSON=conformance.json $BIN/cuda_gpu_tests (cuda/run_h200.sh)"
  ( GDN_CASES=$CASES GDN_CONFORMANCE_JSON=$OUT/conformance.json timeout 300 "$BIN/cuda_gpu_tests" -r compact \
      > "$OUT/conformance.log" 2>&1; echo "conformance exit $?" >> "$OUT/conformance.log" ) &
  conf=$!
  for tool in memcheck racecheck initcheck; do
    ( GDN_CASES=$SAN_CASES timeout 300 "$CS" --tool $tool --error-exitcode 9 "$BIN/cuda_gpu_tests" -r compact \
        > "$OUT/san_$tool.log" 2>&1; echo "$tool exit $?" >> "$OUT/san_$tool.log" ) &
  done
  wait
  tail -25 "$OUT/conformance.log" | tee -a "$LOG"
  for tool in memcheck racecheck initcheck; do
    { echo "---- $tool"; grep -E "ERROR SUMMARY|exit|passed|failed|Invalid|Uninitialized|hazard" "$OUT/san_$tool.log" | head -30; } | tee -a "$SAN" "$LOG" >/dev/null
    { echo "---- $tool full log (tail)"; tail -60 "$OUT/san_$tool.log"; } >> "$SAN"
    rm -f "$OUT/san_$tool.log"
  done
  cat "$SAN" | grep -E "^----|SUMMARY|exit" | grep -v "full log"
  # Failures (if any) are in the conformance log: keep its head in run.log.
  grep -B2 -A25 -m4 "FAILED\|failed" "$OUT/conformance.log" | head -150 >> "$LOG"
  rm -f "$OUT/conformance.log"
fi

if [[ $PHASES == *B* ]]; then
  export GDN_DEVICE="$DEVICE"
  log "B: decode benchmark"
  GDN_COMMAND=".carry/cuda_bench_decode --benchmark_out=decode.json --benchmark_out_format=json (cuda/run_h200.sh)" timeout 280 "$BIN/cuda_bench_decode" --benchmark_out="$OUT/decode.json" --benchmark_out_format=json \
    --benchmark_counters_tabular=true 2>&1 | tee -a "$LOG"
  log "B: recurrent prefill benchmark"
  GDN_COMMAND=".carry/cuda_bench_recurrent --benchmark_out=recurrent.json --benchmark_out_format=json (cuda/run_h200.sh)" timeout 150 "$BIN/cuda_bench_recurrent" --benchmark_out="$OUT/recurrent.json" --benchmark_out_format=json \
    --benchmark_counters_tabular=true 2>&1 | tee -a "$LOG"
fi

if [[ $PHASES == *C* ]]; then
  log "C: fla peer"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    2>&1 | tail -2 | tee -a "$LOG"
  GDN_COMMAND="python3 cuda/peers/fla_recurrent.py (cuda/run_h200.sh)" PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
    timeout 200 python3 cuda/peers/fla_recurrent.py 2>&1 | grep -v Warning | tee -a "$LOG"
fi
log "done"
