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
tar -C "$STAGE" -cJf "$OUT.tmp" . && mv "$OUT.tmp" "$OUT"
rm -rf "$STAGE"
ls -la "$OUT"
