#!/usr/bin/env bash
# Call M: the tensor-core chunked backward (NEW, .carry/gpu4.tar.xz new/) on the six shapes beside
# FlashQLA's backward and fla's Triton backward (FLA_SHAPES), each alone on the GPU, in turn.
# Usage (device run): bash call_m.sh COMMIT [FLA_SHAPES]   (none: fla not run)
set -o pipefail
export PYTHONUNBUFFERED=1
C=$1; FLA_ONLY=${2:-none}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
CMD="bash reports/results/h100/backward_tensor_cores/call_m.sh $C $FLA_ONLY"
echo "$GPU $DRIVER $DATE"
mkdir -p /tmp/px /tmp/hsite && tar -C /tmp/px -xJf .carry/gpu4.tar.xz new && tar -C /tmp/hsite -xJf .carry-py/site.tar.xz || exit 3
tar -C /tmp -xJf .carry/peer_caches.tar.xz
export TILELANG_CACHE_DIR=/tmp/tlcache TRITON_CACHE_DIR=/tmp/tritoncache
B=/tmp/px/new
CTX=(--context "device=$GPU" --context "driver=$DRIVER" --context "date=$DATE" --context "command=$CMD" --context "commit=$C")
LD_LIBRARY_PATH=$B timeout 90 $B/cuda_backward_bench --benchmark_filter=BM_backward_chunked --benchmark_min_time=0.05 \
  --benchmark_out=$OUT/bench_backward_chunked.json --benchmark_out_format=json --benchmark_counters_tabular=true \
  "${CTX[@]}" 2>&1 | grep -E "^BM_" | cut -c1-100
echo "bench exit $?"; date -u
PYTHONPATH=/tmp/hsite timeout 130 python3 cuda/peers/backward_peers.py --backend flash_qla \
  --out $OUT/peer_backward_flash_qla.json --commit $C --command "$CMD" 2>&1 | grep -E '^\{"name' | cut -c1-110
echo "flash_qla exit $?"; date -u
[ "$FLA_ONLY" = none ] || PYTHONPATH=/tmp/hsite timeout 90 python3 cuda/peers/backward_peers.py --backend fla_triton --only $FLA_ONLY \
  --out $OUT/peer_backward_fla_triton.json --commit $C --command "$CMD" 2>&1 | grep -E '^\{"name' | cut -c1-110
echo "fla_triton exit $?"; date -u
