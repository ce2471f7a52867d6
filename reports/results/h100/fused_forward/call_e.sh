#!/usr/bin/env bash
# Device call E: lean records (the prepass writes no P; the transposed output pass forms it).
# The GPU tests of the chunked prefill (the fused test: fused, two-pass with lean records and
# BV 64 with full records, bit for bit; invariance; conformance), memcheck and racecheck on the
# fused test, then speed, each alone on the GPU: this commit's default, single and fused rows,
# the same rows from the build before lean records (commit ab90c92's benchmark,
# cuda_chunked_bench_before in the same archive) and, with PEERS=1, FlashQLA 0.1.3 through fla
# 0.6's frontend (kernel names in its breakdown), warmed up in the background while the tests run;
# then the CLI fuzz of every chunked mode (scripts/gpu_run.sh --phases fuzz) for the seconds the
# call has left.
# Brings back at most 6 files: suite_sanitize.log (device, tests, sanitizers, warm-up), the three
# benchmark JSONs, and the fuzz phase's run.log and results archive.
# Carries .carry/call_e.tar.xz (cuda_gpu_tests, cuda_chunked_bench, cuda_chunked_bench_before,
# gdn-testbed, libbenchmark: one xz stream, as scripts/pack.sh makes them) and, for PEERS=1,
# .carry-py/site.tar.xz (python/gpu/pack_site.sh).
#   bash reports/results/h100/fused_forward/call_e.sh COMMIT
set -uo pipefail
COMMIT=${1:?commit}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/bin /tmp/site /tmp/tl_cache /tmp/triton_cache
tar -C /tmp/bin -xJf .carry/call_e.tar.xz
PEERS=${PEERS:-0}
[ "$PEERS" = 1 ] && tar -C /tmp/site -xJf .carry-py/site.tar.xz
export TILELANG_CACHE_DIR=/tmp/tl_cache TRITON_CACHE_DIR=/tmp/triton_cache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%Y-%m-%dT%H:%M:%SZ; echo "commit $COMMIT"; } > /tmp/device.txt
WARM=""
if [ "$PEERS" = 1 ]; then
  (PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 220 python3 cuda/peers/fla_chunk.py --warmup > /tmp/warm.log 2>&1) &
  WARM=$!
fi
{
  cat /tmp/device.txt
  echo "== [transposed]"; timeout 60 /tmp/bin/cuda_gpu_tests "[transposed]" 2>&1 | tail -3
  echo "== [chunked][invariance] 60"; timeout 70 /tmp/bin/cuda_gpu_tests --cases 60 "[chunked][invariance]" 2>&1 | tail -3
  echo "== [chunked][conformance] 100"; timeout 70 /tmp/bin/cuda_gpu_tests --cases 100 "[chunked][conformance]" 2>&1 | tail -3
  echo "== memcheck"; timeout 60 compute-sanitizer --tool memcheck /tmp/bin/cuda_gpu_tests "[transposed]" 2>&1 | tail -2
  echo "== racecheck"; timeout 80 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 20 \
    /tmp/bin/cuda_gpu_tests "[transposed]" > /tmp/race.log 2>&1; echo "exit $?"
  grep -E "SUMMARY" /tmp/race.log; grep -m 8 -E "hazard detected|Thread" /tmp/race.log | cut -c 1-220
} > "$OUT/suite_sanitize.log" 2>&1
[ -n "$WARM" ] && { wait $WARM; { echo "== warm-up"; tail -2 /tmp/warm.log; } >> "$OUT/suite_sanitize.log"; }
FILTER='BM_chunked_(default|single|fused)/'
LD_LIBRARY_PATH=/tmp/bin timeout 80 /tmp/bin/cuda_chunked_bench --benchmark_filter="$FILTER" \
  --benchmark_out="$OUT/bench_chunked.json" --benchmark_out_format=json > /tmp/bench.txt 2>&1
LD_LIBRARY_PATH=/tmp/bin timeout 80 /tmp/bin/cuda_chunked_bench_before --benchmark_filter="$FILTER" \
  --benchmark_out="$OUT/bench_chunked_before.json" --benchmark_out_format=json > /tmp/bench_before.txt 2>&1
[ "$PEERS" = 1 ] && PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 100 python3 cuda/peers/fla_chunk.py --breakdown \
  --out "$OUT/peer_flash_qla_chunk.json" --commit "$COMMIT" > /tmp/peer.txt 2>&1
# The CLI fuzz of every chunked mode (gpu_run.sh's fuzz phase) until DEADLINE seconds into the call.
FUZZ=$((${DEADLINE:-545} - SECONDS))
[ "$FUZZ" -ge 60 ] && bash scripts/gpu_run.sh --bin /tmp/bin --phases fuzz --fuzz-seconds "$FUZZ" --commit "$COMMIT" \
  --out "$OUT" > /tmp/fuzz.log 2>&1
cat "$OUT/suite_sanitize.log"
grep -E "merge exit|failures|cases" "$OUT/run.log" | head -20
echo "== after"; grep -E "^BM_" /tmp/bench.txt | awk '{print $1, $2, $3}'
echo "== before"; grep -E "^BM_" /tmp/bench_before.txt | awk '{print $1, $2, $3}'
[ "$PEERS" = 1 ] && { echo "== FlashQLA"; grep -E '"ms"' /tmp/peer.txt | cut -c 1-120; }
