#!/usr/bin/env bash
# Call I: what call H left: the per-kernel profile of one chunked backward (ncu), and fla's
# Triton backward on the three shapes call H's time limit cut, beside our chunked backward's
# benchmark on the same three shapes, each alone on the GPU.
set -o pipefail
export PYTHONUNBUFFERED=1
C=$1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
CMD="bash .carry/call_i.sh $C"
echo "$GPU $DRIVER $DATE"
mkdir -p /tmp/b /tmp/hsite && tar -C /tmp/b -xJf .carry/gpu.tar.xz || exit 3
B=/tmp/b; export LD_LIBRARY_PATH=$B
tar -C /tmp/hsite -xJf .carry-py/site.tar.xz || exit 3
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 90 $NCU --metrics gpu__time_duration.sum --csv -k 'regex:^(prepare|chunk_|finish|head_sums)' \
  --launch-count 10 $B/cuda_backward_bench --benchmark_filter='BM_backward_chunked/shape:0/' \
  --benchmark_min_time=0.01 > /tmp/ncu.csv 2> /tmp/ncu.err
echo "ncu exit $?"; grep -E "gpu__time_duration" /tmp/ncu.csv | awk -F'","' '{print $5, $(NF)}' | cut -c1-160 | head -12
tail -2 /tmp/ncu.err; cp /tmp/ncu.csv $OUT/ncu_backward_chunked.csv; date -u
CTX=(--context "device=$GPU" --context "driver=$DRIVER" --context "date=$DATE" --context "commit=$C" --context "command=$CMD")
timeout 60 $B/cuda_backward_bench --benchmark_filter='BM_backward_chunked/shape:[345]/' \
  --benchmark_out=$OUT/bench_backward_chunked.json --benchmark_out_format=json --benchmark_counters_tabular=true \
  "${CTX[@]}" 2>&1 | grep -vE "^\s*$" | tail -4
echo "bench exit $?"; date -u
PYTHONPATH=/tmp/hsite timeout 230 python3 cuda/peers/backward_peers.py --backend fla_triton \
  --only lowpar_1x32768,varlen_pack,qwen3next_8x4096 --out $OUT/peer_backward_fla_triton.json --commit $C \
  --command "$CMD" 2>&1 | grep -vE "Warning|warn|INFO" | tail -4 | cut -c1-200
echo "fla_triton exit $?"; date -u
