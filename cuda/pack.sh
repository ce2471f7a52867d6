#!/usr/bin/env bash
# Packs GPU binaries for the device machine: cuda/pack.sh OUT.tar.xz BUILD FILE... copies
# BUILD/cuda/FILE..., strips host debug info from the cuda_* executables (the kernels keep
# -lineinfo) and writes OUT.tar.xz atomically; xz because each binary holds every kernel
# instance (~20-30 MB) and one call carries at most 64 MiB. Used by pack_recurrent.sh and
# pack_chunked.sh; the device scripts unpack the archives.
set -eu
OUT=$1
BUILD=$2
shift 2
STAGE=$(mktemp -d)
for f in "$@"; do cp "$BUILD/cuda/$f" "$STAGE"/; done
strip --strip-debug "$STAGE"/cuda_*
mkdir -p "$(dirname "$OUT")"
# One xz stream with a dictionary larger than the tar: the binaries share their kernels, and a
# window that spans all of them stores those bytes once (chunked: 26 MB -> about 10).
tar -C "$STAGE" -cf - . | xz -T1 --lzma2=preset=6,dict=192MiB > "$OUT.tmp" && mv "$OUT.tmp" "$OUT"
rm -rf "$STAGE"
ls -la "$OUT"
