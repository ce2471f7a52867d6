#!/usr/bin/env bash
# The one entry point for GPU work: runs the phases asked for on the device machine and writes
# one result set, reports/results/<kind>/ (layout in reports/README.md), packed into one archive
# because the device tool returns at most 8 files.
#
#   bash scripts/gpu_run.sh --bin DIR --phases suite,sanitize,bench,peers,accuracy,campaign \
#        [--cases N] [--sanitize-cases N] [--seed S] [--commit SHA] [--wheels DIR] [--out DIR]
#
# --bin       the binaries built and packed by scripts/pack.sh (a folder, or the .tar.xz itself)
# --phases    any of:
#   suite     the GPU testbed (cuda_gpu_tests) on --cases random cases per kernel and property
#             -> conformance.json, suite.log
#   sanitize  compute-sanitizer memcheck, racecheck, initcheck and synccheck on the whole suite
#             at --sanitize-cases cases -> sanitize.json, sanitize.log
#   bench     the Google Benchmark binaries, each alone on the GPU -> bench_<family>.json
#             (recurrent, decode, chunked, backward)
#   peers     other libraries' kernels at the same shapes (wheels from --wheels) -> peer_*.json
#   backward_peers  fla's (Triton) and FlashQLA's backward under autograd at the backward
#             benchmark's shapes, with their run-to-run bit differences (site from --site)
#             -> peer_backward_fla_triton.json, peer_backward_flash_qla.json
#   accuracy  the chunked prefill beside its peers on the same inputs: fla's Triton chunk
#             (FLA_FLASH_QLA=0) and, with --site, FlashQLA -> accuracy_chunked.json
#   campaign  the CLI as a user runs it: `conformance` with every kernel, a `fuzz` campaign of the
#             kernels, fla's functions generated / adapted / verified -> campaign/
#   fuzz      the CLI's fuzz of every chunked mode (cuda.chunked_prefill, .split1, .single and
#             .bv128.unsplit.fused) on the kernel's own space (--preset chunked_prefill, V up to
#             256; bf16/fp16 for .split1 and .single, which take no fp32; bf16 for the fused
#             forward, which reports the cases it does not run as skipped), --fuzz-seconds each, the modes side by side in 4
#             shards each; the cases come from --seed
#             -> fuzz_chunked/<mode>.json and the failures' case files
# --fuzz-seconds, --campaign-plan   the campaign's and the fuzz phase's fuzz time (150) and the
#             campaign's case plan (fla: make_cases.py)
# --backward-peers  which backward_peers backends run (default "fla_triton,flash_qla")
# --only      restrict suite, sanitize and bench to these kernel families (comma-separated of
#             recurrent, decode, decode_streamed, chunked, single, backward; default all)
# --site      a packed site folder (python/gpu/pack_site.sh's site.tar.xz: fla, flash-qla and
#             their dependencies) put on PYTHONPATH for backward_peers and accuracy (without it,
#             accuracy takes fla from --wheels and has no FlashQLA)
# --tilelang-cache  a TileLang kernel cache packed as tlcache/ in a .tar.xz (a compile of FlashQLA's
#             kernels brought back from an earlier call): backward_peers then times FlashQLA without
#             compiling. Its kernels are keyed by their source, so a stale cache only costs compiles.
# --out       where the archive and the logs go (default $OUT, else /tmp/out)
#
# What comes back: results-<kind>.tar.xz (the result set, to unpack into reports/results/) and
# run.log. The manifest (manifest-<phases>.json, one a run, so that runs of different phases can
# share a kind's folder) names the device, driver, date, commit, command and phases; every file
# in the set carries the same provenance.
set -u -o pipefail

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
BIN="" PHASES="" CASES=1000 SAN_CASES=4 SEED=20261202 COMMIT=unknown WHEELS=.whl OUTDIR=${OUT:-/tmp/out}
FUZZ_SECONDS=150 CAMPAIGN_PLAN=fla SITE="" ONLY="" BACKWARD_PEERS="fla_triton,flash_qla" TL_CACHE=""
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --phases) PHASES=$2; shift 2 ;;
    --cases) CASES=$2; shift 2 ;;
    --sanitize-cases) SAN_CASES=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --commit) COMMIT=$2; shift 2 ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --fuzz-seconds) FUZZ_SECONDS=$2; shift 2 ;;
    --campaign-plan) CAMPAIGN_PLAN=$2; shift 2 ;;
    --site) SITE=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --backward-peers) BACKWARD_PEERS=$2; shift 2 ;;
    --tilelang-cache) TL_CACHE=$2; shift 2 ;;
    --out) OUTDIR=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "gpu_run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$BIN" ] || { echo "gpu_run.sh: --bin is required" >&2; exit 2; }
[ -n "$PHASES" ] || { echo "gpu_run.sh: --phases is required" >&2; exit 2; }
for p in ${PHASES//,/ }; do
  case $p in suite|sanitize|bench|peers|backward_peers|accuracy|campaign|fuzz) ;; *) echo "gpu_run.sh: unknown phase '$p'" >&2; exit 2 ;; esac
done
has() { [[ ",$PHASES," == *",$1,"* ]]; }
wanted() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }

REPO=$(pwd)
mkdir -p "$OUTDIR"
if [ -f "$BIN" ]; then
  mkdir -p /tmp/gdn_bin && tar -C /tmp/gdn_bin -xJf "$BIN" || exit 3
  BIN=/tmp/gdn_bin
fi
BIN=$(realpath "$BIN")
export LD_LIBRARY_PATH=$BIN:${LD_LIBRARY_PATH:-}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
case $GPU in *H200*) KIND=h200 ;; *H100*) KIND=h100 ;; *) KIND=$(echo "$GPU" | tr -cd 'A-Za-z0-9' | tr A-Z a-z) ;; esac
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# Per invocation, so that two runs side by side (the fuzz beside the suite) keep their results.
ROOT=/tmp/gdn_results.$$
SET=$ROOT/$KIND
rm -rf "$ROOT" && mkdir -p "$SET"
LOG=$OUTDIR/run.log
: > "$LOG"
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
log "device: $GPU (driver $DRIVER) -> results/$KIND; commit $COMMIT; phases $PHASES"
CMDLINE="bash scripts/gpu_run.sh --phases $PHASES"
(has suite || has sanitize || has accuracy) && CMDLINE="$CMDLINE --cases $CASES"
has sanitize && CMDLINE="$CMDLINE --sanitize-cases $SAN_CASES"
CMDLINE="$CMDLINE --seed $SEED${ONLY:+ --only $ONLY}"
has fuzz && CMDLINE="$CMDLINE --fuzz-seconds $FUZZ_SECONDS"
has backward_peers && CMDLINE="$CMDLINE --backward-peers $BACKWARD_PEERS"
# Provenance every tool records (benchmarks as context, tests and peers in their JSON).
CONTEXT=(--context "device=$GPU" --context "driver=$DRIVER" --context "date=$DATE" --context "commit=$COMMIT"
         --context "command=$CMDLINE")

python3 - "$SET/manifest-${PHASES//,/+}.json" "$GPU" "$DRIVER" "$DATE" "$COMMIT" "$CMDLINE" "$PHASES" "$CASES" <<'PY'
import json, sys
path, device, driver, date, commit, command, phases, cases = sys.argv[1:]
json.dump({"format": "gdn-manifest/1", "device": device, "driver": driver, "date": date, "commit": commit, "command": command,
           "phases": phases.split(","), "cases": int(cases)}, open(path, "w"), indent=1)
PY

WHEELS_READY=0
install_wheels() {
  [ $WHEELS_READY = 1 ] && return 0
  if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$WHEELS"/*.whl >> "$LOG" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  WHEELS_READY=1
}

# Peers compile (Triton autotunes) on first use: warm them up in the background while our own
# binaries run on the CPU-heavy phases; everything timed runs alone on the GPU afterwards.
# Without such phases the warm-up runs alone, after the benchmarks (never beside a timing).
WARM=""
warm_up() {
  PYTHONUNBUFFERED=1 timeout 300 python3 cuda/peers/fla_chunk.py --warmup > /tmp/warm_chunk.log 2>&1
}
if has peers && (has suite || has sanitize); then
  install_wheels
  log "peers: warm-up in the background"
  warm_up &
  WARM=$!
fi
# The backward's peers come as one packed site folder (fla, FlashQLA, TileLang): Triton and
# TileLang compile their backward kernels on first use, so they warm up beside the suite too.
BACKWARDS=${BACKWARD_PEERS//,/ }
WARM_BACKWARD=""
if has backward_peers; then
  [ -f "$SITE" ] || { log "backward_peers: --site is required"; exit 2; }
fi
if [ -f "$SITE" ] && (has backward_peers || has accuracy); then
  mkdir -p /tmp/bsite && tar -C /tmp/bsite -xJf "$SITE" || exit 3
  if [ -n "$TL_CACHE" ]; then
    tar -C /tmp -xJf "$TL_CACHE" || exit 3
    export TILELANG_CACHE_DIR=/tmp/tlcache
    log "TileLang cache from $TL_CACHE ($(du -sh /tmp/tlcache | cut -f1))"
  fi
  if has backward_peers && (has suite || has sanitize); then
    log "backward_peers: warm-up in the background"
    ( for b in $BACKWARDS; do
        PYTHONPATH=/tmp/bsite PYTHONUNBUFFERED=1 timeout 280 python3 cuda/peers/backward_peers.py --backend $b --warmup
      done > /tmp/warm_backward.log 2>&1 ) &
    WARM_BACKWARD=$!
  fi
fi

# The suite and the four sanitizers are correctness runs, CPU-bound on the references: they run
# side by side (16 cores there), each under its own timeout.
SUITE_PIDS=()
# Ten processes, a kernel family's conformance and the rest of its properties apart (the
# references are single-threaded); their tallies are merged.
SUITE_PARTS=()
for family in recurrent decode decode_streamed chunked single backward; do
  wanted $family || continue
  tag="[$family]"; [ $family = chunked ] && tag="[chunked]~[single]"
  SUITE_PARTS+=("$tag[conformance]" "$tag~[conformance]")
done
if has suite; then
  log "suite: cuda_gpu_tests, $CASES cases, ${#SUITE_PARTS[@]} processes"
  for i in "${!SUITE_PARTS[@]}"; do
    ( timeout 560 "$BIN/cuda_gpu_tests" --cases "$CASES" --seed "$SEED" --json "/tmp/conformance_$i.json" \
        --commit "$COMMIT" --command "$CMDLINE" -r compact "${SUITE_PARTS[$i]}" > "/tmp/suite_$i.log" 2>&1
      echo "suite ${SUITE_PARTS[$i]} exit $?" >> "/tmp/suite_$i.log" ) &
    SUITE_PIDS+=($!)
  done
fi
TOOLS="memcheck racecheck initcheck synccheck"
if has sanitize; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  # Two filters a tool: the recurrent and decode kernels on their common properties, and the
  # chunked kernel's paths (trace, split, transposed tile, invariance, single mode) at fewer
  # cases (its instances are large under racecheck).
  CHUNKED_SAN="[trace],[split],[transposed],[chunked][invariance],[single][conformance],[flush]"
  SAN_FILTERS=("~[chunked]~[properties]" "$CHUNKED_SAN")
  if [ -n "$ONLY" ]; then
    # The chunked family and its single mode: the chunked filter above (the whole [chunked] tag
    # is too large under racecheck); the other families whole.
    others=$(for f in ${ONLY//,/ }; do [ $f = chunked ] || [ $f = single ] || printf '[%s],' "$f"; done | sed 's/,$//')
    SAN_FILTERS=()
    [ -n "$others" ] && SAN_FILTERS+=("$others")
    (wanted chunked || wanted single) && SAN_FILTERS+=("$CHUNKED_SAN")
  fi
  SAN_COUNTS=("$SAN_CASES" "$(( SAN_CASES > 2 ? SAN_CASES / 2 : 1 ))")
  [ "${SAN_FILTERS[0]}" = "$CHUNKED_SAN" ] && SAN_COUNTS=("$(( SAN_CASES > 2 ? SAN_CASES / 2 : 1 ))")
  for tool in $TOOLS; do
    log "sanitize: $tool"
    extra=""
    [ $tool = racecheck ] && extra="--racecheck-report hazard"
    ( worst=0
      for i in "${!SAN_FILTERS[@]}"; do
        echo "---- $tool ${SAN_FILTERS[$i]} (--cases ${SAN_COUNTS[$i]})"
        timeout 270 "$CS" --tool $tool $extra --error-exitcode 9 "$BIN/cuda_gpu_tests" --cases "${SAN_COUNTS[$i]}" \
          --seed "$SEED" -r compact "${SAN_FILTERS[$i]}" 2>&1
        rc=$?; [ $rc -gt $worst ] && worst=$rc
      done > /tmp/san_$tool.log
      echo "$tool exit $worst" >> /tmp/san_$tool.log ) &
  done
fi
# The archive is rewritten after every phase: a call stopped at its time limit still returns
# what finished.
pack_results() { tar -C "$ROOT" -cJf "$OUTDIR/results-$KIND.tar.xz.tmp" "$KIND" &&
                 mv "$OUTDIR/results-$KIND.tar.xz.tmp" "$OUTDIR/results-$KIND.tar.xz"; }
wait_phase() { while kill -0 "$1" 2>/dev/null; do sleep 5; done; }
if has suite; then
  for pid in "${SUITE_PIDS[@]}"; do wait_phase $pid; done
  for i in "${!SUITE_PARTS[@]}"; do
    cat "/tmp/suite_$i.log" >> "$SET/suite.log"
    tail -1 "/tmp/suite_$i.log" | tee -a "$LOG"
    grep -E "test cases|assertions|FAILED|failed" "/tmp/suite_$i.log" | head -20 | tee -a "$LOG"
  done
  python3 - "$SET/conformance.json" /tmp/conformance_*.json <<'PY'
import json, sys
# The parts' tallies, summed per kernel and property (a test tagged for two families runs in both).
out, parts = sys.argv[1], sys.argv[2:]
merged, kernels, exits = None, {}, []
for path in parts:
    try:
        data = json.load(open(path))
    except (OSError, ValueError) as error:
        print(f"suite: {path}: {error}")
        exits.append(-1)
        continue
    merged = merged or data
    exits.append(data.get("catch_exit_code", -1))
    for kernel, k in data.get("kernels", {}).items():
        into = kernels.setdefault(kernel, {"properties": {}, "run": 0, "failed": 0, "skipped": 0})
        for prop, c in k.get("properties", {}).items():
            p = into["properties"].setdefault(prop, {"run": 0, "failed": 0, "skipped": 0, "worst_margin": 0})
            for key in ("run", "failed", "skipped"):
                p[key] += c[key]
                into[key] += c[key]
            p["worst_margin"] = max(p["worst_margin"], c.get("worst_margin", 0))
if merged is not None:
    merged["kernels"] = kernels
    merged["catch_exit_code"] = max(exits, key=abs)
    merged["parts"] = len(parts)
    json.dump(merged, open(out, "w"), indent=1)
PY
  pack_results
fi
if has sanitize; then
  for tool in $TOOLS; do
    while ! grep -q "^$tool exit" /tmp/san_$tool.log 2>/dev/null; do sleep 5; done
  done
  : > "$SET/sanitize.log"
  rc_of() { sed -n "s/^$1 exit //p" /tmp/san_$1.log; }
  for tool in $TOOLS; do
    { echo "---- $tool"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|exit|test cases|Invalid|Uninitialized|hazard" /tmp/san_$tool.log | head -30
      echo "---- $tool (tail)"; tail -20 /tmp/san_$tool.log; } >> "$SET/sanitize.log"
    grep -E "SUMMARY|exit" /tmp/san_$tool.log | tee -a "$LOG"
  done
  python3 reports/collect_sanitize.py --out "$SET/sanitize.json" --device "$GPU" --commit "$COMMIT" \
    --command "$CMDLINE" --filter "$(for i in "${!SAN_FILTERS[@]}"; do printf '%s (%s cases); ' "${SAN_FILTERS[$i]}" "${SAN_COUNTS[$i]}"; done)" \
    memcheck=/tmp/san_memcheck.log:$(rc_of memcheck) racecheck=/tmp/san_racecheck.log:$(rc_of racecheck) \
    initcheck=/tmp/san_initcheck.log:$(rc_of initcheck) synccheck=/tmp/san_synccheck.log:$(rc_of synccheck) \
    2>&1 | tee -a "$LOG"
  pack_results
fi

if [ -n "$WARM" ]; then
  log "waiting for the peers' warm-up"
  wait $WARM
  tail -3 /tmp/warm_chunk.log 2>/dev/null | tee -a "$LOG"
fi
if [ -n "$WARM_BACKWARD" ]; then
  log "waiting for the backward peers' warm-up"
  wait $WARM_BACKWARD
  tail -4 /tmp/warm_backward.log 2>/dev/null | tee -a "$LOG"
fi

if has bench; then
  for family in decode recurrent chunked backward; do
    wanted $family || continue
    [ -x "$BIN/cuda_${family}_bench" ] || { log "bench: $family not in the binaries"; continue; }
    log "bench: $family"
    limit=200; [ $family = decode ] && limit=300; [ $family = chunked ] && limit=280
    timeout $limit "$BIN/cuda_${family}_bench" --benchmark_out="$SET/bench_$family.json" --benchmark_out_format=json \
      --benchmark_counters_tabular=true "${CONTEXT[@]}" 2>&1 | grep -vE "^\s*$" >> "$LOG"
    echo "bench $family exit $?" | tee -a "$LOG"
    pack_results
  done
fi

if has peers && [ -z "$WARM" ]; then
  install_wheels
  log "peers: warm-up"
  warm_up
  tail -2 /tmp/warm_chunk.log | tee -a "$LOG"
fi

if has peers; then
  install_wheels
  for peer in fla_recurrent fla_chunk; do
    log "peers: $peer"
    PYTHONUNBUFFERED=1 timeout 200 python3 cuda/peers/$peer.py --out "$SET/peer_$peer.json" --commit "$COMMIT" \
      --command "$CMDLINE" 2>&1 | grep -vE "Warning|warn" | tail -15 | tee -a "$LOG"
    pack_results
  done
fi

if has backward_peers; then
  for b in $BACKWARDS; do
    log "backward_peers: $b"
    PYTHONPATH=/tmp/bsite PYTHONUNBUFFERED=1 timeout 200 python3 cuda/peers/backward_peers.py --backend $b \
      --out "$SET/peer_backward_$b.json" --commit "$COMMIT" --command "$CMDLINE" 2>&1 | grep -vE "Warning|warn" \
      | tail -8 | tee -a "$LOG"
    pack_results
  done
fi

if has accuracy; then
  # The peers run on the cases' inputs through the case-file driver; fla with its Triton backend
  # (FLA_FLASH_QLA=0, so that the FlashQLA in the site does not take its calls), FlashQLA itself
  # when the site has it. A peer that does not take a case (FlashQLA: fp32) leaves no output file:
  # the judge records it as missing.
  log "accuracy: the chunked prefill beside its peers on the same inputs"
  rm -rf /tmp/acc /tmp/acc_fla /tmp/acc_qla
  "$BIN/cuda_chunked_accuracy" cases /tmp/acc >> "$LOG" 2>&1
  if [ -f "$SITE" ]; then ACC_PATH=/tmp/bsite; else install_wheels; ACC_PATH=${PYTHONPATH:-}; fi
  ACC_PEERS=()
  PYTHONPATH=$ACC_PATH FLA_FLASH_QLA=0 timeout 360 python3 reports/adapters/gdn_adapter.py --impl fla.chunk --device cuda \
    --out-dir /tmp/acc_fla /tmp/acc 2>&1 | tail -4 | tee -a "$LOG"
  ACC_PEERS+=(--peer "fla.chunk_gated_delta_rule[triton]=/tmp/acc_fla")
  if PYTHONPATH=$ACC_PATH python3 -c "import flash_qla" 2>/dev/null; then
    PYTHONPATH=$ACC_PATH timeout 300 python3 reports/adapters/gdn_adapter.py --impl flash_qla.chunk --device cuda \
      --out-dir /tmp/acc_qla /tmp/acc 2>&1 | grep -vE "Warning|warn|INFO" | tail -4 | tee -a "$LOG"
    ACC_PEERS+=(--peer "flash_qla.chunk_gated_delta_rule=/tmp/acc_qla")
  else
    log "accuracy: no flash_qla on the path (--site): FlashQLA not judged"
  fi
  timeout 120 "$BIN/cuda_chunked_accuracy" judge /tmp/acc "$SET/accuracy_chunked.json" "${ACC_PEERS[@]}" --commit "$COMMIT" \
    --command "$CMDLINE (commit $COMMIT, $GPU, $DATE)" 2>&1 | tail -20 | tee -a "$LOG"
fi

if has campaign; then
  install_wheels
  CLI=$BIN/gdn-testbed
  RAW=/tmp/campaign
  rm -rf "$RAW" && mkdir -p "$RAW" "$SET/campaign"
  # The kernels' fuzz campaign runs on the CPU side (references) while fla works on the GPU.
  log "campaign: fuzz of the kernels, ${FUZZ_SECONDS}s, 4 shards"
  for i in 0 1 2 3; do
    timeout $((FUZZ_SECONDS + 60)) "$CLI" fuzz --impl 'cuda.*' --seed "$SEED" --seconds "$FUZZ_SECONDS" \
      --shard "$i/4" --max-K 256 --max-V 256 --max-work 4e6 --max-failures 4 --quiet --out "$RAW/fuzz" \
      > "$RAW/fuzz_$i.log" 2>&1 &
  done
  # The chunked prefill takes K in multiples of 16 up to 128: in the shards above most of its
  # cases are skipped, so two more shards draw from its space alone (their own seed and merge).
  for i in 0 1; do
    timeout $((FUZZ_SECONDS + 60)) "$CLI" fuzz --impl 'cuda.chunked*' --seed $((SEED + 1000)) \
      --seconds "$FUZZ_SECONDS" --shard "$i/2" --max-K 128 --K-multiple 16 --max-V 256 --max-work 4e6 \
      --max-failures 4 --quiet --out "$RAW/fuzz_chunked" > "$RAW/fuzz_chunked_$i.log" 2>&1 &
  done
  log "campaign: fla's functions on fuzzed case files (plan $CAMPAIGN_PLAN)"
  timeout 90 python3 reports/campaign/make_cases.py --plan "$CAMPAIGN_PLAN" --seed "$SEED" --out "$RAW/cases" \
    > "$RAW/make_cases.log" 2>&1
  tail -1 "$RAW/make_cases.log" | tee -a "$LOG"
  for label in fused_recurrent chunk; do
    PYTHONUNBUFFERED=1 timeout 240 python3 reports/adapters/gdn_adapter.py --impl fla.$label --device cuda \
      --out-dir "$RAW/$label" --log "$RAW/adapter_$label.jsonl" --resume "$RAW/cases" > "$RAW/adapter_$label.log" 2>&1
    echo "adapter $label exit $?" | tee -a "$LOG"
    for budget in calibrated fixed; do
      suffix=""; [ $budget = fixed ] && suffix=_fixed
      files=("$RAW/$label"/*.safetensors)
      [ -e "${files[0]}" ] || continue
      pids=()
      for i in 0 1 2 3 4 5 6 7; do
        shard=(); for ((j = i; j < ${#files[@]}; j += 8)); do shard+=("${files[j]}"); done
        [ ${#shard[@]} -gt 0 ] || continue
        timeout 200 "$CLI" verify --budget $budget --json "$RAW/v_$label$suffix.$i.json" "${shard[@]}" \
          > "$RAW/v_$label$suffix.$i.log" 2>&1 &
        pids+=($!)
      done
      wait "${pids[@]}"
      python3 reports/campaign/merge_verdicts.py --out "$RAW/verify_$label$suffix.json" --device "$GPU" --date "$DATE" \
        --commit "$COMMIT" --command "$CMDLINE (verify --budget $budget)" "$RAW"/v_"$label$suffix".*.json 2>&1 | tee -a "$LOG"
      rm -f "$RAW"/v_"$label$suffix".*.json
    done
  done
  wait
  "$CLI" merge --out "$RAW/fuzz_merged.json" "$RAW"/fuzz/results-shard-*-of-4.json >> "$LOG" 2>&1
  echo "fuzz merge exit $?" | tee -a "$LOG"
  "$CLI" merge --out "$RAW/fuzz_chunked_merged.json" "$RAW"/fuzz_chunked/results-shard-*-of-2.json >> "$LOG" 2>&1
  echo "chunked fuzz merge exit $?" | tee -a "$LOG"
  for merged in "$RAW/fuzz_merged.json" "$RAW/fuzz_chunked_merged.json"; do
    python3 reports/campaign/stamp_provenance.py "$merged" "$GPU" "$COMMIT" "$CMDLINE" 2>&1 | tee -a "$LOG"
  done
  log "campaign: conformance with every implementation"
  timeout 240 "$CLI" conformance --no-golden --json "$RAW/conformance_all.json" > "$RAW/conformance.log" 2>&1
  echo "conformance exit $?" | tee -a "$LOG"
  tail -4 "$RAW/conformance.log" | tee -a "$LOG"
  rm -rf "$RAW/cases" "$RAW/chunk" "$RAW/fused_recurrent"
  python3 reports/campaign/summarize_campaign.py --raw "$RAW" --out "$SET/campaign/summary.json" --device "$GPU" \
    --commit "$COMMIT" --command "$CMDLINE" --date "$DATE" 2>&1 | tail -3 | tee -a "$LOG"
  mkdir -p "$SET/campaign/failures"
  find "$RAW/fuzz" "$RAW/fuzz_chunked" -name '*.safetensors' ! -name '*.original.*' | head -4 | xargs -r cp -t "$SET/campaign/failures"
fi

if has fuzz; then
  # The chunked modes fuzzed side by side (the references run on the CPU, 16 cores there), each
  # on the chunked kernel's space (fuzz::CaseSpace::chunked_prefill: K and V multiples of 16,
  # dense k-major states, no per-token states) with V up to 256, so that no time goes to cases
  # the kernel does not take.
  CLI=$BIN/gdn-testbed
  RAW=/tmp/fuzz_chunked
  rm -rf "$RAW" && mkdir -p "$RAW" "$SET/fuzz_chunked/failures"
  MODES="cuda.chunked_prefill cuda.chunked_prefill.split1 cuda.chunked_prefill.single cuda.chunked_prefill.bv128.unsplit.fused"
  log "fuzz: $MODES, ${FUZZ_SECONDS}s each, 4 shards each"
  for mode in $MODES; do
    DTYPES=""
    [ "$mode" != cuda.chunked_prefill ] && DTYPES="--dtypes bf16,f16"
    [ "$mode" = cuda.chunked_prefill.bv128.unsplit.fused ] && DTYPES="--dtypes bf16"
    for i in 0 1 2 3; do
      timeout $((FUZZ_SECONDS + 90)) "$CLI" fuzz --impl "$mode" --seed $((SEED + 2000)) --seconds "$FUZZ_SECONDS" \
        --shard "$i/4" --preset chunked_prefill --max-V 256 --max-work 4e6 $DTYPES --max-failures 4 --quiet \
        --out "$RAW/$mode" > "$RAW/$mode.$i.log" 2>&1 &
    done
  done
  wait
  for mode in $MODES; do
    "$CLI" merge --out "$SET/fuzz_chunked/$mode.json" "$RAW/$mode"/results-shard-*-of-4.json >> "$LOG" 2>&1
    echo "fuzz $mode merge exit $?" | tee -a "$LOG"
    python3 reports/campaign/stamp_provenance.py "$SET/fuzz_chunked/$mode.json" "$GPU" "$COMMIT" "$CMDLINE" 2>&1 | tee -a "$LOG"
    tail -2 "$RAW/$mode.0.log" | tee -a "$LOG"
    find "$RAW/$mode" -name '*.safetensors' ! -name '*.original.*' | head -2 | xargs -r cp -t "$SET/fuzz_chunked/failures"
  done
  pack_results
fi

log "packing results/$KIND"
pack_results
ls -la "$OUTDIR" | tee -a "$LOG"
log "done"
