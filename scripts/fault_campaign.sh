#!/usr/bin/env bash
# The kernel fault-injection campaign, on the GPU machine: every planted fault of
# cuda/faults/planted_faults.hpp, switched on one at a time in a fault-campaign build, against
# each detector a user has, and the same detectors with no fault planted (the control row: a
# detector that fails it proves nothing when it fails a fault).
#
#   bash scripts/fault_campaign.sh --bin FAULT_BUILD.tar.xz [--fuzz-seconds 60] [--suite-cases 100]
#        [--sanitize-cases 3] [--jobs 8] [--deadline SECONDS] [--commit SHA] [--out DIR]
#
# --bin   scripts/pack.sh BUILD OUT --testbed-only of a build configured with
#         -DGDN_KERNEL_FAULTS=ON -DGDN_BENCHMARKS=OFF
# Detectors, each run as its user would run it, `--plant-fault F` in front:
#   conformance  gdn-testbed conformance (the built-in cases, kernels rerun bit for bit)
#   fuzz         gdn-testbed fuzz --stop-at-first for --fuzz-seconds on the kernels that run the
#                faulty code, in their case space (fuzz::CaseSpace through the CLI's flags)
#   suite        cuda_gpu_tests --cases N (every kernel and property)
#   memcheck, racecheck   compute-sanitizer on the GPU suite's conformance property of the
#                faulty kernel family at --sanitize-cases cases: caught when the tool reports
#                errors or hazards (the suite's own failures do not count here)
# --deadline: no task starts later than this many seconds after the start, and none runs past
# it (a device call has a limit); a task cut short reports error "did not finish". The table is
# written in any case.
# Output in --out (default $OUT): faults-<kind>.json (gdn-faults/1: device, date, commit,
# command, and per fault and detector caught / missed / error with a detail line) and
# faults.log; reports/make_reports.py turns the JSON into reports/faults.md.
set -u -o pipefail

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
BIN="" FUZZ_SECONDS=60 SUITE_CASES=100 SAN_CASES=3 JOBS=8 DEADLINE=3000 COMMIT=unknown OUTDIR=${OUT:-/tmp/out}
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --fuzz-seconds) FUZZ_SECONDS=$2; shift 2 ;;
    --suite-cases) SUITE_CASES=$2; shift 2 ;;
    --sanitize-cases) SAN_CASES=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --deadline) DEADLINE=$2; shift 2 ;;
    --commit) COMMIT=$2; shift 2 ;;
    --out) OUTDIR=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "fault_campaign.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$BIN" ] || { echo "fault_campaign.sh: --bin is required" >&2; exit 2; }
mkdir -p "$OUTDIR"
if [ -f "$BIN" ]; then
  mkdir -p /tmp/gdn_fault_bin && tar -C /tmp/gdn_fault_bin -xJf "$BIN" || exit 3
  BIN=/tmp/gdn_fault_bin
fi
BIN=$(realpath "$BIN")
CLI=$BIN/gdn-testbed
SUITE=$BIN/cuda_gpu_tests
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
case $GPU in *H200*) KIND=h200 ;; *H100*) KIND=h100 ;; *) KIND=$(echo "$GPU" | tr -cd 'A-Za-z0-9' | tr A-Z a-z) ;; esac
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
END_AT=$(( $(date +%s) + DEADLINE ))
CMDLINE="bash scripts/fault_campaign.sh --fuzz-seconds $FUZZ_SECONDS --suite-cases $SUITE_CASES --sanitize-cases $SAN_CASES"
WORK=/tmp/gdn_faults
rm -rf "$WORK" && mkdir -p "$WORK"
LOG=$OUTDIR/faults.log
: > "$LOG"
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
log "device: $GPU (driver $DRIVER); commit $COMMIT"

# The faults as the binary lists them: name, kind, kernels, description (tab-separated).
"$CLI" --plant-fault list > "$WORK/faults.tsv" || { log "the binary lists no planted faults (not a -DGDN_KERNEL_FAULTS=ON build?)"; exit 3; }
FAULTS="none $(cut -f1 "$WORK/faults.tsv" | tr '\n' ' ')"
log "faults: $FAULTS"

# One task: FAULT DETECTOR. Writes $WORK/FAULT/DETECTOR.{rc,log,json}.
run_task() {
  local fault=$1 detector=$2 dir=$WORK/$1
  mkdir -p "$dir"
  local plant=(--plant-fault "$fault")
  local family=recurrent
  case $fault in chunked_*) family=chunked ;; none) family=all ;; esac
  local start=$(date +%s.%N)
  local left=$(( END_AT - $(date +%s) ))
  [ $left -gt 5 ] || { echo "deadline" > "$dir/$detector.log"; return; }
  limit() { [ "$1" -lt $left ] && echo "$1" || echo $left; }
  case $detector in
    conformance)
      ( cd "$dir" && timeout $(limit 400) "$CLI" "${plant[@]}" conformance --no-golden --json "$dir/conformance.json" ) \
        > "$dir/conformance.log" 2>&1
      echo $? > "$dir/conformance.rc" ;;
    fuzz)
      local space=(--impl 'cuda.recurrent_prefill,cuda.decode' --intermediate --max-K 256 --max-V 256)
      [ $family = chunked ] && space=(--impl 'cuda.chunked*' --max-K 128 --K-multiple 16 --max-V 256)
      [ $family = all ] && space=(--impl 'cuda.*' --max-K 128 --K-multiple 16 --max-V 256)
      timeout $(limit $((FUZZ_SECONDS + 120))) "$CLI" "${plant[@]}" fuzz "${space[@]}" --seed 20261206 --seconds "$FUZZ_SECONDS" \
        --stop-at-first --max-failures 1 --quiet --out "$dir/fuzz" --json "$dir/fuzz.json" > "$dir/fuzz.log" 2>&1
      echo $? > "$dir/fuzz.rc" ;;
    suite)
      timeout $(limit 500) "$SUITE" "${plant[@]}" --cases "$SUITE_CASES" -r compact > "$dir/suite.log" 2>&1
      echo $? > "$dir/suite.rc" ;;
    memcheck|racecheck)
      local filter="[recurrent][conformance],[decode][conformance]"
      [ $family = chunked ] && filter="[chunked][conformance]"
      [ $family = all ] && filter="[conformance]"
      local extra=()
      [ $detector = racecheck ] && extra=(--racecheck-report hazard)
      timeout $(limit 500) "$CS" --tool "$detector" "${extra[@]}" --print-limit 5 "$SUITE" "${plant[@]}" --cases "$SAN_CASES" \
        -r compact "$filter" > "$dir/$detector.log" 2>&1
      echo $? > "$dir/$detector.rc" ;;
  esac
  awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN { printf "%.1f\n", a - b }' > "$dir/$detector.seconds"
}
export -f run_task
export WORK CLI SUITE CS FUZZ_SECONDS SUITE_CASES SAN_CASES END_AT

DETECTORS="fuzz racecheck memcheck suite conformance"  # longest first: they start first
for d in $DETECTORS; do for f in $FAULTS; do echo "$f $d"; done; done > "$WORK/tasks"
log "$(wc -l < "$WORK/tasks") tasks, $JOBS at a time"
xargs -P "$JOBS" -L 1 bash -c 'run_task "$0" "$1"' < "$WORK/tasks"
log "tasks done"

python3 - "$WORK" "$OUTDIR/faults-$KIND.json" "$GPU" "$DRIVER" "$DATE" "$COMMIT" "$CMDLINE" "$FUZZ_SECONDS" <<'PY'
import json, os, re, sys
work, out, device, driver, date, commit, command, fuzz_seconds = sys.argv[1:]
def read(path, default=""):
    try:
        return open(path, errors="replace").read()
    except OSError:
        return default
faults = [("none", "control", "all", "no fault planted: every detector must pass")]
for line in read(os.path.join(work, "faults.tsv")).splitlines():
    parts = line.split("\t")
    if len(parts) == 4:
        faults.append(tuple(parts))
def rc_of(d, det):
    text = read(os.path.join(d, det + ".rc")).strip()
    return int(text) if text.lstrip("-").isdigit() else None
def judge(fault, det):
    d = os.path.join(work, fault)
    rc = rc_of(d, det)
    logtext = read(os.path.join(d, det + ".log"))
    seconds = read(os.path.join(d, det + ".seconds")).strip()
    r = {"rc": rc, "seconds": float(seconds) if seconds else None}
    if rc is None:
        r.update(result="error", detail="did not run (--deadline)" if "deadline" in logtext else "did not run")
    elif rc in (124, 137):
        r.update(result="error", detail=f"did not finish (timeout, exit {rc})")
    elif det == "conformance":
        fails = len(re.findall(r"\bFAIL\b", logtext)); errors = len(re.findall(r"\bERROR\b", logtext))
        if rc == 0:
            r.update(result="missed", detail="every verdict passed")
        elif rc == 1:
            try:
                verdicts = json.load(open(os.path.join(d, "conformance.json")))["verdicts"]
                bad = [v for v in verdicts if v.get("status") in ("FAIL", "ERROR")]
                names = sorted({v.get("case", v.get("case_name", "?")) + " / " + v.get("implementation", "?") for v in bad})
                repro = sum(1 for v in bad for c in v.get("checks", []) if c.get("metric") in ("repeat_bits", "repack_bits", "exact_rules") and not c.get("pass"))
                r.update(result="caught", detail=f"{len(bad)} verdicts failed ({repro} reproducibility checks); first: {names[0] if names else '?'}")
            except Exception as e:  # the table is in the log in any case
                r.update(result="caught", detail=f"exit 1 ({e})")
        else:
            r.update(result="error", detail=f"exit {rc}: " + logtext.strip().splitlines()[-1][:200] if logtext.strip() else f"exit {rc}")
    elif det == "fuzz":
        try:
            j = json.load(open(os.path.join(d, "fuzz.json")))
        except Exception:
            j = {}
        if rc == 1 and j.get("failures"):
            f = j["failures"][0]
            r["found_after_seconds"] = f.get("found_after_seconds")
            r["nondeterministic"] = f.get("nondeterministic", False)
            r.update(result="caught", detail=f"after {f.get('found_after_seconds', 0):.1f} s, {j.get('cases')} cases; {f.get('implementation')}: "
                     + ("NONDETERMINISTIC, original kept" if f.get("nondeterministic") else f"shrunk to {f.get('shrunk_problem')}"))
        elif rc == 0:
            r.update(result="missed", detail=f"{j.get('cases', '?')} cases in {fuzz_seconds} s, no failure")
        else:
            r.update(result="error", detail=f"exit {rc}")
    elif det == "suite":
        # Catch exits with the number of failed assertions (capped at 255), 77 when skipped.
        failed = re.search(r"Failed (\d+) test cases?, failed (\d+) assertions?", logtext)
        passed = (re.search(r"All tests passed \((\d+) assertions? in (\d+) test cases?\)", logtext) or
                  re.search(r"Passed (all |both )?\d+ test cases? with \d+ assertions?", logtext))
        if rc == 0 and passed:
            r.update(result="missed", detail=passed.group(0))
        elif rc != 0 and failed:
            r.update(result="caught", detail=failed.group(0))
        else:
            r.update(result="error", detail=f"exit {rc}, no summary line (a crash?)")
    else:  # memcheck, racecheck
        errors = re.search(r"ERROR SUMMARY: (\d+) error", logtext)
        hazards = re.search(r"RACECHECK SUMMARY: (\d+) hazard", logtext)
        n = int(hazards.group(1)) if hazards else (int(errors.group(1)) if errors else None)
        if n is None:
            r.update(result="error", detail=f"exit {rc}, no summary line")
        elif n > 0:
            r.update(result="caught", detail=(f"{n} hazards" if hazards else f"{n} errors"))
        else:
            r.update(result="missed", detail="0 hazards" if hazards else "0 errors")
    return r
detectors = ["conformance", "fuzz", "suite", "memcheck", "racecheck"]
rows = []
for name, kind, kernels, description in faults:
    rows.append({"fault": name, "kind": kind, "kernels": kernels, "description": description,
                 "detectors": {d: judge(name, d) for d in detectors}})
json.dump({"format": "gdn-faults/1", "device": device, "driver": driver, "date": date, "commit": commit,
           "command": command, "fuzz_seconds": float(fuzz_seconds), "detectors": detectors, "faults": rows},
          open(out + ".tmp", "w"), indent=1)
os.replace(out + ".tmp", out)
for row in rows:
    print(f"{row['fault']:34s} " + " ".join(f"{d}={row['detectors'][d]['result']}" for d in detectors))
PY
log "written $OUTDIR/faults-$KIND.json"
# The failures' logs that explain a row, small: the first lines of each detector's log.
tar -C "$WORK" -cJf "$OUTDIR/fault_logs.tar.xz" --exclude='*.safetensors' $(cd "$WORK" && ls -d */) 2>/dev/null
