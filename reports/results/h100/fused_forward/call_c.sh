#!/usr/bin/env bash
# Device call C of the fused forward (ChunkedSchedule::fused), after its synchronisation became
# full / ready / empty mbarriers with every thread arriving: the GPU tests of the chunked
# prefill (the fused test, invariance and conformance), memcheck and racecheck on the fused test,
# then speed, each alone on the GPU: the default (two-pass) and fused rows, two profiling builds
# of the fused forward's register split (224 / 56 and 208 / 88: the phase clock on stderr), and
# FlashQLA 0.1.3 through fla 0.6's frontend (kernel names in its breakdown) when PEERS=1.
# Carries .carry/fused_c.tar.xz (cuda_gpu_tests, cuda_chunked_bench, cuda_chunked_bench_prof224,
# cuda_chunked_bench_prof208, libbenchmark) and, for PEERS=1, .carry-py/site.tar.xz
# (python/gpu/pack_site.sh).
#   bash reports/results/h100/fused_forward/call_c.sh COMMIT
set -uo pipefail
COMMIT=${1:?commit}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/bin /tmp/site /tmp/tl_cache /tmp/triton_cache
tar -C /tmp/bin -xJf .carry/fused_c.tar.xz
PEERS=${PEERS:-0}
[ "$PEERS" = 1 ] && tar -C /tmp/site -xJf .carry-py/site.tar.xz
export LD_LIBRARY_PATH=/tmp/bin:${LD_LIBRARY_PATH:-}
export TILELANG_CACHE_DIR=/tmp/tl_cache TRITON_CACHE_DIR=/tmp/triton_cache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%Y-%m-%dT%H:%M:%SZ; echo "commit $COMMIT"; } > "$OUT/device.txt"
WARM=""
if [ "$PEERS" = 1 ]; then
  (PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 200 python3 cuda/peers/fla_chunk.py --warmup > /tmp/warm.log 2>&1) &
  WARM=$!
fi
{
  echo "== [transposed]"; timeout 60 /tmp/bin/cuda_gpu_tests "[transposed]" 2>&1 | tail -3
  echo "== [chunked][invariance] 50"; timeout 80 /tmp/bin/cuda_gpu_tests --cases 50 "[chunked][invariance]" 2>&1 | tail -3
  echo "== [chunked][conformance] 100"; timeout 80 /tmp/bin/cuda_gpu_tests --cases 100 "[chunked][conformance]" 2>&1 | tail -3
  echo "== memcheck"; timeout 60 compute-sanitizer --tool memcheck /tmp/bin/cuda_gpu_tests "[transposed]" 2>&1 | tail -2
  echo "== racecheck"; timeout 90 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 20 \
    /tmp/bin/cuda_gpu_tests "[transposed]" > /tmp/race.log 2>&1; echo "exit $?"
  grep -E "SUMMARY" /tmp/race.log; grep -m 8 -E "hazard detected|Thread" /tmp/race.log | cut -c 1-220
} > "$OUT/suite_sanitize.log" 2>&1
[ -n "$WARM" ] && { wait $WARM; tail -2 /tmp/warm.log > "$OUT/warm.log"; }
timeout 100 /tmp/bin/cuda_chunked_bench --benchmark_filter='BM_chunked_(default|single|fused|single_fused)/' \
  --benchmark_out="$OUT/bench_chunked.json" --benchmark_out_format=json > "$OUT/bench.txt" 2>&1
for v in 224 208; do
  timeout 40 /tmp/bin/cuda_chunked_bench_prof$v --benchmark_filter='BM_chunked_(fused|single_fused)/shape:0/' \
    --no-stage-times > /tmp/prof$v.txt 2>&1
  grep -E "fused_clock|^BM_" /tmp/prof$v.txt | sed "s/^/prof$v /" | cut -c 1-400 >> "$OUT/phase_clock.txt"
done
[ "$PEERS" = 1 ] && PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 110 python3 cuda/peers/fla_chunk.py --breakdown \
  --out "$OUT/peer_flash_qla_chunk.json" --commit "$COMMIT" > "$OUT/peer.txt" 2>&1
cat "$OUT/suite_sanitize.log"
grep -E "^BM_" "$OUT/bench.txt" | awk '{print $1, $2, $3}'
cat "$OUT/phase_clock.txt"
[ "$PEERS" = 1 ] && grep -E '"ms"' "$OUT/peer.txt" | cut -c 1-120
