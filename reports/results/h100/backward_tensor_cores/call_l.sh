#!/usr/bin/env bash
# Call L: the tensor-core chunked backward beside both peers' backwards, each alone on the GPU, in
# turn: our benchmark (six shapes, cuda/bench/backward_bench.cpp), FlashQLA's backward, fla's Triton
# backward (cuda/peers/backward_peers.py: the same shapes, inputs and timing; FLA_FLASH_QLA=0),
# then ncu's per-kernel profile of one backward at 4 x 8192 H16/HV32. The peers' TileLang and
# Triton caches come from call K (.carry/peer_caches.tar.xz), so their compile time is mostly spent.
# Usage (device run): bash call_l.sh COMMIT [FLA_SHAPES]
set -o pipefail
export PYTHONUNBUFFERED=1
C=$1; FLA_ONLY=${2:-}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
CMD="bash reports/results/h100/backward_tensor_cores/call_l.sh $C $FLA_ONLY"
echo "$GPU $DRIVER $DATE"
mkdir -p /tmp/b /tmp/hsite && tar -C /tmp/b -xJf .carry/gpu_new.tar.xz && tar -C /tmp/hsite -xJf .carry-py/site.tar.xz || exit 3
[ -f .carry/peer_caches.tar.xz ] && tar -C /tmp -xJf .carry/peer_caches.tar.xz
export TILELANG_CACHE_DIR=/tmp/tlcache TRITON_CACHE_DIR=/tmp/tritoncache
B=/tmp/b
CTX=(--context "device=$GPU" --context "driver=$DRIVER" --context "date=$DATE" --context "commit=$C" --context "command=$CMD")
LD_LIBRARY_PATH=$B timeout 60 $B/cuda_backward_bench --benchmark_filter=BM_backward_chunked \
  --benchmark_out=$OUT/bench_backward_chunked.json --benchmark_out_format=json --benchmark_counters_tabular=true \
  "${CTX[@]}" 2>&1 | grep -vE "^\s*$" | tail -8
echo "bench exit $?"; date -u
PYTHONPATH=/tmp/hsite timeout 170 python3 cuda/peers/backward_peers.py --backend flash_qla \
  --out $OUT/peer_backward_flash_qla.json --commit $C --command "$CMD" 2>&1 | grep -vE "Warning|warn|INFO" | tail -8 | cut -c1-200
echo "flash_qla exit $?"; date -u
PYTHONPATH=/tmp/hsite timeout 280 python3 cuda/peers/backward_peers.py --backend fla_triton ${FLA_ONLY:+--only $FLA_ONLY} \
  --out $OUT/peer_backward_fla_triton.json --commit $C --command "$CMD" 2>&1 | grep -vE "Warning|warn|INFO" | tail -8 | cut -c1-200
echo "fla_triton exit $?"; date -u
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
LD_LIBRARY_PATH=$B timeout 50 $NCU --metrics gpu__time_duration.sum --csv -k 'regex:^(prepare|chunk_|finish|head_sums)' \
  --launch-count 10 $B/cuda_backward_bench --benchmark_filter='BM_backward_chunked/shape:0/' \
  --benchmark_min_time=0.01 > $OUT/ncu_backward_chunked.csv 2> /tmp/ncu.err
echo "ncu exit $?"; grep -E "gpu__time_duration" $OUT/ncu_backward_chunked.csv | awk -F'","' '{print $5, $(NF)}' | cut -c1-120 | head -12
ls -la $OUT
