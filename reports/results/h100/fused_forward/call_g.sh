#!/usr/bin/env bash
# Device call G: a second CLI fuzz of every chunked mode with a new seed, alone on the GPU, so
# that with call F's the fuzz of each mode adds up to more than ten minutes.
# Carries .carry/call_f.tar.xz (the same binaries as call F). Brings back call.log and the fuzz
# phase's run.log and results archive.
#   DEADLINE=560 bash reports/results/h100/fused_forward/call_g.sh COMMIT
set -uo pipefail
COMMIT=${1:?commit}
OUT=${OUT:-/tmp/out}
DEADLINE=${DEADLINE:-560}
mkdir -p "$OUT" /tmp/bin
tar -C /tmp/bin -xJf .carry/call_f.tar.xz
LOG=$OUT/call.log
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%Y-%m-%dT%H:%M:%SZ; echo "commit $COMMIT"; } > "$LOG"
FUZZ=$((DEADLINE - SECONDS - 100))
bash scripts/gpu_run.sh --bin /tmp/bin --phases fuzz --seed 20261211 --fuzz-seconds "$FUZZ" --commit "$COMMIT" \
  --out "$OUT/fuzz" > /tmp/fuzz.log 2>&1
echo "fuzz exit $? at ${SECONDS}s" >> "$LOG"
{ echo "== fuzz"; grep -E "merge exit|failures|cases|pass" "$OUT/fuzz/run.log" | head -20; } >> "$LOG" 2>&1
cat "$LOG"
