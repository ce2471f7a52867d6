#!/usr/bin/env bash
# Call K: the chunked backward with its products on the tensor cores (3xTF32), checked and timed
# beside the fp32 SIMT kernel it replaces, in one call. Three builds: NEW (chunk_states,
# chunk_dstates and chunk_gradients on the tensor cores), GRAD (chunk_gradients alone), OLD (SIMT).
#  1. NEW's 3xTF32 probe test; then side by side: NEW's chunked-backward conformance on 4 x CASES/4
#     cases (seeds 20261202..05, those of the SIMT kernel's call F), its bitwise
#     test on CASES/2, compute-sanitizer (memcheck, racecheck, initcheck, synccheck) on 3 cases;
#     GRAD's conformance on 2 x CASES/4 (seeds 20261202, 03);
#  2. alone on the GPU, in turn: NEW's benchmark (six shapes), FlashQLA's backward
#     (cuda/peers/backward_peers.py: the same shapes, inputs and timing), OLD's benchmark (shapes 0
#     and 3), GRAD's (shape 0), ncu's gpu__time_duration of every kernel of one NEW backward at
#     4 x 8192 H16/HV32 (caches flushed between kernels).
# Beside step 1 the peers' backwards compile and autotune (FlashQLA, then fla Triton; nothing
# timed; stopped 20 s after step 1 ends); the TileLang and Triton caches come back for call_l.sh.
# Usage (device run, carrying the three packs): bash call_k.sh NEW_COMMIT GRAD_COMMIT OLD_COMMIT [CASES]
set -o pipefail
export PYTHONUNBUFFERED=1
C=$1; CG=$2; C0=$3; CASES=${4:-1000}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
HERE=reports/results/h100/backward_tensor_cores
CMD="bash $HERE/call_k.sh $C $CG $C0 $CASES"
echo "$GPU $DRIVER $DATE"
# .carry/gpu3.tar.xz: the three builds' scripts/pack.sh --backward-only contents in new/, grad/, old/
# (one xz stream: the builds share most of their bytes).
mkdir -p /tmp/px && tar -C /tmp/px -xJf .carry/gpu3.tar.xz || exit 3
B=/tmp/px/new; BG=/tmp/px/grad; B0=/tmp/px/old
timeout 60 $B/cuda_gpu_tests -s -r compact "3xTF32 products keep fp32's accuracy" 2>&1 | grep -E "tf32x3|passed|failed" | head -12
echo "probe exit $?"; date -u
mkdir -p /tmp/hsite && tar -C /tmp/hsite -xJf .carry-py/site.tar.xz || exit 3
export TILELANG_CACHE_DIR=/tmp/tlcache TRITON_CACHE_DIR=/tmp/tritoncache
setsid bash -c 'for b in flash_qla fla_triton; do
    PYTHONPATH=/tmp/hsite timeout 230 python3 cuda/peers/backward_peers.py --backend $b --warmup 2>&1 | tail -3
    echo "warm-up $b exit $?"
  done' > /tmp/warm.log 2>&1 &
WARM=$!
PIDS=()
for s in 2 3 4 5; do
  ( timeout 240 $B/cuda_gpu_tests --cases $((CASES / 4)) --seed 2026120$s --json /tmp/conf_$s.json --commit $C \
      --command "$CMD" -r compact "backward conformance - ChunkedBackward" > /tmp/conf_$s.log 2>&1
    echo "conformance seed 2026120$s exit $?" >> /tmp/conf_$s.log ) &
  PIDS+=($!)
done
( timeout 240 $B/cuda_gpu_tests --cases $((CASES / 2)) --seed 20261202 --json /tmp/bitwise.json --commit $C \
    --command "$CMD" -r compact "backward determinism and batch invariance - ChunkedBackward" > /tmp/bitwise.log 2>&1
  echo "bitwise exit $?" >> /tmp/bitwise.log ) &
PIDS+=($!)
for s in 2 3; do
  ( timeout 240 $BG/cuda_gpu_tests --cases $((CASES / 4)) --seed 2026120$s --json /tmp/grad_$s.json --commit $CG \
      --command "$CMD" -r compact "backward conformance - ChunkedBackward" > /tmp/grad_$s.log 2>&1
    echo "GRAD conformance seed 2026120$s exit $?" >> /tmp/grad_$s.log ) &
  PIDS+=($!)
done
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck initcheck synccheck; do
  extra=""; [ $tool = racecheck ] && extra="--racecheck-report hazard"
  ( timeout 240 $CS --tool $tool $extra --error-exitcode 9 $B/cuda_gpu_tests --cases 3 --seed 20261202 -r compact \
      "backward conformance - ChunkedBackward" > /tmp/san_$tool.log 2>&1
    echo "sanitize $tool exit $?" >> /tmp/san_$tool.log ) &
  PIDS+=($!)
done
wait "${PIDS[@]}"
date -u
for f in conf_2 conf_3 conf_4 conf_5 bitwise grad_2 grad_3; do tail -5 /tmp/$f.log | cut -c1-400; done
for tool in memcheck racecheck initcheck synccheck; do grep -E "ERROR SUMMARY|RACECHECK SUMMARY|exit" /tmp/san_$tool.log | tail -3; done
python3 - <<'PY'
import json
for s in ["conf_2", "conf_3", "conf_4", "conf_5", "grad_2", "grad_3"]:
    try:
        j = json.load(open(f"/tmp/{s}.json"))
        k = j["kernels"]["cuda.chunked_prefill.backward"]["properties"]
        print(s, {p: (v["run"], v["failed"], v["worst_margin"]) for p, v in k.items()})
    except Exception as e:
        print(s, "no json", e)
PY
mkdir -p /tmp/suite
for s in 2 3 4 5; do cp /tmp/conf_$s.json /tmp/suite/conformance_backward_chunked_$s.json; done
for s in 2 3; do cp /tmp/grad_$s.json /tmp/suite/grad_conformance_backward_chunked_$s.json; done
cp /tmp/bitwise.json /tmp/suite/bitwise_backward_chunked.json
cp /tmp/san_*.log /tmp/conf_?.log /tmp/grad_?.log /tmp/bitwise.log /tmp/suite/ 2>/dev/null
tar -C /tmp/suite -cJf $OUT/backward_suite.tar.xz .
# The peers' warm-up gets 20 s more, then stops (what it compiled stays in the caches).
for i in $(seq 20); do kill -0 $WARM 2>/dev/null || break; sleep 1; done
kill -- -$WARM 2>/dev/null; echo "peers' warm-up:"; grep -vE "Warning|warn|INFO" /tmp/warm.log | tail -8; date -u
CTX=(--context "device=$GPU" --context "driver=$DRIVER" --context "date=$DATE" --context "command=$CMD")
LD_LIBRARY_PATH=$B timeout 60 $B/cuda_backward_bench --benchmark_filter=BM_backward_chunked \
  --benchmark_out=$OUT/bench_backward_chunked.json --benchmark_out_format=json --benchmark_counters_tabular=true \
  "${CTX[@]}" --context "commit=$C" 2>&1 | grep -vE "^\s*$" | tail -8
echo "bench exit $?"; date -u
PYTHONPATH=/tmp/hsite timeout 130 python3 cuda/peers/backward_peers.py --backend flash_qla \
  --out $OUT/peer_backward_flash_qla.json --commit $C --command "$CMD" 2>&1 | grep -vE "Warning|warn|INFO" | tail -8 | cut -c1-200
echo "flash_qla exit $?"; date -u
tar -C /tmp -cf - tlcache tritoncache | xz -T8 -6 > $OUT/peer_caches.tar.xz; ls -la $OUT/peer_caches.tar.xz
LD_LIBRARY_PATH=$B0 timeout 45 $B0/cuda_backward_bench --benchmark_filter='BM_backward_chunked/shape:[03]/' \
  --benchmark_out=$OUT/bench_backward_chunked_simt.json --benchmark_out_format=json --benchmark_counters_tabular=true \
  "${CTX[@]}" --context "commit=$C0" 2>&1 | grep -vE "^\s*$" | tail -8
echo "bench simt exit $?"; date -u
LD_LIBRARY_PATH=$BG timeout 20 $BG/cuda_backward_bench --benchmark_filter='BM_backward_chunked/shape:0/' \
  --benchmark_out=$OUT/bench_backward_chunked_grad.json --benchmark_out_format=json --benchmark_counters_tabular=true \
  "${CTX[@]}" --context "commit=$CG" 2>&1 | grep -vE "^\s*$" | tail -8
echo "bench grad exit $?"; date -u
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
LD_LIBRARY_PATH=$B timeout 40 $NCU --metrics gpu__time_duration.sum --csv -k 'regex:^(prepare|chunk_|finish|head_sums)' \
  --launch-count 10 $B/cuda_backward_bench --benchmark_filter='BM_backward_chunked/shape:0/' \
  --benchmark_min_time=0.01 > $OUT/ncu_backward_chunked.csv 2> /tmp/ncu.err
echo "ncu exit $?"; grep -E "gpu__time_duration" $OUT/ncu_backward_chunked.csv | awk -F'","' '{print $5, $(NF)}' | cut -c1-120 | head -12
tail -2 /tmp/ncu.err; date -u
ls -la $OUT
