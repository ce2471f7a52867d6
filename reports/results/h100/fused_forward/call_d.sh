#!/usr/bin/env bash
# Device call D of the fused forward, the short form of call C (the device budget left): the
# fused test ([transposed]: fused, two-pass and BV 64 bit for bit), racecheck on it, then
# 4 x 8192 alone on the GPU: the default and fused rows and the profiling builds' phase clock.
# Carries .carry/fused_c.tar.xz (as call C).
#   bash reports/results/h100/fused_forward/call_d.sh COMMIT
set -uo pipefail
COMMIT=${1:?commit}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/bin
tar -C /tmp/bin -xJf .carry/fused_c.tar.xz
export LD_LIBRARY_PATH=/tmp/bin:${LD_LIBRARY_PATH:-}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%Y-%m-%dT%H:%M:%SZ; echo "commit $COMMIT"; } > "$OUT/device.txt"
{
  echo "== [transposed]"; timeout 40 /tmp/bin/cuda_gpu_tests "[transposed]" 2>&1 | tail -2
  echo "== racecheck"; timeout 70 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 10 \
    /tmp/bin/cuda_gpu_tests "[transposed]" > /tmp/race.log 2>&1; echo "exit $?"
  grep -E "SUMMARY" /tmp/race.log; grep -m 4 -E "hazard detected|Thread" /tmp/race.log | cut -c 1-220
} > "$OUT/suite_sanitize.log" 2>&1
timeout 40 /tmp/bin/cuda_chunked_bench --benchmark_filter='BM_chunked_(default|single|fused|single_fused)/shape:0/' \
  --benchmark_out="$OUT/bench_chunked.json" --benchmark_out_format=json > "$OUT/bench.txt" 2>&1
for v in 224 208; do
  timeout 25 /tmp/bin/cuda_chunked_bench_prof$v --benchmark_filter='BM_chunked_fused/shape:0/' --no-stage-times \
    > /tmp/prof$v.txt 2>&1
  grep -E "fused_clock|^BM_" /tmp/prof$v.txt | sed "s/^/prof$v /" | cut -c 1-400 >> "$OUT/phase_clock.txt"
done
cat "$OUT/suite_sanitize.log"
grep -E "^BM_" "$OUT/bench.txt" | awk '{print $1, $2, $3}'
cat "$OUT/phase_clock.txt"
