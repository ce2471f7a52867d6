#!/usr/bin/env bash
# The whole H200 campaign of issue 5 in one bounded device call:
#   * flash-linear-attention's two functions on fuzzed case files (fla_h200.sh), and at the
#     same time
#   * a sharded fuzz campaign of gdn-testbed's own CUDA kernels (recurrent prefill, decode,
#     chunked prefill) against the double reference (`gdn-testbed fuzz`, one process per
#     shard on the one GPU: the CPU-side reference is the bottleneck), merged,
#   * then the conformance suite with every implementation, kernels included.
# Everything is packed into $OUT/h200_campaign.tgz (the device tool returns at most 8 files);
# progress.log is written to $OUT as it goes.
#
#   GDN_COMMIT=<sha> bash reports/campaign/h200_campaign.sh .carry/gdn-testbed .whl
#
# Environment: FUZZ_SECONDS (300), FUZZ_SHARDS (6), CAMPAIGN_SECONDS (420, fla), SEED (1),
# CONFORMANCE_SECONDS (240), FLA (1; 0 runs only the kernels' fuzz and the conformance),
# CHUNK_SHARDS (2: extra shards of the chunked prefill alone, K a multiple of 16).
set -u -o pipefail
BIN=$(realpath "$1")
WHEELS=$2
OUT=${OUT:-/tmp/out}
FUZZ_SECONDS=${FUZZ_SECONDS:-300}
FUZZ_SHARDS=${FUZZ_SHARDS:-6}
SEED=${SEED:-1}
WORKDIR=${WORKDIR:-/tmp/gdn-h200-campaign}
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$WORKDIR" && mkdir -p "$WORKDIR/fla" "$WORKDIR/fuzz" "$OUT"
PROGRESS=$OUT/progress.log
note() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$PROGRESS"; }
KERNELS=cuda.recurrent_prefill,cuda.decode,cuda.chunked_prefill
note "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); commit ${GDN_COMMIT:-?}"

# The kernels' fuzz campaign: K and V up to 256 (the recurrent kernels' limit; the chunked one
# reports what it does not support as SKIPPED), up to 4e6 work per case.
for ((i = 0; i < FUZZ_SHARDS; i++)); do
  timeout $((FUZZ_SECONDS + 120)) "$BIN" fuzz --impl "$KERNELS" --seed "$SEED" --seconds "$FUZZ_SECONDS" \
    --shard "$i/$FUZZ_SHARDS" --max-K 256 --max-V 256 --max-work 4e6 --max-failures 4 --quiet \
    --out "$WORKDIR/fuzz" > "$WORKDIR/fuzz/shard_$i.log" 2>&1 &
done
# The chunked prefill takes K in multiples of 16 up to 128: in the shards above 99.5% of its
# cases are SKIPPED. CHUNK_SHARDS more shards draw only from its case space (own seed).
CHUNK_SHARDS=${CHUNK_SHARDS:-2}
mkdir -p "$WORKDIR/fuzz_chunk"
for ((i = 0; i < CHUNK_SHARDS; i++)); do
  timeout $((FUZZ_SECONDS + 120)) "$BIN" fuzz --impl cuda.chunked_prefill --seed $((SEED + 1000)) \
    --seconds "$FUZZ_SECONDS" --shard "$i/$CHUNK_SHARDS" --max-K 128 --K-multiple 16 --max-V 256 --max-work 4e6 \
    --max-failures 4 --quiet --out "$WORKDIR/fuzz_chunk" > "$WORKDIR/fuzz_chunk/shard_$i.log" 2>&1 &
done
note "fuzz: $FUZZ_SHARDS shards of $KERNELS and $CHUNK_SHARDS of cuda.chunked_prefill (K % 16 == 0) for ${FUZZ_SECONDS}s started"

if [ "${FLA:-1}" != 0 ]; then
  OUT=$WORKDIR/fla timeout $((${CAMPAIGN_SECONDS:-420} + 60)) bash "$HERE/fla_h200.sh" "$BIN" "$WHEELS" \
    > "$WORKDIR/fla/stdout.log" 2>&1
  note "fla campaign done (rc $?): $(tail -3 "$WORKDIR/fla/summary.txt" 2>/dev/null | tr '\n' ' ')"
else
  note "fla campaign skipped (FLA=0)"
fi

wait
note "fuzz shards done"
"$BIN" merge --out "$WORKDIR/fuzz/merged.json" "$WORKDIR"/fuzz/results-shard-*-of-"$FUZZ_SHARDS".json \
  > "$WORKDIR/fuzz/merge.log" 2>&1
note "fuzz merged (rc $?): $(head -c 600 "$WORKDIR/fuzz/merge.log" | tr '\n' ' ')"
# A separate campaign (own seed and shard count): merged on its own.
if ((CHUNK_SHARDS > 0)); then
  "$BIN" merge --out "$WORKDIR/fuzz_chunk/merged.json" "$WORKDIR"/fuzz_chunk/results-shard-*-of-"$CHUNK_SHARDS".json \
    > "$WORKDIR/fuzz_chunk/merge.log" 2>&1
  note "chunked fuzz merged (rc $?): $(head -c 600 "$WORKDIR/fuzz_chunk/merge.log" | tr '\n' ' ')"
fi
# Provenance for the reports: the merge step knows the shards, not where they ran.
for merged in "$WORKDIR/fuzz/merged.json" "$WORKDIR/fuzz_chunk/merged.json"; do
[ -f "$merged" ] || continue
python3 "$HERE/stamp_provenance.py" "$merged" "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
  "${GDN_COMMIT:-unknown}" "bash reports/campaign/h200_campaign.sh (FUZZ_SECONDS=$FUZZ_SECONDS FUZZ_SHARDS=$FUZZ_SHARDS SEED=$SEED)"
done

timeout "${CONFORMANCE_SECONDS:-240}" "$BIN" conformance --json "$WORKDIR/conformance_all.json" --junit "$WORKDIR/conformance_all.xml" \
  > "$WORKDIR/conformance_all.log" 2>&1
note "conformance (rc $?): $(tail -2 "$WORKDIR/conformance_all.log" | tr '\n' ' ')"

tar czf "$OUT/h200_campaign.tgz" -C "$WORKDIR" --exclude='fla/site' --exclude='*/cases' --exclude='*.original.safetensors' . 2>>"$PROGRESS"
ls -la "$OUT" | tee -a "$PROGRESS"
