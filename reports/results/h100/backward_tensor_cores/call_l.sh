#!/usr/bin/env bash
# Call L: the chunked backward with batched staging loads (NEW2) checked, then timed beside the
# tensor-core build before it (NEW), FlashQLA's backward and fla's Triton backward, in one call.
# .carry/gpu4.tar.xz holds scripts/pack.sh --backward-only of three builds in old/, new/, new2/.
#  1. side by side: NEW2's 3xTF32 probe, its chunked-backward conformance on 4 x CASES/4 cases
#     (seeds 20261202..05), bitwise test, compute-sanitizer (four tools, 3 cases); the peers'
#     compile and autotune (FlashQLA, then fla Triton; caches from call K), nothing timed, given
#     until WARM seconds after the call's start;
#  2. alone on the GPU, in turn: NEW2's benchmark (six shapes), FlashQLA's backward (six shapes),
#     fla's Triton backward (FLA_SHAPES), NEW's benchmark at shape 0, ncu's gpu__time_duration of
#     every kernel of one NEW2 backward at 4 x 8192 H16/HV32 (caches flushed between kernels).
# Usage (device run): bash call_l.sh NEW2_COMMIT NEW_COMMIT [CASES] [FLA_SHAPES] [WARM]
set -o pipefail
export PYTHONUNBUFFERED=1
START=$(date +%s)
C=$1; C1=$2; CASES=${3:-1000}; FLA_ONLY=${4:-qwen3next_4x8192,lowpar_1x32768,varlen_pack}; WARM_S=${5:-170}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
CMD="bash reports/results/h100/backward_tensor_cores/call_l.sh $C $C1 $CASES $FLA_ONLY $WARM_S"
echo "$GPU $DRIVER $DATE"
mkdir -p /tmp/px /tmp/hsite && tar -C /tmp/px -xJf .carry/gpu4.tar.xz && tar -C /tmp/hsite -xJf .carry-py/site.tar.xz || exit 3
tar -C /tmp -xJf .carry/peer_caches.tar.xz
export TILELANG_CACHE_DIR=/tmp/tlcache TRITON_CACHE_DIR=/tmp/tritoncache
B=/tmp/px/new2; B1=/tmp/px/new
setsid bash -c 'for b in flash_qla fla_triton; do
    PYTHONPATH=/tmp/hsite timeout 200 python3 cuda/peers/backward_peers.py --backend $b --warmup 2>&1 | tail -2
    echo "warm-up $b exit $?"
  done' > /tmp/warm.log 2>&1 &
WARM=$!
timeout 60 $B/cuda_gpu_tests -r compact "3xTF32 products keep fp32's accuracy" 2>&1 | tail -2
echo "probe exit $?"
PIDS=()
for s in 2 3 4 5; do
  ( timeout 200 $B/cuda_gpu_tests --cases $((CASES / 4)) --seed 2026120$s --json /tmp/conf_$s.json --commit $C \
      --command "$CMD" -r compact "backward conformance - ChunkedBackward" > /tmp/conf_$s.log 2>&1
    echo "conformance seed 2026120$s exit $?" >> /tmp/conf_$s.log ) &
  PIDS+=($!)
done
( timeout 200 $B/cuda_gpu_tests --cases $CASES --seed 20261202 --json /tmp/bitwise.json --commit $C \
    --command "$CMD" -r compact "backward determinism and batch invariance - ChunkedBackward" > /tmp/bitwise.log 2>&1
  echo "bitwise exit $?" >> /tmp/bitwise.log ) &
PIDS+=($!)
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck initcheck synccheck; do
  extra=""; [ $tool = racecheck ] && extra="--racecheck-report hazard"
  ( timeout 200 $CS --tool $tool $extra --error-exitcode 9 $B/cuda_gpu_tests --cases 3 --seed 20261202 -r compact \
      "backward conformance - ChunkedBackward" > /tmp/san_$tool.log 2>&1
    echo "sanitize $tool exit $?" >> /tmp/san_$tool.log ) &
  PIDS+=($!)
done
wait "${PIDS[@]}"
date -u
for f in conf_2 conf_3 conf_4 conf_5 bitwise; do tail -2 /tmp/$f.log | cut -c1-300; done
for tool in memcheck racecheck initcheck synccheck; do grep -E "ERROR SUMMARY|RACECHECK SUMMARY|exit" /tmp/san_$tool.log | tail -2; done
python3 - <<'PY'
import json
for s in ["conf_2", "conf_3", "conf_4", "conf_5", "bitwise"]:
    try:
        j = json.load(open(f"/tmp/{s}.json"))
        k = j["kernels"]["cuda.chunked_prefill.backward"]["properties"]
        print(s, {p: (v["run"], v["failed"], v["worst_margin"]) for p, v in k.items()})
    except Exception as e:
        print(s, "no json", e)
PY
mkdir -p /tmp/suite
for s in 2 3 4 5; do cp /tmp/conf_$s.json /tmp/suite/conformance_backward_chunked_$s.json; done
cp /tmp/bitwise.json /tmp/suite/bitwise_backward_chunked.json
cp /tmp/san_*.log /tmp/conf_?.log /tmp/bitwise.log /tmp/suite/ 2>/dev/null
tar -C /tmp/suite -cJf $OUT/backward_suite.tar.xz .
while kill -0 $WARM 2>/dev/null && [ $(( $(date +%s) - START )) -lt $WARM_S ]; do sleep 2; done
kill -- -$WARM 2>/dev/null; echo "peers' warm-up:"; grep -vE "Warning|warn|INFO" /tmp/warm.log | tail -6 | cut -c1-200; date -u
CTX=(--context "device=$GPU" --context "driver=$DRIVER" --context "date=$DATE" --context "command=$CMD")
LD_LIBRARY_PATH=$B timeout 70 $B/cuda_backward_bench --benchmark_filter=BM_backward_chunked \
  --benchmark_out=$OUT/bench_backward_chunked.json --benchmark_out_format=json --benchmark_counters_tabular=true \
  "${CTX[@]}" --context "commit=$C" 2>&1 | grep -E "^BM_" | cut -c1-100
echo "bench exit $?"; date -u
PYTHONPATH=/tmp/hsite timeout 120 python3 cuda/peers/backward_peers.py --backend flash_qla \
  --out $OUT/peer_backward_flash_qla.json --commit $C --command "$CMD" 2>&1 | grep -E '^\{"name' | cut -c1-110
echo "flash_qla exit $?"; date -u
PYTHONPATH=/tmp/hsite timeout 150 python3 cuda/peers/backward_peers.py --backend fla_triton --only $FLA_ONLY \
  --out $OUT/peer_backward_fla_triton.json --commit $C --command "$CMD" 2>&1 | grep -E '^\{"name' | cut -c1-110
echo "fla_triton exit $?"; date -u
LD_LIBRARY_PATH=$B1 timeout 25 $B1/cuda_backward_bench --benchmark_filter='BM_backward_chunked/shape:0/' \
  --benchmark_out=$OUT/bench_backward_chunked_new.json --benchmark_out_format=json --benchmark_counters_tabular=true \
  "${CTX[@]}" --context "commit=$C1" 2>&1 | grep -E "^BM_" | cut -c1-100
echo "bench new exit $?"; date -u
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
LD_LIBRARY_PATH=$B timeout 40 $NCU --metrics gpu__time_duration.sum --csv -k 'regex:^(prepare|chunk_|finish|head_sums)' \
  --launch-count 10 $B/cuda_backward_bench --benchmark_filter='BM_backward_chunked/shape:0/' \
  --benchmark_min_time=0.01 > $OUT/ncu_backward_chunked.csv 2> /tmp/ncu.err
echo "ncu exit $?"; grep -E "gpu__time_duration" $OUT/ncu_backward_chunked.csv | awk -F'","' '{print $5, $(NF)}' | cut -c1-120 | head -10
ls -la $OUT
