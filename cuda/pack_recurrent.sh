#!/usr/bin/env bash
# Packs the recurrent/decode GPU binaries (built in build/, or $1) into .carry-rec/rec.tar.xz;
# cuda/run_h200.sh and cuda/profile_h200.sh unpack it into .carry/.
set -eu
exec bash "$(dirname "$0")/pack.sh" .carry-rec/rec.tar.xz "${1:-build}" \
  cuda_gpu_tests cuda_bench_decode cuda_bench_recurrent libbenchmark.so.1debian
