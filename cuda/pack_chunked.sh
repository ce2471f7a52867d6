#!/usr/bin/env bash
# Packs the chunked prefill's GPU binaries (built in build-chunk/, or $1) into
# .carry-chunk/chunked.tar.xz; cuda/run_chunked_h200.sh unpacks it.
set -eu
exec bash "$(dirname "$0")/pack.sh" .carry-chunk/chunked.tar.xz "${1:-build-chunk}" \
  cuda_chunked_gpu_tests cuda_chunked_bench cuda_chunked_accuracy libbenchmark.so.1debian
