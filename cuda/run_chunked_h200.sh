#!/usr/bin/env bash
# One GPU call for the chunked prefill (issue 4), from the repository root on the device machine.
# Binaries come prebuilt and xz-packed in .carry-chunk/chunked.tar.xz (cuda_chunked_gpu_tests,
# cuda_chunked_bench, cuda_chunked_accuracy, libbenchmark.so.1debian): see cuda/pack_chunked.sh.
# Phases (GDN_PHASES, default "TSBPA"), each under its own timeout so the whole call ends in
# about 330 s:
#   T  GPU suite (GDN_CASES random cases) -> conformance_chunked.json, tests.log
#   S  compute-sanitizer memcheck, racecheck and initcheck on the trace, split, single-rounding, transposed BV 128
#      and invariance (two V tiles on two streams) tests -> sanitize.log
#   W  (background, during T and S) fla compiles and autotunes its kernels
#   B  Google Benchmark of the chunked kernel (alone on the GPU) -> prefill.json
#   P  fla chunk_gated_delta_rule on the same shapes (alone on the GPU) -> fla_chunk.json
#   A  accuracy against fla on the same inputs (case files, fla through reports/adapters) -> accuracy.json
# Environment: GDN_COMMIT, GDN_CASES (default 100), GDN_PHASES.
set -u -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
B=/tmp/chunked_bin
mkdir -p $B && tar -C $B -xJf .carry-chunk/chunked.tar.xz || exit 3
export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
CASES=${GDN_CASES:-100}
PHASES=${GDN_PHASES:-TSBPA}
export GDN_COMMIT=${GDN_COMMIT:-unknown}
LOG=$OUT/run.log
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
DEVICE=$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)
export GDN_DEVICE="$DEVICE"
log "device: $DEVICE; commit $GDN_COMMIT; cases $CASES; phases $PHASES"
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-sass $B/cuda_chunked_bench 2>/dev/null | grep -oE "HGMMA|HMMA\.16816\.F32(\.BF16)?|LDSM|LDGSTS" | sort | uniq -c | tee -a "$LOG"
fi

if [[ $PHASES == *P* || $PHASES == *A* ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >> "$LOG" 2>&1 && export PYTHONPATH=/tmp/site
  # W: fla's Triton kernels compile and autotune (over a minute) in the background while the
  # tests run; the timed peer run below then starts from the disk cache.
  log "W: fla warm-up in the background"
  ( FLA_WARMUP=1 PYTHONUNBUFFERED=1 timeout ${GDN_WARM_TIMEOUT:-120} python3 cuda/peers/fla_chunk.py > /tmp/fla_warm.log 2>&1 ) &
  WARM=$!
fi

if [[ $PHASES == *T* ]]; then
  log "T: GPU suite"
  GDN_COMMAND="GDN_CASES=$CASES $B/cuda_chunked_gpu_tests (cuda/run_chunked_h200.sh)" GDN_CASES=$CASES \
    GDN_CONFORMANCE_JSON=$OUT/conformance_chunked.json timeout ${GDN_TEST_TIMEOUT:-90} $B/cuda_chunked_gpu_tests \
    -r compact > "$OUT/tests.log" 2>&1
  echo "tests exit $?" | tee -a "$LOG"
  grep -E "passed|failed|FAILED|ok   |FAIL " "$OUT/tests.log" | head -60 | tee -a "$LOG"
fi

if [[ $PHASES == *S* ]]; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck initcheck; do
    log "S: $tool"
    GDN_CASES=2 timeout ${GDN_SAN_TIMEOUT:-35} "$CS" --tool $tool --error-exitcode 9 $B/cuda_chunked_gpu_tests \
      -r compact "[trace],[split],[transposed],[invariance],[single]" > /tmp/san_$tool.log 2>&1
    echo "$tool exit $?" >> /tmp/san_$tool.log
    { echo "---- $tool"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|exit|passed|failed|Invalid|hazard" /tmp/san_$tool.log | head -20;
      tail -30 /tmp/san_$tool.log; } >> "$OUT/sanitize.log"
    grep -E "SUMMARY|exit" /tmp/san_$tool.log | tee -a "$LOG"
  done
fi


if [[ -n ${WARM:-} ]]; then
  log "waiting for the fla warm-up"
  wait $WARM
  grep -E "warm:|Error|error" /tmp/fla_warm.log | tail -8 | tee -a "$LOG"
fi
if [[ $PHASES == *B* ]]; then
  log "B: chunked benchmark"
  GDN_COMMAND="$B/cuda_chunked_bench --benchmark_out=prefill.json --benchmark_out_format=json (cuda/run_chunked_h200.sh)" \
    timeout ${GDN_BENCH_TIMEOUT:-75} $B/cuda_chunked_bench --benchmark_out="$OUT/prefill.json" --benchmark_out_format=json \
    --benchmark_counters_tabular=true 2>&1 | grep -vE "^\s*$" | tee -a "$LOG"
fi

if [[ $PHASES == *P* ]]; then
  log "P: fla chunk peer"
  GDN_COMMAND="python3 cuda/peers/fla_chunk.py (cuda/run_chunked_h200.sh)" PYTHONUNBUFFERED=1 \
    timeout ${GDN_PEER_TIMEOUT:-70} python3 cuda/peers/fla_chunk.py 2>&1 | grep -vE "Warning|warn" | tail -12 | tee -a "$LOG"
fi

if [[ $PHASES == *A* ]]; then
  log "A: accuracy against fla on the same inputs"
  rm -rf /tmp/acc /tmp/acc_fla
  $B/cuda_chunked_accuracy cases /tmp/acc >> "$LOG" 2>&1
  timeout ${GDN_ACC_TIMEOUT:-60} python3 reports/adapters/gdn_adapter.py --impl fla.chunk --device cuda \
    --out-dir /tmp/acc_fla /tmp/acc 2>&1 | tail -6 | tee -a "$LOG"
  GDN_COMMAND="cuda_chunked_accuracy judge (cuda/run_chunked_h200.sh)" timeout 60 $B/cuda_chunked_accuracy judge \
    /tmp/acc /tmp/acc_fla "$OUT/accuracy.json" 2>&1 | tee -a "$LOG"
fi
log "done"
