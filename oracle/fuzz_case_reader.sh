#!/usr/bin/env bash
# Bounded-time libFuzzer run on the case-file reader (for CI).
#   oracle/fuzz_case_reader.sh [SECONDS]      default 60
# Builds oracle/case_file_fuzz with clang++ (-fsanitize=fuzzer,address) in build-fuzz/ (or
# $GDN_FUZZ_BUILD), seeds it with oracle/fuzz_corpus/, and fails on any crash, leak or escaped
# exception; the crashing input is left in the build folder (crash-*), replay it with
#   build-fuzz/oracle/case_file_fuzz crash-<hash>
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
build=${GDN_FUZZ_BUILD:-$root/build-fuzz}
cxx=${GDN_FUZZ_CXX:-clang++}
command -v "$cxx" >/dev/null || { echo "fuzz_case_reader: $cxx not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }
cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DGDN_CUDA=OFF -DGDN_BENCHMARKS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target case_file_fuzz -j2 >/dev/null
[ -x "$build/oracle/case_file_fuzz" ] || { echo "fuzz_case_reader: $cxx cannot build libFuzzer targets" >&2; exit 2; }
corpus="$build/case_file_corpus"
mkdir -p "$corpus"
cp -n "$root"/oracle/fuzz_corpus/* "$corpus"/ 2>/dev/null || true
cd "$build"
exec "$build/oracle/case_file_fuzz" -max_total_time="$seconds" -max_len=16384 -rss_limit_mb=2048 \
  -timeout=10 -print_final_stats=1 "$corpus"
