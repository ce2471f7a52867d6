#!/usr/bin/env bash
# Device call A of the fused forward (ChunkedSchedule::fused): correctness first, then speed,
# each alone on the GPU. Carries .carry/chunked.tar.xz (scripts/pack.sh BUILD --chunked-only)
# and .carry-py/site.tar.xz (python/gpu/pack_site.sh: fla-core 0.6, flash-qla 0.1.3, TileLang).
#   bash reports/results/h100/fused_forward/call_a.sh COMMIT
# Writes under $OUT: suite.log, sanitize.log, bench_chunked.json, peer_flash_qla_chunk.json.
set -uo pipefail
COMMIT=${1:?commit}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/bin /tmp/site /tmp/tl_cache /tmp/triton_cache
tar -C /tmp/bin -xJf .carry/chunked.tar.xz
tar -C /tmp/site -xJf .carry-py/site.tar.xz
export LD_LIBRARY_PATH=/tmp/bin:${LD_LIBRARY_PATH:-}
export TILELANG_CACHE_DIR=/tmp/tl_cache TRITON_CACHE_DIR=/tmp/triton_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
date -u +%Y-%m-%dT%H:%M:%SZ >> "$OUT/device.txt"
# FlashQLA (through fla's frontend, which hands it bf16 K = V = 128 calls when flash_qla is
# importable) compiles in the background while the tests run; nothing is timed until it ends.
(PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 240 python3 cuda/peers/fla_chunk.py --warmup > /tmp/warm.log 2>&1) &
WARM=$!
{
  echo "== [transposed]"; timeout 90 /tmp/bin/cuda_gpu_tests "[transposed]" 2>&1 | tail -15
  echo "== [chunked][invariance] 100"; timeout 100 /tmp/bin/cuda_gpu_tests --cases 100 "[chunked][invariance]" 2>&1 | tail -8
  echo "== [chunked][conformance] 200"; timeout 100 /tmp/bin/cuda_gpu_tests --cases 200 "[chunked][conformance]" 2>&1 | tail -8
} > "$OUT/suite.log" 2>&1
{
  echo "== memcheck"; timeout 60 compute-sanitizer --tool memcheck /tmp/bin/cuda_gpu_tests "[transposed]" 2>&1 | tail -6
  echo "== racecheck"; timeout 60 compute-sanitizer --tool racecheck /tmp/bin/cuda_gpu_tests "[transposed]" 2>&1 | tail -6
} > "$OUT/sanitize.log" 2>&1
wait $WARM; tail -3 /tmp/warm.log > "$OUT/warm.log"
# The two-pass rows first (a fused kernel that hung would lose nothing measured before it).
timeout 100 /tmp/bin/cuda_chunked_bench --benchmark_filter='BM_chunked_(two_pass|single_two_pass)/' \
  --benchmark_out="$OUT/bench_chunked_two_pass.json" --benchmark_out_format=json > "$OUT/bench.txt" 2>&1
timeout 100 /tmp/bin/cuda_chunked_bench --benchmark_filter='BM_chunked_(default|single)/' \
  --benchmark_out="$OUT/bench_chunked.json" --benchmark_out_format=json >> "$OUT/bench.txt" 2>&1
PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 120 python3 cuda/peers/fla_chunk.py --breakdown \
  --out "$OUT/peer_flash_qla_chunk.json" --commit "$COMMIT" > "$OUT/peer.txt" 2>&1
tail -5 "$OUT/peer.txt"
grep -E "^BM_" "$OUT/bench.txt" | awk '{print $1, $2, $3}'
cat "$OUT/suite.log" | grep -E "test cases|assertions|FAILED|passed|failed" | head -20
cat "$OUT/sanitize.log" | grep -E "ERROR SUMMARY|==" 
