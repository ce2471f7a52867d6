#!/usr/bin/env bash
# Profiling run on the device machine (from the repository root): Nsight Compute on one launch
# of each kernel at the shapes that decide the issues' targets, the SASS of the kernels, and the
# benchmark sweeps. Binaries come prebuilt in .carry/ (cuda_bench_recurrent, cuda_bench_decode,
# libbenchmark.so.1debian) and, when present, .carry-chunk/chunked.tar.xz.
# Output in $OUT: ncu_<name>.txt (details page), ncu_<name>_source.csv (per-SASS-instruction
# stall samples), sass_*.txt, bench_*.json, profile.log.
# Environment: PROFILE_PHASES (default "SNB": S = SASS, N = ncu, B = benchmarks; D = ncu of the
# streamed decode kernel at 256 requests, default and wide tile, and of its data-movement probe,
# per-lane and whole-line writes, only; W = one-request decode with a warm L2 (one-token and general
# tile, fla); L = latency: ncu of one-request decode, the streamed and
# the general kernel and fla's fused_recurrent, and of the chunked prefill's kernels at the
# low-parallelism shape).
set -u -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BIN=.carry
PHASES=${PROFILE_PHASES:-SNB}
LOG=$OUT/profile.log
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
log "device: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1); commit ${GDN_COMMIT:-unknown}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
log "ncu: $NCU $($NCU --version 2>&1 | tail -1)"
# xz-packed binaries (the unpacked ones exceed what one call may carry): cuda/pack_recurrent.sh.
if [ -f .carry-rec/rec.tar.xz ]; then mkdir -p "$BIN" && tar -C "$BIN" -xJf .carry-rec/rec.tar.xz; fi
if [ -f .carry-chunk/chunked.tar.xz ]; then
  mkdir -p /tmp/chunk && tar -C /tmp/chunk -xJf .carry-chunk/chunked.tar.xz
fi

if [[ $PHASES == *S* ]]; then
  # Function names demangle to gdn::cuda::detail::recurrent_kernel<__nv_bfloat16, 4, 16, true>.
  cuobjdump --dump-sass "$BIN/cuda_bench_recurrent" 2>/dev/null | awk '
    /Function : / { keep = ($0 ~ /recurrent_kernelI13__nv_bfloat16Li4ELi16ELb1E/ || $0 ~ /decode_stream_kernelI13__nv_bfloat16Li4ELi16ELb1E/) }
    keep' > "$OUT/sass_recurrent_bf16.txt"
  cuobjdump --dump-sass "$BIN/cuda_bench_decode" 2>/dev/null | awk '
    /Function : / { keep = ($0 ~ /decode_stream_kernelI13__nv_bfloat16Li4ELi16ELb1E/) }
    keep' > "$OUT/sass_decode_stream_bf16.txt"
  wc -l "$OUT"/sass_*.txt | tee -a "$LOG"
fi

# One profiled launch (after warm-up launches) of kernels matching $2 in command $3...
profile() {
  local name=$1 kernel=$2
  shift 2
  timeout 240 "$NCU" --clock-control none --cache-control "${PROFILE_CACHE:-all}" --set full --import-source yes -k "regex:$kernel" --launch-skip 3 \
    --launch-count 1 -f -o "$OUT/ncu_$name" "$@" > "$OUT/ncu_${name}_run.txt" 2>&1
  echo "ncu $name exit $?" | tee -a "$LOG"
  "$NCU" -i "$OUT/ncu_$name.ncu-rep" --page details > "$OUT/ncu_$name.txt" 2>&1
  "$NCU" -i "$OUT/ncu_$name.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_${name}_source.csv" 2>&1 ||
    echo "source page failed" >> "$OUT/ncu_${name}_source.csv"
  grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Memory Throughput|Block Limit" \
    "$OUT/ncu_$name.txt" | head -20 | tee -a "$LOG"
  tail -3 "$OUT/ncu_${name}_run.txt" >> "$LOG"
}

if [[ $PHASES == *N* ]]; then
  log "N: ncu"
  profile rec_64x256 recurrent_kernel "$BIN/cuda_bench_recurrent" \
    --benchmark_filter='BM_prefill/sequences:64/length:256/column_lanes:0/'
  profile rec_1x8192 recurrent_kernel "$BIN/cuda_bench_recurrent" \
    --benchmark_filter='BM_prefill/sequences:1/length:8192/column_lanes:0/'
  profile dec_256 decode_stream_kernel "$BIN/cuda_bench_decode" \
    --benchmark_filter='BM_decode/batch:256/column_lanes:0/status:0/graph:0/general:0'
  if [ -x /tmp/chunk/cuda_chunked_bench ]; then
    profile chunk_4x8192 "chunked_(forward|prepare)" /tmp/chunk/cuda_chunked_bench \
      --benchmark_filter='BM_chunked/shape:0/value_tile:0'
  fi
fi

if [[ $PHASES == *D* ]]; then
  log "D: ncu, decode and probe"
  profile dec_256 decode_stream_kernel "$BIN/cuda_bench_decode" \
    --benchmark_filter='BM_decode/batch:256/column_lanes:0/status:0/graph:0/general:0/v_major:0/wide:0'
  profile dec_256_wide decode_stream_kernel "$BIN/cuda_bench_decode" \
    --benchmark_filter='BM_decode/batch:256/column_lanes:0/status:0/graph:0/general:2/v_major:0/wide:1'
  profile probe_8192 stream_probe_kernel "$BIN/cuda_bench_decode" \
    --benchmark_filter='BM_stream_probe/items:8192/write_mode:1'
  profile probe_8192_lines stream_probe_kernel "$BIN/cuda_bench_decode" \
    --benchmark_filter='BM_stream_probe/items:8192/write_mode:2'
fi

if [[ $PHASES == *L* ]]; then
  log "L: ncu, one-request decode and the low-parallelism chunked prefill"
  export GDN_BENCH_NO_HOLD=1
  profile dec_1 decode_stream_kernel "$BIN/cuda_bench_decode" \
    --benchmark_filter='BM_decode/batch:1/column_lanes:0/status:0/graph:0/general:2/v_major:0/wide:0/held:1'
  profile dec_1_general recurrent_kernel "$BIN/cuda_bench_decode" \
    --benchmark_filter='BM_decode/batch:1/column_lanes:0/status:0/graph:0/general:1/v_major:0/wide:0/held:1'
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
    PYTHONPATH=/tmp/site profile fla_dec_1 fused_recurrent python3 cuda/peers/fla_recurrent.py --one-decode
  fi
  if [ -x /tmp/chunk/cuda_chunked_bench ]; then
    profile chunk_lowpar "chunked_(forward|prepare)" /tmp/chunk/cuda_chunked_bench \
      --benchmark_filter='BM_chunked/shape:3/value_tile:0'
  fi
  unset GDN_BENCH_NO_HOLD
fi

if [[ $PHASES == *W* ]]; then
  # As L, but with a warm L2 (--cache-control none), as in the held benchmark rows: the state
  # of one request (2 MiB) stays in L2 from one launch to the next there.
  log "W: ncu, one-request decode, warm L2: one-token decode kernel, general kernel, fla"
  export GDN_BENCH_NO_HOLD=1
  PROFILE_CACHE=none profile dec_1_token_warm decode_token_kernel "$BIN/cuda_bench_decode" \
    --benchmark_filter='BM_decode/batch:1/column_lanes:0/status:0/graph:1/general:1/v_major:0/wide:0/held:1/runtime_sizes:0/narrow:1'
  GDN_DECODE_TOKEN_KERNEL=0 PROFILE_CACHE=none profile dec_1_general_warm recurrent_kernel "$BIN/cuda_bench_decode" \
    --benchmark_filter='BM_decode/batch:1/column_lanes:0/status:0/graph:1/general:1/v_major:0/wide:0/held:1/runtime_sizes:0/narrow:1'
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
    PYTHONPATH=/tmp/site PROFILE_CACHE=none profile fla_dec_1_warm fused_recurrent python3 cuda/peers/fla_recurrent.py --one-decode
  fi
  unset GDN_BENCH_NO_HOLD
fi

if [[ $PHASES == *B* ]]; then
  log "B: benchmarks"
  timeout 200 "$BIN/cuda_bench_recurrent" --benchmark_out="$OUT/bench_recurrent.json" --benchmark_out_format=json \
    --benchmark_counters_tabular=true 2>&1 | grep -v "^\*\*\*" | tee -a "$LOG"
  timeout 120 "$BIN/cuda_bench_decode" --benchmark_out="$OUT/bench_decode.json" --benchmark_out_format=json \
    --benchmark_counters_tabular=true 2>&1 | tee -a "$LOG"
fi
log "done"
