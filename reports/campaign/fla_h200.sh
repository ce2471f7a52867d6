#!/usr/bin/env bash
# flash-linear-attention under gdn-testbed's oracle, on the GPU machine, in one bounded run:
#   1. a few hundred fuzzed case files at a handful of fixed shapes (make_cases.py says why
#      not `gdn-testbed generate`: fla compiles and autotunes per shape and flag set);
#   2. the adapter (reports/adapters/gdn_adapter.py, one Python process per function) runs
#      fla's chunk_gated_delta_rule and fused_recurrent_gated_delta_rule on every case;
#   3. `gdn-testbed verify` judges the outputs (CPU, in parallel shards, while the GPU works on
#      the next function), merge_verdicts.py joins the shards and adds device/date/commit.
#
# Usage, from the repository root:
#   bash reports/campaign/fla_h200.sh GDN_TESTBED_BINARY FLA_WHEEL_DIR
# e.g. bash reports/campaign/fla_h200.sh .carry/gdn-testbed .whl   (binary built on the host:
# verify needs no GPU). Every wheel in FLA_WHEEL_DIR is installed (--no-deps, into $WORK/site):
# fla_core-*.whl and what fla imports that the machine may lack (einops: fla.ops imports it);
# "-" uses an fla already importable. torch and Triton must be on the machine.
#
# Everything that comes back lands in $OUT (default /tmp/out), written as it goes:
#   campaign.log, make_cases.log, adapter_<label>.jsonl (one record per case, flushed),
#   adapter_<label>.log, verify_<label>.json (merged verdicts), verify_<label>.log,
#   failures/<label>/ (a few failing case files + REPLAY.md), summary.txt.
# Commit into reports/results/h200/fla/: the .jsonl and verify_*.json files, summary.txt.
#
# Environment: CAMPAIGN_SECONDS (default 540: the whole run, every stage bounded by timeout),
# PLAN (fla = 300 cases; small, tiny), SEED (1), LABELS ("fused_recurrent chunk": fla's two
# functions, the recurrent one first as it compiles fast and has no autotuning, the chunk one
# gets the time left; an entry LABEL=IMPL runs any gdn_adapter.py --impl, e.g. naive=naive),
# ADAPTER_DEVICE (cuda), VERIFY_JOBS (8 shards per function), PYTHON (python3), GDN_COMMIT
# (recorded as the commit; default: what gdn-testbed reports), WORK (/tmp/gdn-fla-campaign:
# the case files, a few hundred MB, never copied back whole).
set -u -o pipefail
if [ $# -lt 2 ]; then
  sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
BIN=$(realpath "$1")
WHEELS=$2
OUT=${OUT:-/tmp/out}
WORK=${WORK:-/tmp/gdn-fla-campaign}
PYTHON=${PYTHON:-python3}
PLAN=${PLAN:-fla}
SEED=${SEED:-1}
LABELS=${LABELS:-fused_recurrent chunk}
ADAPTER_DEVICE=${ADAPTER_DEVICE:-cuda}
VERIFY_JOBS=${VERIFY_JOBS:-8}
TOTAL=${CAMPAIGN_SECONDS:-540}
HERE=$(cd "$(dirname "$0")" && pwd)
REPORTS=$(cd "$HERE/.." && pwd)
START=$(date +%s)
mkdir -p "$OUT" "$WORK"
LOG=$OUT/campaign.log
log() { echo "== $(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s $*" | tee -a "$LOG"; }
left() { echo $(( TOTAL - ($(date +%s) - START) )); }
COMMAND="bash reports/campaign/fla_h200.sh $* (PLAN=$PLAN SEED=$SEED LABELS='$LABELS')"

if [ ! -x "$BIN" ]; then log "no gdn-testbed binary at $1"; exit 2; fi
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
[ -n "$DEVICE" ] || DEVICE=$ADAPTER_DEVICE
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
log "device: $DEVICE; gdn-testbed: $BIN; plan $PLAN seed $SEED; budget ${TOTAL}s"

if [ "$WHEELS" != "-" ]; then
  SITE=$WORK/site
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$WHEELS"/*.whl 2>&1 | tail -2 | tee -a "$LOG"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PYTHON" - <<'EOF' 2>&1 | tee -a "$LOG"
import importlib.metadata as m
import torch
def version(package):
    try:
        return m.version(package)
    except m.PackageNotFoundError:
        return None  # safetensors may be absent: the adapter's built-in codec stands in
print("python packages:", {p: version(p) for p in ("torch", "triton", "fla-core", "safetensors", "numpy")})
print("cuda available:", torch.cuda.is_available())
EOF

log "1: case files ($PLAN)"
rm -rf "$WORK/cases"
timeout 90 "$PYTHON" "$HERE/make_cases.py" --out "$WORK/cases" --plan "$PLAN" --seed "$SEED" \
  > "$OUT/make_cases.log" 2>&1
tail -1 "$OUT/make_cases.log" | tee -a "$LOG"
CASES=$(ls "$WORK/cases"/*.safetensors 2>/dev/null | wc -l)
if [ "$CASES" -eq 0 ]; then log "no case files: see make_cases.log"; exit 1; fi

# verify LABEL: shards the label's output files over VERIFY_JOBS processes, then merges; once
# with the default (calibrated) budget, once more with the fixed thresholds other projects use
# (verify_LABEL_fixed.json): a kernel that stores intermediates in bf16 or computes in TF32 by
# design fails the first and may pass the second, and the report shows both.
verify() {
  local label=$1 budget=$2
  local files=("$WORK/$label"/*.safetensors)
  if [ ! -e "${files[0]}" ]; then log "verify $label: no output files"; return; fi
  local model suffix
  for model in calibrated fixed; do
    suffix=""
    [ $model = fixed ] && suffix=_fixed
    rm -f "$WORK"/verify_"$label$suffix".*.json
    local i=0
    for ((i = 0; i < VERIFY_JOBS; i++)); do
      local shard=()
      local j
      for ((j = i; j < ${#files[@]}; j += VERIFY_JOBS)); do shard+=("${files[j]}"); done
      [ ${#shard[@]} -gt 0 ] || continue
      timeout "$budget" "$BIN" verify --budget $model --json "$WORK/verify_$label$suffix.$i.json" "${shard[@]}" \
        > "$WORK/verify_$label$suffix.$i.log" 2>&1 &
    done
    wait
    cat "$WORK"/verify_"$label$suffix".*.log > "$OUT/verify_$label$suffix.log"
    local failures=()
    [ $model = calibrated ] && failures=(--failures "$OUT/failures/$label" --max-failures 6 --max-failure-bytes 1048576)
    "$PYTHON" "$HERE/merge_verdicts.py" --out "$OUT/verify_$label$suffix.json" --device "$DEVICE" --date "$DATE" \
      ${GDN_COMMIT:+--commit "$GDN_COMMIT"} --command "$COMMAND (verify --budget $model)" "${failures[@]}" \
      "$WORK"/verify_"$label$suffix".*.json 2>&1 | tee -a "$LOG"
  done
}

PIDS=()
DONE_LABELS=""
for entry in $LABELS; do
  # "chunk" runs fla.chunk; "LABEL=IMPL" runs any --impl of gdn_adapter.py (tests use stand-ins).
  label=${entry%%=*}
  impl=fla.$entry
  [[ $entry == *=* ]] && impl=${entry#*=}
  DONE_LABELS="$DONE_LABELS $label"
  budget=$(( $(left) - 45 ))   # leave time for the last verify (seconds) and the summary
  if [ "$budget" -lt 20 ]; then log "no time left for $impl"; break; fi
  log "2: $impl on $CASES cases (at most ${budget}s)"
  rm -rf "$WORK/$label"
  rm -f "$OUT/adapter_$label.jsonl"
  : > "$OUT/adapter_$label.log"
  for attempt in 1 2 3; do
    # Exit 3: a device error poisoned the CUDA context; go on in a fresh process (--resume).
    PYTHONUNBUFFERED=1 timeout "$budget" "$PYTHON" "$REPORTS/adapters/gdn_adapter.py" --impl "$impl" \
      --device "$ADAPTER_DEVICE" --out-dir "$WORK/$label" --log "$OUT/adapter_$label.jsonl" --resume "$WORK/cases" \
      >> "$OUT/adapter_$label.log" 2>&1
    status=$?
    [ $status -ne 3 ] && break
    log "$impl: device error (attempt $attempt), resuming in a new process"
    budget=$(( $(left) - 45 ))
    [ "$budget" -lt 20 ] && break
  done
  [ $status -eq 124 ] && log "$impl: stopped by its time limit (the log holds every case it finished)"
  grep -v "Warning" "$OUT/adapter_$label.log" | tail -2 | tee -a "$LOG"
  # Judge this function's outputs on the CPU while the GPU runs the next one.
  verify_budget=$(( $(left) - 15 ))
  [ "$verify_budget" -lt 10 ] && verify_budget=10
  log "3: verify $label in $VERIFY_JOBS shards (at most ${verify_budget}s)"
  verify "$label" "$verify_budget" &
  PIDS+=($!)
done
wait "${PIDS[@]}" 2>/dev/null

{
  echo "fla campaign on $DEVICE, $DATE, plan $PLAN, seed $SEED, $CASES case files"
  echo "command: $COMMAND"
  for label in $DONE_LABELS; do
    [ -f "$OUT/adapter_$label.jsonl" ] || continue
    "$PYTHON" - "$OUT/adapter_$label.jsonl" "$OUT/verify_$label.json" "$OUT/verify_${label}_fixed.json" "$label" <<'EOF'
import collections, json, sys
log, verdicts, fixed, label = sys.argv[1:]
adapter = collections.Counter(json.loads(l)["status"] for l in open(log) if l.strip())
def summary(path):
    try:
        return json.load(open(path))["summary"]
    except (OSError, ValueError, KeyError):
        return "no verdicts"
print(f"{label}: adapter {dict(adapter)}; verify (calibrated) {summary(verdicts)}; verify (fixed) {summary(fixed)}")
EOF
  done
  echo "elapsed $(( $(date +%s) - START ))s"
} | tee "$OUT/summary.txt" | tee -a "$LOG"
