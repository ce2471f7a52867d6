#!/usr/bin/env bash
# Packs what the device machine runs into one archive that `device run` carries:
#
#   bash scripts/pack.sh BUILD_DIR OUT.tar.xz [--testbed-only | --backward-only | --chunked-only]
#
# BUILD_DIR is a Release build with CUDA (static cudart: nothing on the device machine needs to
# match this machine's CUDA runtime). The archive holds the GPU testbed, the benchmarks, the
# chunked accuracy judge, the CLI, and Debian's Google Benchmark shared library, which the
# device machine lacks (the benchmarks find it beside themselves through RPATH $ORIGIN).
# Host debug info is stripped (the kernels keep -lineinfo for compute-sanitizer). One xz stream
# with a dictionary larger than the tar: every binary holds the same kernel instances, and a
# window that spans them all stores those bytes once. Written atomically. --testbed-only packs
# the GPU testbed and the CLI alone: a fault-campaign build (-DGDN_KERNEL_FAULTS=ON
# -DGDN_BENCHMARKS=OFF, scripts/fault_campaign.sh) has nothing else worth carrying.
# --backward-only packs the GPU testbed and the backward's benchmark (with Google Benchmark):
# two builds of the backward compared in one call fit beside the peers' site that way.
# --chunked-only packs the GPU testbed, the chunked prefill's benchmark (with Google Benchmark)
# and the CLI: the forward's work, beside the peers' site.
set -euo pipefail
usage() { sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
[ $# -eq 2 ] || [ $# -eq 3 ] || usage
BUILD=$1
OUT=$2
FILES="cuda/cuda_gpu_tests cuda/cuda_chunked_accuracy cuda/cuda_recurrent_bench cuda/cuda_decode_bench cuda/cuda_chunked_bench cuda/cuda_backward_bench cli/gdn-testbed"
if [ $# -eq 3 ]; then
  case "$3" in
    --testbed-only) FILES="cuda/cuda_gpu_tests cli/gdn-testbed" ;;
    --backward-only) FILES="cuda/cuda_gpu_tests cuda/cuda_backward_bench" ;;
    --chunked-only) FILES="cuda/cuda_gpu_tests cuda/cuda_chunked_bench cli/gdn-testbed" ;;
    *) usage ;;
  esac
fi
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
for f in $FILES; do
  [ -x "$BUILD/$f" ] || { echo "pack.sh: $BUILD/$f is missing (build it first)" >&2; exit 1; }
  cp "$BUILD/$f" "$STAGE/"
done
[ "${3:-}" = --testbed-only ] || cp -L "$BUILD"/cuda/libbenchmark.so.* "$STAGE/"
strip --strip-debug "$STAGE"/cuda_* $( [ -e "$STAGE/gdn-testbed" ] && echo "$STAGE/gdn-testbed" )
mkdir -p "$(dirname "$OUT")"
tar -C "$STAGE" -cf - . | xz -T2 --lzma2=preset=6,dict=192MiB > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
ls -la "$OUT"
