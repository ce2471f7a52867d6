#!/usr/bin/env bash
# Bounded-time libFuzzer runs on the layers around the case-file reader (for CI):
#   cli/fuzz_cli.sh [SECONDS]      default 30, for each target
# verify_fuzz: the whole verify path (read, judge, --json, --junit), seeded with
# oracle/fuzz_corpus/ and the defect samples of oracle/tests/repro/; merge_fuzz: merge's reading
# of shard results, seeded with the samples' JSON files. Built with clang++
# (-fsanitize=fuzzer,address) in build-fuzz/ (or $GDN_FUZZ_BUILD), as oracle/fuzz_case_reader.sh
# does. Fails on any crash, leak, escaped exception or broken output contract; the input is left
# in the build folder (crash-*): replay it with build-fuzz/cli/verify_fuzz crash-<hash>.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-30}
build=${GDN_FUZZ_BUILD:-$root/build-fuzz}
cxx=${GDN_FUZZ_CXX:-clang++}
command -v "$cxx" >/dev/null || { echo "fuzz_cli: $cxx not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }
cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DGDN_CUDA=OFF -DGDN_BENCHMARKS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target verify_fuzz merge_fuzz -j"${JOBS:-$(nproc)}" >/dev/null
for t in verify_fuzz merge_fuzz; do
  [ -x "$build/cli/$t" ] || { echo "fuzz_cli: $cxx cannot build libFuzzer targets ($t)" >&2; exit 2; }
done
mkdir -p "$build/verify_corpus" "$build/merge_corpus"
cp -n "$root"/oracle/fuzz_corpus/* "$root"/oracle/tests/repro/*.safetensors "$build/verify_corpus"/ 2>/dev/null || true
cp -n "$root"/oracle/tests/repro/*.json "$build/merge_corpus"/ 2>/dev/null || true
cd "$build"
"$build/cli/verify_fuzz" -max_total_time="$seconds" -max_len=16384 -rss_limit_mb=2048 -timeout=10 \
  -print_final_stats=1 "$build/verify_corpus"
"$build/cli/merge_fuzz" -max_total_time="$seconds" -max_len=16384 -rss_limit_mb=2048 -timeout=10 \
  -print_final_stats=1 "$build/merge_corpus"
