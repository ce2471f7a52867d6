#!/usr/bin/env bash
# One device call that compares kernel variants packed by cuda/pack_variants.sh
# (.carry-chunk/variants.tar.xz, one folder per variant; carry it), from the repository root on
# the device machine:
#   1. the chunked benchmark of every variant, GDN_ROUNDS rounds (default 2), the variants in
#      turn within each round, so that a drift of the GPU's clock between them shows up as a
#      difference between rounds rather than between variants;
#   2. the chunked GPU tests of every variant at GDN_CASES random cases (default 100).
# Writes $OUT/variant_NAME.log (what was built, the benchmark rounds, then the tests' output)
# and $OUT/variants.txt (one line per variant, benchmark and shape: the manual times of each
# round; then each variant's test verdict). Few files: a call brings back at most 8.
# Environment: GDN_BENCH_FILTER (default the six issue-4 shapes at the automatic V tile, with and
# without the automatic split), GDN_BENCH_TIMEOUT (s per variant and round, default 100),
# GDN_TEST_TIMEOUT (s per variant, default 150), GDN_TEST_ARGS (Catch2 test names or tags for
# the tests, default all; e.g. '"chunked: random cases within the calibrated budget"'),
# GDN_VARIANTS (space-separated names: only those, in the archive's order; default all), and
# GDN_SEED, which the tests read (a seed other than the default draws other random cases).
set -u -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
FILTER=${GDN_BENCH_FILTER:-'BM_chunked/shape:[0-5]/value_tile:0/split:(0|-1)/'}
ROUNDS=${GDN_ROUNDS:-2}
CASES=${GDN_CASES:-100}
names=()
rm -rf /tmp/variants && mkdir -p /tmp/variants && tar -C /tmp/variants -xJf .carry-chunk/variants.tar.xz || exit 3
for dir in /tmp/variants/*/; do
  name=$(basename "$dir")
  if [[ -n ${GDN_VARIANTS:-} && " $GDN_VARIANTS " != *" $name "* ]]; then continue; fi
  names+=("$name")
  { echo "== variant $(cat "$dir/VARIANT.txt" 2>/dev/null || echo "$name") ($(date -u +%H:%M:%S))"; } > "$OUT/variant_$name.log"
done
(( ${#names[@]} > 0 )) || { echo "run_variants: no variant in .carry-chunk/variants.tar.xz" >&2; exit 3; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | head -1 > "$OUT/variants.txt"

for ((round = 1; round <= ROUNDS; ++round)); do
  for name in "${names[@]}"; do
    B=/tmp/variants/$name
    echo "== round $round benchmark ($(date -u +%H:%M:%S))" >> "$OUT/variant_$name.log"
    LD_LIBRARY_PATH=$B timeout "${GDN_BENCH_TIMEOUT:-100}" "$B/cuda_chunked_bench" --benchmark_filter="$FILTER" \
      --benchmark_min_time=0.1 >> "$OUT/variant_$name.log" 2>&1
    echo "bench exit $?" >> "$OUT/variant_$name.log"
  done
done
for name in "${names[@]}"; do
  B=/tmp/variants/$name
  echo "== tests, $CASES cases ($(date -u +%H:%M:%S))" >> "$OUT/variant_$name.log"
  eval "args=(${GDN_TEST_ARGS:-})"
  GDN_CASES=$CASES LD_LIBRARY_PATH=$B timeout "${GDN_TEST_TIMEOUT:-150}" "$B/cuda_chunked_gpu_tests" -r compact \
    "${args[@]}" > "/tmp/variants/$name.tests" 2>&1
  code=$?
  cat "/tmp/variants/$name.tests" >> "$OUT/variant_$name.log"
  echo "tests exit $code" >> "$OUT/variant_$name.log"
done

# The summary: per variant and benchmark, the manual time of each round; then the tests' last line.
for name in "${names[@]}"; do
  awk -v name="$name" '/^BM_/ { t[$1] = t[$1] " " $2 " " $3; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
    END { for (i = 1; i <= n; ++i) print name, order[i], t[order[i]] }' "$OUT/variant_$name.log" >> "$OUT/variants.txt"
  echo "$name tests: $(grep -E 'test cases|exit' "$OUT/variant_$name.log" | tail -2 | tr '\n' ' ')" >> "$OUT/variants.txt"
done
cat "$OUT/variants.txt"
