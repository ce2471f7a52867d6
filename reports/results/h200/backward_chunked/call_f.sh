#!/usr/bin/env bash
# Call F (issue 31 item 6), one call:
#  1. beside each other: the chunked backward's GPU suite (conformance 4 x CASES/4 cases on four
#     seeds, bitwise at CASES/10), memcheck and racecheck on it, and the peers' compile warm-up;
#  2. then alone on the GPU, in turn: our chunked backward's benchmark, FlashQLA's backward.
set -o pipefail
export PYTHONUNBUFFERED=1
C=$1; CASES=${2:-1000}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
CMD="bash .carry/call_f.sh $C $CASES"
echo "$GPU $DRIVER $DATE"
mkdir -p /tmp/b /tmp/bsite && tar -C /tmp/b -xJf .carry/gpu.tar.xz || exit 3
B=/tmp/b; export LD_LIBRARY_PATH=$B
( tar -C /tmp/bsite -xJf .carry-py/site.tar.xz && tar -C /tmp -xJf .carry/tilelang_cache.tar.xz
  TILELANG_CACHE_DIR=/tmp/tlcache PYTHONPATH=/tmp/bsite timeout 200 python3 cuda/peers/backward_peers.py --backend flash_qla \
    --warmup
) > /tmp/warm.log 2>&1 &
WARM=$!
PIDS=()
for s in 2 3 4 5; do
  ( timeout 200 $B/cuda_gpu_tests --cases $((CASES / 4)) --seed 2026120$s --json /tmp/conf_$s.json --commit $C \
      --command "$CMD" -r compact "backward conformance - ChunkedBackward" > /tmp/conf_$s.log 2>&1
    echo "conformance seed 2026120$s exit $?" >> /tmp/conf_$s.log ) &
  PIDS+=($!)
done
( timeout 200 $B/cuda_gpu_tests --cases $((CASES / 2)) --seed 20261202 --json /tmp/bitwise.json --commit $C --command "$CMD" \
    -r compact "backward determinism and batch invariance - ChunkedBackward" > /tmp/bitwise.log 2>&1
  echo "bitwise exit $?" >> /tmp/bitwise.log ) &
PIDS+=($!)
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  extra=""; [ $tool = racecheck ] && extra="--racecheck-report hazard"
  ( timeout 150 $CS --tool $tool $extra --error-exitcode 9 $B/cuda_gpu_tests --cases 3 --seed 20261202 -r compact \
      "backward conformance - ChunkedBackward" > /tmp/san_$tool.log 2>&1
    echo "sanitize $tool exit $?" >> /tmp/san_$tool.log ) &
  PIDS+=($!)
done
wait "${PIDS[@]}"
for f in conf_2 conf_3 conf_4 conf_5 bitwise; do tail -12 /tmp/$f.log | cut -c1-900; done
for tool in memcheck racecheck; do grep -E "ERROR SUMMARY|RACECHECK SUMMARY|exit" /tmp/san_$tool.log | tail -3; done
for s in 2 3 4 5; do cp /tmp/conf_$s.json $OUT/conformance_backward_chunked_$s.json; done
cp /tmp/bitwise.json $OUT/bitwise_backward_chunked.json
tar -C /tmp -cJf $OUT/logs.tar.xz conf_2.log conf_3.log conf_4.log conf_5.log bitwise.log san_memcheck.log san_racecheck.log 2>/dev/null
date -u; echo "waiting for the warm-up"; wait $WARM; tail -4 /tmp/warm.log; date -u
CTX=(--context "device=$GPU" --context "driver=$DRIVER" --context "date=$DATE" --context "commit=$C" --context "command=$CMD")
timeout 75 $B/cuda_backward_bench --benchmark_filter=BM_backward_chunked --benchmark_out=$OUT/bench_backward_chunked.json \
  --benchmark_out_format=json --benchmark_counters_tabular=true "${CTX[@]}" 2>&1 | grep -vE "^\s*$" | tail -9
echo "bench exit $?"; date -u
TILELANG_CACHE_DIR=/tmp/tlcache PYTHONPATH=/tmp/bsite timeout 110 python3 cuda/peers/backward_peers.py --backend flash_qla \
  --out $OUT/peer_backward_flash_qla.json --commit $C --command "$CMD" 2>&1 | grep -vE "Warning|warn|INFO" | tail -8
echo "flash_qla exit $?"; date -u
