#!/usr/bin/env bash
# A/B run of small-batch decode (and the prefill rows that share its kernel file) on the device
# machine, from the repository root: the binaries of this checkout (.carry-rec/rec.tar.xz, from
# cuda/pack_recurrent.sh) against a baseline build (.carry-old/rec.tar.xz, the same pack of an
# older commit; optional), and flash-linear-attention's decode, interleaved over several rounds
# so that the drift between rounds shows beside the differences.
#   T: the GPU tests of this build at GDN_CASES (default 300) cases per property;
#   D: decode rows (graph mode, held): this build, this build with GDN_DECODE_TOKEN_KERNEL=0
#      (the general kernel), the baseline, then fla's decode (FLA_ONLY=decode), per round;
#   C: the one-token kernel against the general kernel (GDN_DECODE_TOKEN_KERNEL=0) at 1 to 64
#      requests, two rounds;
#   P: prefill rows, this build and the baseline, per round;
#   S: streamed decode rows (graph mode, held) from 248 to 1024 requests, this build and the
#      baseline (which lacks the rows it never had), two rounds;
#   N: Nsight Compute of a one-request decode with a warm L2 (this build; cuda/profile_h200.sh W).
# Environment: GDN_COMMIT, GDN_BASELINE (its commit), GDN_ROUNDS (default 3), GDN_PHASES
# (default TDP). Output in $OUT: latency.log (every row, in order), decode_<variant>_r<round>.json,
# prefill_<variant>_r<round>.json, fla_r<round>/fla_recurrent.json, conformance.json (the JSON files
# packed into results.tar.gz at the end), tests.log.
set -u -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
PHASES=${GDN_PHASES:-TDP}
ROUNDS=${GDN_ROUNDS:-3}
export GDN_COMMIT=${GDN_COMMIT:-unknown}
BASELINE=${GDN_BASELINE:-baseline}
LOG=$OUT/latency.log
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
mkdir -p .carry && tar -C .carry -xJf .carry-rec/rec.tar.xz
HAVE_OLD=0
# The baseline pack may hold only some of the binaries (a variant whose binary is absent is skipped).
if [ -f .carry-old/rec.tar.xz ]; then mkdir -p .carry-old-bin && tar -C .carry-old-bin -xJf .carry-old/rec.tar.xz && HAVE_OLD=1; fi
export GDN_DEVICE=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
log "device: $GDN_DEVICE; commit $GDN_COMMIT; baseline $BASELINE (present: $HAVE_OLD)"

if [[ $PHASES == *T* ]]; then
  log "T: GPU tests, ${GDN_CASES:-300} cases"
  GDN_CASES=${GDN_CASES:-300} GDN_CONFORMANCE_JSON=$OUT/conformance.json \
    GDN_COMMAND="GDN_CASES=${GDN_CASES:-300} .carry/cuda_gpu_tests -r compact (cuda/latency_h200.sh)" \
    timeout 240 .carry/cuda_gpu_tests -r compact > "$OUT/tests.log" 2>&1
  echo "tests exit $?" | tee -a "$LOG"
  tail -4 "$OUT/tests.log" | tee -a "$LOG"
fi

# name and ns of each row of a Google Benchmark JSON file
rows() { python3 -c 'import json,sys
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    print(b["name"], round(b["real_time"]), "ns")' "$1"; }
bench() {  # variant binary-dir binary json filter [env...]
  local variant=$1 dir=$2 binary=$3 json=$4 filter=$5
  shift 5
  [ -x "$dir/$binary" ] || return 0
  env "$@" timeout 120 "$dir/$binary" --benchmark_filter="$filter" --benchmark_out="$OUT/$json" \
    --benchmark_out_format=json > /dev/null 2>&1
  rows "$OUT/$json" | sed "s/^/$variant /" | tee -a "$LOG"
}
DECODE='BM_decode/batch:(1|2|8|64)/column_lanes:0/status:0/graph:1/general:0/v_major:[01]/wide:0/held:1/runtime_sizes:0/narrow:0'
PREFILL='BM_prefill/sequences:(1|4|8|64)/length:(8192|4096|256|0|-1)/column_lanes:0/runtime_sizes:0/narrow:0'

if [[ $PHASES == *D* ]]; then
  [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl 2>&1 | tail -2 | tee -a "$LOG"
  for round in $(seq "$ROUNDS"); do
    log "D: round $round"
    bench new .carry cuda_bench_decode "decode_new_r$round.json" "$DECODE"
    bench general .carry cuda_bench_decode "decode_general_r$round.json" "$DECODE" GDN_DECODE_TOKEN_KERNEL=0
    [ $HAVE_OLD = 1 ] && bench "$BASELINE" .carry-old-bin cuda_bench_decode "decode_old_r$round.json" "$DECODE"
    [ -d .whl ] && FLA_ONLY=decode OUT=$OUT/fla_r$round PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
      GDN_COMMAND="FLA_ONLY=decode python3 cuda/peers/fla_recurrent.py (cuda/latency_h200.sh)" \
      bash -c 'mkdir -p $OUT && timeout 120 python3 cuda/peers/fla_recurrent.py' 2>&1 | grep '"batch"' |
      python3 -c 'import json,sys
for l in sys.stdin:
    e=json.loads(l); print("fla batch:%d held %.0f ns do_bench %.0f ns" % (e["batch"], e["held_ms"]*1e6, e["ms"]*1e6))' |
      tee -a "$LOG"
  done
fi

if [[ $PHASES == *C* ]]; then
  # The one-token kernel against the general one at 1 to 64 requests (general:1 forces the
  # non-streamed path; narrow:1 keeps the standard tile).
  CROSS='BM_decode/batch:(1|2|4|8|16|32|64)/column_lanes:0/status:0/graph:1/general:1/v_major:0/wide:0/held:1/runtime_sizes:0/narrow:1'
  for round in $(seq 2); do
    log "C: one-token vs general kernel, round $round"
    bench new .carry cuda_bench_decode "cross_new_r$round.json" "$CROSS"
    bench general .carry cuda_bench_decode "cross_general_r$round.json" "$CROSS" GDN_DECODE_TOKEN_KERNEL=0
  done
fi

if [[ $PHASES == *P* ]]; then
  for round in $(seq 2); do
    log "P: round $round"
    bench new .carry cuda_bench_recurrent "prefill_new_r$round.json" "$PREFILL"
    [ $HAVE_OLD = 1 ] && bench "$BASELINE" .carry-old-bin cuda_bench_recurrent "prefill_old_r$round.json" "$PREFILL"
  done
fi

if [[ $PHASES == *S* ]]; then
  STREAM='BM_decode/batch:(248|256|264|512|528|768|1024)/column_lanes:0/status:0/graph:1/general:0/v_major:0/wide:0/held:1/runtime_sizes:0/narrow:0'
  for round in $(seq 2); do
    log "S: streamed decode, round $round"
    bench new .carry cuda_bench_decode "stream_new_r$round.json" "$STREAM"
    [ $HAVE_OLD = 1 ] && bench "$BASELINE" .carry-old-bin cuda_bench_decode "stream_old_r$round.json" "$STREAM"
  done
fi

if [[ $PHASES == *N* ]]; then
  log "N: ncu, one-request decode, warm L2"
  OUT=$OUT/profile PROFILE_PHASES=W bash cuda/profile_h200.sh >> "$LOG" 2>&1
fi
# The device tool returns a few files per call: the JSON files travel as one archive.
(cd "$OUT" && find . -name '*.json' | tar -czf results.tar.gz -T - && find . -name '*.json' -delete)
log "done"
