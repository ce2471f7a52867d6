#!/usr/bin/env bash
# Packs the chunked prefill's GPU binaries (built in build-chunk) for the device machine:
# .carry-chunk/chunked.tar.xz, host debug info stripped (the kernels keep -lineinfo), xz because
# the three binaries (each with every kernel instance) exceed what one call may carry.
set -eu
BUILD=${1:-build-chunk}
STAGE=$(mktemp -d)
cp "$BUILD"/cuda/{cuda_chunked_gpu_tests,cuda_chunked_bench,cuda_chunked_accuracy,libbenchmark.so.1debian} "$STAGE"/
strip --strip-debug "$STAGE"/cuda_chunked_*
mkdir -p .carry-chunk
tar -C "$STAGE" -cJf .carry-chunk/chunked.tar.xz.tmp . && mv .carry-chunk/chunked.tar.xz.tmp .carry-chunk/chunked.tar.xz
rm -rf "$STAGE"
ls -la .carry-chunk/chunked.tar.xz
