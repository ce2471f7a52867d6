#!/usr/bin/env bash
# The chunked prefill's two rounding modes through the CLI on one GPU, in one bounded device call:
#   * `gdn-testbed fuzz` of cuda.chunked_prefill.single (ChunkedRounding::single, judged by its
#     registry budget, calibrated(baseline=operands_single)) and of cuda.chunked_prefill (the
#     default split rounding), SHARDS processes each (the CPU-side double reference is the
#     bottleneck), K a multiple of 16 up to 128 (the kernel's range), merged per mode;
#   * then `gdn-testbed conformance --impl 'cuda.chunked_prefill*'` on the built-in cases.
# Writes to $OUT: fuzz_single.json, fuzz_default.json, cli_conformance.json,
# cli_conformance.log, progress.log, failures.tgz (saved cases, if any).
#
#   GDN_COMMIT=<sha> bash reports/campaign/chunked_modes_h200.sh PATH/TO/gdn-testbed
#
# Environment: FUZZ_SECONDS (150), SHARDS (6), SEED (2001).
set -u -o pipefail
BIN=$(realpath "$1")
OUT=${OUT:-/tmp/out}
FUZZ_SECONDS=${FUZZ_SECONDS:-150}
SHARDS=${SHARDS:-6}
SEED=${SEED:-2001}
W=${WORKDIR:-/tmp/gdn-chunked-modes}
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$W" && mkdir -p "$W" "$OUT"
PROGRESS=$OUT/progress.log
note() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$PROGRESS"; }
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
note "device: $DEVICE; commit ${GDN_COMMIT:-?}"
for mode in single default; do
  impl=cuda.chunked_prefill
  [ $mode = single ] && impl=cuda.chunked_prefill.single
  mkdir -p "$W/$mode"
  for ((i = 0; i < SHARDS; i++)); do
    timeout $((FUZZ_SECONDS + 120)) "$BIN" fuzz --impl $impl --seed $SEED --seconds "$FUZZ_SECONDS" \
      --shard "$i/$SHARDS" --max-K 128 --K-multiple 16 --max-V 256 --max-work 4e6 --max-failures 4 --quiet \
      --out "$W/$mode" > "$W/$mode/shard_$i.log" 2>&1 &
  done
done
note "fuzz: $SHARDS shards per mode for ${FUZZ_SECONDS}s, seed $SEED"
wait
for mode in single default; do
  "$BIN" merge --out "$OUT/fuzz_$mode.json" "$W/$mode"/results-shard-*-of-"$SHARDS".json > "$W/merge_$mode.log" 2>&1
  note "fuzz $mode merged (rc $?): $(head -c 400 "$W/merge_$mode.log" | tr '\n' ' ')"
  python3 "$HERE/stamp_provenance.py" "$OUT/fuzz_$mode.json" "$DEVICE" "${GDN_COMMIT:-unknown}" \
    "bash reports/campaign/chunked_modes_h200.sh (FUZZ_SECONDS=$FUZZ_SECONDS SHARDS=$SHARDS SEED=$SEED)"
done
GDN_COMMIT=${GDN_COMMIT:-unknown} timeout 240 "$BIN" conformance --impl 'cuda.chunked_prefill*' \
  --json "$OUT/cli_conformance.json" > "$OUT/cli_conformance.log" 2>&1
note "conformance rc $?: $(tail -8 "$OUT/cli_conformance.log" | grep verdicts)"
tar czf "$OUT/failures.tgz" -C "$W" single default
note done
