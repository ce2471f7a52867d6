#!/usr/bin/env bash
# Call H: issue 32's accuracy table and the chunked modes' fuzz, and issue 31's chunked backward
# beside both peers' backwards, in one call:
#  0. alone on the GPU: ncu's gpu__time_duration of every kernel of one chunked backward at
#     4 x 8192 H16/HV32 (the benchmark's first shape; caches flushed between kernels, ncu's default);
#  1. beside each other: gpu_run.sh --phases accuracy (ours, its model, fla Triton, FlashQLA on the
#     same inputs); gpu_run.sh --phases fuzz (3 modes x 4 shards, FUZZ s, seed S); the chunked
#     backward under compute-sanitizer (TOOLS) on 3 cases; with CASES > 0, its conformance on
#     4 x CASES/4 cases (seeds 20261206..09) and the bitwise test on CASES/2; the peers' compile
#     warm-up (fla Triton, FlashQLA: TileLang cache carried);
#  2. then alone on the GPU, in turn: our chunked backward's benchmark (six shapes), fla's Triton
#     backward, FlashQLA's backward (cuda/peers/backward_peers.py, same shapes and inputs).
set -o pipefail
export PYTHONUNBUFFERED=1
C=$1; FUZZ=${2:-280}; S=${3:-20261208}; CASES=${4:-0}; TOOLS=${5:-"initcheck synccheck"}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
CMD="bash .carry/call_h.sh $C $FUZZ $S $CASES '$TOOLS'"
echo "$GPU $DRIVER $DATE"
mkdir -p /tmp/b /tmp/hsite && tar -C /tmp/b -xJf .carry/gpu.tar.xz || exit 3
B=/tmp/b; export LD_LIBRARY_PATH=$B
tar -C /tmp/hsite -xJf .carry-py/site.tar.xz && tar -C /tmp -xJf .carry/tilelang_cache.tar.xz || exit 3
export TILELANG_CACHE_DIR=/tmp/tlcache
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 120 $NCU --metrics gpu__time_duration.sum --csv -k 'regex:^(prepare|chunk_|finish|head_sums)' \
  --launch-count 12 $B/cuda_backward_bench --benchmark_filter='BM_backward_chunked/shape:0$' \
  --benchmark_min_time=0.01 > /tmp/ncu.csv 2> /tmp/ncu.err
echo "ncu exit $?"; grep -E "gpu__time_duration" /tmp/ncu.csv | awk -F'","' '{print $5, $(NF)}' | head -14
tail -3 /tmp/ncu.err; cp /tmp/ncu.csv $OUT/ncu_backward_chunked.csv; date -u
( for b in fla_triton flash_qla; do
    PYTHONPATH=/tmp/hsite timeout 250 python3 cuda/peers/backward_peers.py --backend $b --warmup 2>&1 | tail -3
  done ) > /tmp/warm.log 2>&1 &
WARM=$!
mkdir -p /tmp/o_fuzz /tmp/o_acc
bash scripts/gpu_run.sh --bin $B --phases accuracy --site .carry-py/site.tar.xz \
  --commit $C --out /tmp/o_acc > /tmp/acc.out 2>&1 &
A=$!
bash scripts/gpu_run.sh --bin $B --phases fuzz --fuzz-seconds $FUZZ --seed $S --commit $C --out /tmp/o_fuzz \
  > /tmp/fuzz.out 2>&1 &
F=$!
PIDS=()
if [ "$CASES" -gt 0 ]; then
  for s in 6 7 8 9; do
    ( timeout 250 $B/cuda_gpu_tests --cases $((CASES / 4)) --seed 2026120$s --json /tmp/conf_$s.json --commit $C \
        --command "$CMD" -r compact "backward conformance - ChunkedBackward" > /tmp/conf_$s.log 2>&1
      echo "conformance seed 2026120$s exit $?" >> /tmp/conf_$s.log ) &
    PIDS+=($!)
  done
  ( timeout 250 $B/cuda_gpu_tests --cases $((CASES / 2)) --seed 20261206 --json /tmp/bitwise.json --commit $C \
      --command "$CMD" -r compact "backward determinism and batch invariance - ChunkedBackward" > /tmp/bitwise.log 2>&1
    echo "bitwise exit $?" >> /tmp/bitwise.log ) &
  PIDS+=($!)
fi
( cd reports/adapters && timeout 200 python3 -m pytest -q -rs -p no:cacheprovider test_adapter.py 2>&1 | tail -6 ) > /tmp/pytest.out 2>&1 &
PIDS+=($!)
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in $TOOLS; do
  extra=""; [ $tool = racecheck ] && extra="--racecheck-report hazard"
  ( timeout 250 $CS --tool $tool $extra --error-exitcode 9 $B/cuda_gpu_tests --cases 3 --seed 20261202 -r compact \
      "backward conformance - ChunkedBackward" > /tmp/san_$tool.log 2>&1
    echo "sanitize $tool exit $?" >> /tmp/san_$tool.log ) &
  PIDS+=($!)
done
wait "${PIDS[@]}"
date -u
if [ "$CASES" -gt 0 ]; then
  for f in conf_6 conf_7 conf_8 conf_9 bitwise; do tail -6 /tmp/$f.log | cut -c1-600; done
  mkdir -p /tmp/suite
  for s in 6 7 8 9; do cp /tmp/conf_$s.json /tmp/suite/conformance_backward_chunked_$s.json; done
  cp /tmp/bitwise.json /tmp/suite/bitwise_backward_chunked.json
  tar -C /tmp/suite -cJf $OUT/backward_suite.tar.xz .
fi
echo "adapter tests:"; cat /tmp/pytest.out
for tool in $TOOLS; do grep -E "ERROR SUMMARY|RACECHECK SUMMARY|exit" /tmp/san_$tool.log | tail -3; done
wait $A; echo "accuracy exit $?"; date -u; tail -12 /tmp/acc.out | cut -c1-300
cp /tmp/o_acc/results-*.tar.xz $OUT/acc_results.tar.xz
wait $F; echo "fuzz exit $?"; date -u; tail -16 /tmp/fuzz.out | cut -c1-300
cp /tmp/o_fuzz/results-*.tar.xz $OUT/fuzz_results.tar.xz
wait $WARM; echo "warm-up:"; cat /tmp/warm.log | grep -vE "Warning|warn|INFO" | tail -6; date -u
CTX=(--context "device=$GPU" --context "driver=$DRIVER" --context "date=$DATE" --context "commit=$C" --context "command=$CMD")
timeout 100 $B/cuda_backward_bench --benchmark_filter=BM_backward_chunked --benchmark_out=$OUT/bench_backward_chunked.json \
  --benchmark_out_format=json --benchmark_counters_tabular=true "${CTX[@]}" 2>&1 | grep -vE "^\s*$" | tail -8
echo "bench exit $?"; date -u
for b in fla_triton flash_qla; do
  PYTHONPATH=/tmp/hsite timeout 110 python3 cuda/peers/backward_peers.py --backend $b \
    --out $OUT/peer_backward_$b.json --commit $C --command "$CMD" 2>&1 | grep -vE "Warning|warn|INFO" | tail -8
  echo "$b exit $?"; date -u
done
cd /tmp && tar -cJf $OUT/logs.tar.xz o_fuzz/run.log o_acc/run.log acc.out ncu.err fuzz.out warm.log san_*.log $( [ "$CASES" -gt 0 ] && echo conf_?.log bitwise.log ) 2>/dev/null
ls -la $OUT
