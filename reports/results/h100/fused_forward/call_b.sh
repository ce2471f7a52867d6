#!/usr/bin/env bash
# Device call B of the fused forward: racecheck's hazard report on the fused test, and the
# phase clock of a profiling build (-DGDN_CHUNKED_PHASE_CLOCK=ON) beside the default rows.
# Carries .carry/fused_b.tar.xz: cuda_gpu_tests (Release) and cuda_chunked_bench_prof.
#   bash reports/results/h100/fused_forward/call_b.sh COMMIT
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/bin
tar -C /tmp/bin -xJf .carry/fused_b.tar.xz
export LD_LIBRARY_PATH=/tmp/bin:${LD_LIBRARY_PATH:-}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%Y-%m-%dT%H:%M:%SZ; echo "commit $1"; } > "$OUT/device.txt"
timeout 150 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 40 \
  /tmp/bin/cuda_gpu_tests "[transposed]" > "$OUT/racecheck.log" 2>&1
echo "racecheck exit $?" >> "$OUT/racecheck.log"
timeout 150 /tmp/bin/cuda_chunked_bench_prof --benchmark_filter='BM_chunked_(default|single|fused|single_fused)/shape:[05]/' \
  --benchmark_out="$OUT/bench_prof.json" --benchmark_out_format=json > "$OUT/bench_prof.txt" 2>&1
grep -E "fused_clock|phase_clock" "$OUT/bench_prof.txt"
grep -E "^BM_" "$OUT/bench_prof.txt" | awk '{print $1, $2, $3}'
grep -E "SUMMARY|exit" "$OUT/racecheck.log"
grep -m 12 -E "Error|Write|Read|at 0x|in /" "$OUT/racecheck.log" | head -40
