#!/usr/bin/env bash
# Packs the recurrent/decode GPU binaries (built in build/) for the device machine:
# .carry-rec/rec.tar.xz (cuda_gpu_tests, cuda_bench_decode, cuda_bench_recurrent,
# libbenchmark.so.1debian), host debug info stripped, xz because the three binaries (each with
# every kernel instance, ~30 MB) exceed what one call may carry. The device scripts unpack it
# into .carry/.
set -eu
BUILD=${1:-build}
STAGE=$(mktemp -d)
cp "$BUILD"/cuda/{cuda_gpu_tests,cuda_bench_decode,cuda_bench_recurrent,libbenchmark.so.1debian} "$STAGE"/
strip --strip-debug "$STAGE"/cuda_*
mkdir -p .carry-rec
tar -C "$STAGE" -cJf .carry-rec/rec.tar.xz.tmp . && mv .carry-rec/rec.tar.xz.tmp .carry-rec/rec.tar.xz
rm -rf "$STAGE"
ls -la .carry-rec/rec.tar.xz
