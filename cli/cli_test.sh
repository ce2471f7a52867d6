#!/usr/bin/env bash
# End-to-end checks of the gdn-testbed binary (run by CTest):
#   cli_test.sh BINARY WORKDIR STEP [BUILD_DIR]
# STEP: conformance | fuzz | replay | generate-verify | merge | usage | installed (needs
# BUILD_DIR: `cmake --install` there, then the installed binary elsewhere), and the regressions of
# issue 29: verify-empty | batch-errors | merge-checked | fuzz-args | fuzz-lock |
# stale-temporaries | generate-force; generate-verify-backward (BUILD_DIR: the Python package's
# staging folder); the backward in conformance and fuzz (issue 31): conformance-backward |
# conformance-backward-fault | fuzz-backward
set -euo pipefail
repro=$(cd "$(dirname "$0")/../oracle/tests/repro" && pwd)
bin=$1
work=$2
step=$3
rm -rf "$work/$step"
mkdir -p "$work/$step"
cd "$work/$step"

expect_rc() {  # expect_rc RC COMMAND...: COMMAND exits RC; its stdout/stderr in out.txt/err.txt
  local want=$1; shift
  set +e
  "$@" > out.txt 2> err.txt
  local rc=$?
  set -e
  [ "$rc" = "$want" ] || { echo "$*: expected exit $want, got $rc"; cat out.txt err.txt; exit 1; }
}

case "$step" in
installed)
  cmake --install "$4" --prefix "$PWD/prefix" --component cli > install.log
  trap 'rm -rf "$work/$step/prefix"' EXIT  # a copy of the build's binary: never keep it
  mkdir -p /tmp/gdn-elsewhere.$$ && cd /tmp/gdn-elsewhere.$$
  env -u GDN_GOLDEN_DIR "$work/$step/prefix/bin/gdn-testbed" conformance --impl reference.sequential.f64 \
    --json "$work/$step/verdicts.json" > "$work/$step/out.txt"
  cd "$work/$step" && rm -rf /tmp/gdn-elsewhere.$$
  python3 - <<'PY'
import json
j = json.load(open("verdicts.json"))
s = j["summary"]
assert s["fail"] == 0 and s["error"] == 0, s
golden = [v for v in j["verdicts"] if v["case"].startswith("golden/")]
assert len(golden) >= 4, len(golden)
assert "not run" not in open("out.txt").read()
PY
  ;;
conformance)
  "$bin" conformance --junit junit.xml --json verdicts.json
  grep -q '<testsuites' junit.xml
  python3 - <<'PY'
import json
j = json.load(open("verdicts.json"))
s = j["summary"]
assert s["fail"] == 0 and s["error"] == 0, s
assert s["pass"] > 50, s
PY
  ;;
fuzz)
  # The references against each other: a short run finds nothing.
  "$bin" fuzz --seconds 8 --seed 11 --out out --quiet
  python3 - <<'PY'
import json
j = json.load(open("out/results-shard-0-of-1.json"))
assert j["failures_total"] == 0, j["failures"]
assert j["cases"] > 50, j["cases"]
PY
  ;;
replay)
  # A planted fault gives a saved failure; its replay command reproduces it.
  set +e
  "$bin" fuzz --impl fault.dropped_decay --cases 5000 --stop-at-first --seed 3 --out out --quiet
  rc=$?
  set -e
  [ "$rc" = 1 ] || { echo "expected exit 1 (failure found), got $rc"; exit 1; }
  file=$(ls out/fault.dropped_decay-*.safetensors | grep -v original | head -1)
  "$bin" replay "$file" --expect fail
  # The same case passes on the correct reference.
  "$bin" replay "$file" --impl reference.chunked.f64 --expect pass
  ;;
generate-verify)
  "$bin" generate --out cases --cases 6 --seed 5
  test -f cases/manifest.json
  test "$(ls cases/*.safetensors | wc -l)" = 6
  # Files written by Python's safetensors (zero outputs: a wrong implementation) are read and
  # judged: every verdict FAIL, none unreadable.
  if python3 -c 'import safetensors, numpy' 2>/dev/null; then
    python3 "$(dirname "$0")/python_interop.py" cases
    set +e
    "$bin" verify cases --json verify.json
    rc=$?
    set -e
    [ "$rc" = 1 ] || { echo "verify should fail zero outputs (exit 1), got $rc"; exit 1; }
    python3 - <<'PY'
import json
j = json.load(open("verify.json"))
statuses = [v["status"] for v in j["verdicts"]]
assert len(statuses) == 6 and all(s == "FAIL" for s in statuses), statuses
PY
  else
    echo "python3 safetensors/numpy not installed: python interop part not run"
  fi
  ;;
merge)
  "$bin" fuzz --cases 40 --shard 0/2 --seed 8 --out shards --quiet
  "$bin" fuzz --cases 40 --shard 1/2 --seed 8 --out shards --quiet
  "$bin" merge --out merged.json shards/results-shard-0-of-2.json shards/results-shard-1-of-2.json
  python3 -c 'import json; j = json.load(open("merged.json")); assert j["cases"] == 40 and j["missing_shards"] == [], j'
  ;;
usage)
  # --version names the version and the revision; every command prints its flags on --help;
  # a usage error exits 2 and names what was wrong.
  "$bin" --version > version.txt
  grep -Eq '^gdn-testbed [0-9]+\.[0-9]+\.[0-9]+ \(git [^)]+\)$' version.txt || { cat version.txt; exit 1; }
  "$bin" help > help.txt
  for command in conformance fuzz replay generate verify merge report list; do
    grep -q "^  $command " help.txt || { echo "help does not list $command"; exit 1; }
    "$bin" "$command" --help > "help-$command.txt"
    grep -q "^Usage: gdn-testbed $command" "help-$command.txt" || { cat "help-$command.txt"; exit 1; }
  done
  for flag in --impl --budget --seed --seconds --cases --shard --device --out --json --max-failures \
              --stop-at-first --no-shrink --quiet --max-K --max-V --K-multiple --max-tokens \
              --max-sequences --max-work --intermediate --backward; do
    grep -q -- "^  $flag " help-fuzz.txt || { echo "fuzz --help does not describe $flag"; exit 1; }
  done
  for flag in --backward --backward-only; do
    grep -q -- "^  $flag " help-conformance.txt || { echo "conformance --help does not describe $flag"; exit 1; }
  done
  expect_usage_error() {  # expect_usage_error TEXT ARGS...: exit 2, TEXT in the message
    local text=$1; shift
    set +e
    "$bin" "$@" > usage-out.txt 2> usage-err.txt
    local rc=$?
    set -e
    [ "$rc" = 2 ] || { echo "gdn-testbed $*: expected exit 2, got $rc"; cat usage-err.txt; exit 1; }
    grep -q -- "$text" usage-err.txt || { echo "gdn-testbed $*: '$text' not in:"; cat usage-err.txt; exit 1; }
  }
  expect_usage_error --no-such-flag fuzz --cases 1 --no-such-flag
  expect_usage_error --cases fuzz --cases abc
  expect_usage_error --max-K fuzz --cases 1 --max-K 0
  expect_usage_error --budget conformance --budget nonsense
  expect_usage_error --expect replay --expect maybe x.safetensors
  expect_usage_error "unknown command 'frobnicate'" frobnicate
  # Planted kernel faults exist only in a fault-campaign build: anywhere else a clear refusal.
  expect_usage_error --plant-fault --plant-fault chunked_gva_head_map conformance
  expect_usage_error "no planted faults" --plant-fault list
  expect_usage_error "needs a fault name" --plant-fault
  expect_usage_error "needs --seconds S or --cases N" fuzz
  ;;
verify-empty)
  # Zero verdicts is an error unless asked for (issue 29, item 1).
  expect_rc 2 "$bin" verify "$(mkdir -p empty && echo empty)"
  grep -q -- --allow-empty err.txt || { cat err.txt; exit 1; }
  expect_rc 0 "$bin" verify empty --allow-empty
  # A folder whose only case cannot be read: an ERROR verdict, exit 1, and said so.
  mkdir -p unreadable && printf 'not a case file' > unreadable/bad.safetensors
  expect_rc 1 "$bin" verify unreadable
  grep -q 'no readable case' err.txt || { cat err.txt; exit 1; }
  ;;
batch-errors)
  # One bad file is one ERROR verdict; the batch goes on, and the JSON and JUnit outputs stay
  # well-formed when a path holds invalid UTF-8 (issue 29, item 3).
  mkdir -p batch
  cp "$repro/good.safetensors" batch/a-good.safetensors
  cp "$repro/operands_single_meta.safetensors" batch/b-operands-single.safetensors
  mkdir batch/c-folder.safetensors
  mkfifo batch/d-fifo.safetensors
  printf 'junk' > "batch/e-bad-$(printf '\xff\xfe')-name.safetensors"
  expect_rc 1 timeout 120 "$bin" verify batch --json verdicts.json --junit verdicts.xml
  python3 - <<'PY'
import json, xml.etree.ElementTree as ET
j = json.load(open("verdicts.json", encoding="utf-8"))
assert len(j["verdicts"]) == 5, [x["status"] for x in j["verdicts"]]
by_name = {}
for x in j["verdicts"]:
    for key in ("a-good", "b-operands", "c-folder", "d-fifo", "e-bad"):
        if key in x["case"] or key in x["message"]:
            by_name[key] = x
assert set(by_name) == {"a-good", "b-operands", "c-folder", "d-fifo", "e-bad"}, list(by_name)
assert by_name["a-good"]["status"] == "PASS", by_name["a-good"]
for key in ("c-folder", "d-fifo", "e-bad"):
    assert by_name[key]["status"] == "ERROR", by_name[key]
assert "folder" in by_name["c-folder"]["message"] and "FIFO" in by_name["d-fifo"]["message"]
root = ET.parse("verdicts.xml").getroot()
assert int(root.get("tests")) == 5 and int(root.get("errors")) >= 3, root.attrib
PY
  # A case over the size limits is an ERROR naming the flag that raises the limit (item 4).
  expect_rc 1 "$bin" verify "$repro/tiny_5GB.safetensors"
  grep -q -- '--max-case-bytes' out.txt || { cat out.txt; exit 1; }
  expect_rc 1 "$bin" verify "$repro/good.safetensors" --max-case-bytes 1000
  grep -q -- '--max-case-bytes' out.txt || { cat out.txt; exit 1; }
  expect_rc 0 "$bin" verify "$repro/good.safetensors" --max-case-bytes 100000000
  # replay: the same, file by file.
  expect_rc 1 timeout 60 "$bin" replay batch/c-folder.safetensors batch/d-fifo.safetensors batch/a-good.safetensors --json replay.json
  python3 -c 'import json; s=[v["status"] for v in json.load(open("replay.json"))["verdicts"]]; assert s == ["ERROR", "ERROR", "PASS"], s'
  ;;
merge-checked)
  # Checked access: a shard lacking `failures` rejects that file by name, and nothing is
  # written; shard indices outside [0, count) and shards of other campaigns are refused
  # (issue 29, items 2 and 5).
  run_merge() { expect_rc 2 "$@"; test ! -e merged.json || { echo "merge wrote merged.json"; exit 1; }; }
  # Under valgrind where the binary is not already instrumented (the ASan build of CI's second
  # pass checks the same reads with AddressSanitizer, which valgrind cannot run alongside).
  if command -v valgrind >/dev/null && ! grep -aq __asan_init "$bin"; then
    run_merge valgrind -q --error-exitcode=99 "$bin" merge --out merged.json "$repro/shard0.json" "$repro/shard1_no_failures.json"
  else
    run_merge "$bin" merge --out merged.json "$repro/shard0.json" "$repro/shard1_no_failures.json"
  fi
  grep -q "shard1_no_failures.json: lacks 'failures'" err.txt || { cat err.txt; exit 1; }
  run_merge "$bin" merge --out merged.json "$repro/shard0.json" "$repro/shard5of2.json"
  grep -q "shard5of2.json: shard index 5 is outside \[0, 2)" err.txt || { cat err.txt; exit 1; }
  python3 - "$repro/shard0.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for name, change in [("negative", lambda j: j["shard"].update(count=-2)),
                     ("index-type", lambda j: j["shard"].update(index="1")),
                     ("tallies-type", lambda j: j.update(tallies=[])),
                     ("no-shard", lambda j: j.pop("shard"))]:
    k = json.loads(json.dumps(j)); change(k); json.dump(k, open(name + ".json", "w"))
PY
  for bad in negative index-type tallies-type no-shard; do
    run_merge "$bin" merge --out merged.json "$bad.json"
    grep -q "$bad.json" err.txt || { cat err.txt; exit 1; }
  done
  "$bin" fuzz --cases 6 --shard 0/2 --seed 8 --out a --quiet
  "$bin" fuzz --cases 8 --shard 1/2 --seed 8 --out b --quiet
  "$bin" fuzz --cases 6 --shard 1/2 --seed 8 --out c --quiet --impl reference.chunked.f64
  "$bin" fuzz --cases 6 --shard 1/2 --seed 8 --out d --quiet --budget bitwise
  run_merge "$bin" merge --out merged.json a/results-shard-0-of-2.json b/results-shard-1-of-2.json
  grep -q "another --cases" err.txt || { cat err.txt; exit 1; }
  run_merge "$bin" merge --out merged.json a/results-shard-0-of-2.json c/results-shard-1-of-2.json
  grep -q "other implementations" err.txt || { cat err.txt; exit 1; }
  run_merge "$bin" merge --out merged.json a/results-shard-0-of-2.json d/results-shard-1-of-2.json
  grep -q "another budget" err.txt || { cat err.txt; exit 1; }
  ;;
fuzz-args)
  # Arguments are checked before any work (issue 29, item 5).
  expect_rc 2 "$bin" fuzz --impl '' --cases 1 --out o; grep -q -- '--impl' err.txt
  expect_rc 2 "$bin" fuzz --cases 1 --out ''; grep -q -- '--out' err.txt
  expect_rc 2 "$bin" fuzz --cases 1 --out /; grep -q -- "root folder" err.txt
  printf x > not-a-folder
  expect_rc 2 "$bin" fuzz --cases 1 --out not-a-folder; grep -q -- "not a folder" err.txt
  for s in nan inf -inf -1 1e400; do
    expect_rc 2 "$bin" fuzz --seconds "$s" --out o; grep -q -- '--seconds' err.txt
  done
  expect_rc 2 "$bin" fuzz --cases 1 --max-K 4294967298 --out o; grep -q -- '--max-K' err.txt
  expect_rc 2 "$bin" fuzz --cases 99999999999999999999 --out o; grep -q -- '--cases' err.txt
  expect_rc 2 "$bin" fuzz --cases 0x10 --out o; grep -q -- '--cases' err.txt
  expect_rc 2 "$bin" fuzz --cases 1 --seed -1 --out o; grep -q -- '--seed' err.txt
  expect_rc 2 "$bin" fuzz --cases 1 --seed 18446744073709551616 --out o; grep -q -- '--seed' err.txt
  expect_rc 2 "$bin" fuzz --impl reference.sequential.f64 --budget 'calibrated(baseline=operands_single)' --cases 1 --out o
  grep -q "does not apply to reference.sequential.f64" err.txt || { cat err.txt; exit 1; }
  # Stray positional arguments are refused by every command that takes none.
  expect_rc 2 "$bin" fuzz --cases 1 --out o stray
  expect_rc 2 "$bin" conformance stray
  expect_rc 2 "$bin" list stray
  expect_rc 2 "$bin" generate --out g stray
  # Seeds are decimal (010 is ten) or 0x hexadecimal.
  "$bin" fuzz --cases 1 --seed 010 --out s10 --quiet >/dev/null
  "$bin" fuzz --cases 1 --seed 0x10 --out s16 --quiet >/dev/null
  python3 -c 'import json; a=json.load(open("s10/results-shard-0-of-1.json")); b=json.load(open("s16/results-shard-0-of-1.json")); assert (a["seed"], b["seed"]) == ("10", "16"), (a["seed"], b["seed"])'
  ;;
fuzz-lock)
  # Two fuzzers on one --out and shard: the second is refused (issue 29, item 5).
  "$bin" fuzz --seconds 30 --out shared --quiet > first.txt 2>&1 &
  first=$!
  for _ in $(seq 100); do [ -s shared/.gdn-fuzz-shard-0-of-1.lock ] && break; sleep 0.1; done
  set +e
  "$bin" fuzz --cases 1 --out shared --quiet > out.txt 2> err.txt
  rc=$?
  set -e
  kill -INT "$first"; wait "$first" || true
  [ "$rc" = 2 ] || { echo "second fuzz on the same --out: expected exit 2, got $rc"; cat err.txt; exit 1; }
  grep -q "another fuzz run (pid $first)" err.txt || { cat err.txt; exit 1; }
  # Another shard into the same folder is fine.
  "$bin" fuzz --cases 2 --shard 1/2 --out shared --quiet > /dev/null
  ;;
stale-temporaries)
  # Temporaries of a killed run are removed at the next run's start (a dead writer, older than a
  # minute); a live writer's are kept; verify never takes them for cases (issue 29, item 7).
  mkdir -p out
  sh -c 'exit 0' & dead=$!; wait "$dead"
  touch -d '5 minutes ago' "out/x.safetensors.tmp.$dead.0" "out/results-shard-0-of-1.json.tmp.$dead.3"
  touch -d '5 minutes ago' "out/y.safetensors.tmp.$$.0"
  expect_rc 2 "$bin" verify out
  "$bin" fuzz --cases 2 --out out --quiet > /dev/null 2> err.txt
  test ! -e "out/x.safetensors.tmp.$dead.0" && test ! -e "out/results-shard-0-of-1.json.tmp.$dead.3" || { ls out; exit 1; }
  test -e "out/y.safetensors.tmp.$$.0" || { echo "a live process's temporary was removed"; exit 1; }
  grep -q "removed out/x.safetensors.tmp.$dead.0" err.txt || { cat err.txt; exit 1; }
  ;;
generate-force)
  # generate refuses a folder that already holds cases; --force replaces them (item 8).
  "$bin" generate --out g --cases 3 --seed 1 > /dev/null
  expect_rc 2 "$bin" generate --out g --cases 1 --seed 2
  grep -q -- "g already holds case files" err.txt && grep -q -- --force err.txt || { cat err.txt; exit 1; }
  test "$(ls g/*.safetensors | wc -l)" = 3
  "$bin" generate --out g --cases 1 --seed 2 --force > /dev/null
  test "$(ls g/*.safetensors | wc -l)" = 1
  ;;
generate-verify-backward)
  # The backward through case files (gdn-case/2): generate --backward writes dO (and dhT); an
  # adapter (the gdn_testbed package of this build, $4 its staging folder) writes the exact
  # gradients from the reference, and for half the files the exact outputs too: verify passes,
  # with checks named dq ... dh0. The same with dbeta (db with fused gates) x 1.01: every
  # verdict FAILs on that tensor. Exit 77 (SKIPPED) without the Python package.
  stage=${4:-}
  if [ -z "$stage" ] || ! PYTHONPATH="$stage" python3 -c 'import gdn_testbed as g; g.read_case_file' 2>/dev/null; then
    echo "SKIPPED: the gdn_testbed Python package of this build is not at '$stage'"; exit 77
  fi
  "$bin" generate --out cases --cases 10 --seed 3 --backward --max-K 16 --max-V 16 --max-work 20000 > /dev/null
  cat > adapter.py <<'PY'
import glob, os, sys
import gdn_testbed as gt
source, out, planted = sys.argv[1], sys.argv[2], sys.argv[3] == "planted"
os.makedirs(out, exist_ok=True)
for i, path in enumerate(sorted(glob.glob(os.path.join(source, "*.safetensors")))):
    c = gt.read_case_file(path)
    assert c.backward is not None and c.gradients is None, path
    grads = gt.sequential_backward(c.problem, c.inputs, c.backward["dO"], c.backward["dhT"])
    if planted:
        name = "dbeta" if "dbeta" in grads else "db"
        grads[name] = grads[name] * 1.01
    outputs = gt.sequential(c.problem, c.inputs) if i % 2 == 0 else None
    meta = dict(c.metadata, **{"gdn.implementation": "tests.adapter", "gdn.formulation": "sequential"})
    gt.write_case_file(os.path.join(out, os.path.basename(path)), c.problem, c.inputs, outputs, meta,
                       c.backward, grads)
PY
  PYTHONPATH="$stage" python3 adapter.py cases exact exact
  PYTHONPATH="$stage" python3 adapter.py cases planted planted
  "$bin" verify exact --json exact.json > exact.txt
  expect_rc 1 "$bin" verify planted --json planted.json
  "$bin" replay exact/case-00000.safetensors --expect pass > replay.txt
  python3 - <<'PY'
import json
exact = json.load(open("exact.json"))["verdicts"]
assert len(exact) == 10 and all(v["status"] == "PASS" for v in exact), [(v["case"], v["status"], v["message"]) for v in exact]
for i, v in enumerate(exact):
    tensors = [c["tensor"] for c in v["checks"]]
    assert tensors[:1] == (["o"] if i % 2 == 0 else ["dq"]), tensors
    assert {"dq", "dk", "dv"} <= set(tensors) and ({"dg", "dbeta"} <= set(tensors) or {"da", "db"} <= set(tensors)), tensors
# A 1% error of dbeta is caught where it exceeds the budget (relative to dbeta's term
# magnitudes: a dbeta that cancels far below its terms hides it): most cases, never another tensor.
planted = json.load(open("planted.json"))["verdicts"]
statuses = [v["status"] for v in planted]
assert len(planted) == 10 and "ERROR" not in statuses and statuses.count("FAIL") >= 5, statuses
for v in planted:
    failing = {c["tensor"] for c in v["checks"] if not c["pass"]}
    assert failing <= {"dbeta", "db"} and bool(failing) == (v["status"] == "FAIL"), (failing, v["status"])
first = next(i for i, v in enumerate(planted) if v["status"] == "FAIL")
open("planted_fail.txt", "w").write(f"planted/case-{first:05d}.safetensors")
PY
  expect_rc 0 "$bin" replay "$(cat planted_fail.txt)" --expect fail
  ;;
conformance-backward)
  # The references' backward passes against the long double adjoint; an implementation without
  # a backward is SKIPPED, never PASSED. Backward verdicts' case names end in /backward.
  "$bin" conformance --backward-only --json verdicts.json --junit junit.xml \
    --impl 'reference.sequential.f64,reference.chunked.f64,reference.chunked.f64.c37,reference.emulate.sequential,reference.emulate.chunked,model.chunked.split_all' \
    > out.txt
  grep -q '<testsuites' junit.xml
  grep -q 'SKIPPED model.chunked.split_all (backward): no backward' out.txt || { cat out.txt; exit 1; }
  python3 - <<'PY'
import json
j = json.load(open("verdicts.json"))
v = j["verdicts"]
cases = {x["case"] for x in v}
assert len(cases) >= 20 and all(c.endswith("/backward") for c in cases), sorted(cases)[:3]
assert len(v) == 6 * len(cases), len(v)
gradients = {"dq", "dk", "dv", "dg", "dbeta", "da", "db", "dA_log", "ddt_bias", "dh0"}
for x in v:
    if x["implementation"] == "model.chunked.split_all":
        assert x["status"] == "SKIPPED" and "no backward" in x["message"], x
        continue
    assert x["status"] == "PASS", (x["implementation"], x["case"], x["message"])
    tensors = [c["tensor"] for c in x["checks"]]
    assert tensors[:3] == ["dq", "dk", "dv"] and set(tensors) <= gradients, tensors
    assert x["budget"] == ("calibrated" if "emulate" in x["implementation"] else "analytic"), x["budget"]
s = j["summary"]
assert s["pass"] == 5 * len(cases) and s["skipped"] == len(cases) and s["fail"] + s["error"] == 0, s
PY
  # Forward and backward in one run: the forward verdicts first, then the backward's.
  "$bin" conformance --backward --no-golden --impl reference.chunked.f64.c37 --json both.json > both.txt
  python3 - <<'PY'
import json
v = json.load(open("both.json"))["verdicts"]
kinds = [x["case"].endswith("/backward") for x in v]
assert kinds == sorted(kinds) and 0 < kinds.count(True) < len(kinds), kinds
assert all(x["status"] in ("PASS", "SKIPPED") for x in v), [(x["case"], x["status"]) for x in v]
assert all(x["status"] == "PASS" for x in v if x["case"].endswith("/backward"))
assert {c["tensor"] for x in v if not x["case"].endswith("/backward") for c in x["checks"]} <= {"o", "hT", "intermediate"}
PY
  # Nothing with a backward selected: every backward verdict SKIPPED, none passed (the forward's
  # rule: SKIPPED is not a failure, exit 0, and the table says why).
  expect_rc 0 "$bin" conformance --backward-only --impl fault.dropped_decay --json skipped.json
  grep -q 'SKIPPED fault.dropped_decay (backward): no backward' out.txt || { cat out.txt; exit 1; }
  python3 -c 'import json; s = json.load(open("skipped.json"))["summary"]; assert s["pass"] == 0 and s["skipped"] == s["total"] > 0, s'
  ;;
conformance-backward-fault)
  # The planted backward faults fail conformance --backward, the failing check naming the
  # tensor; their forward is correct and passes in the same run.
  expect_rc 1 "$bin" conformance --backward --no-golden --impl fault.backward_dg_sign,fault.backward_dk_last_token \
    --json faults.json --verbose
  grep -q 'dk.rel_terms' out.txt && grep -Eq 'd[ga].rel_terms' out.txt || { cat out.txt; exit 1; }
  python3 - <<'PY'
import json
v = json.load(open("faults.json"))["verdicts"]
forward = [x for x in v if not x["case"].endswith("/backward")]
backward = [x for x in v if x["case"].endswith("/backward")]
assert forward and all(x["status"] in ("PASS", "SKIPPED") for x in forward), [(x["case"], x["status"]) for x in forward]
for name, tensors in (("fault.backward_dg_sign", {"dg", "da"}), ("fault.backward_dk_last_token", {"dk"})):
    mine = [x for x in backward if x["implementation"] == name]
    failed = [x for x in mine if x["status"] == "FAIL"]
    assert len(failed) >= len(mine) // 2, (name, [x["status"] for x in mine])
    assert all(x["status"] in ("PASS", "FAIL") for x in mine), [x["message"] for x in mine if x["status"] not in ("PASS", "FAIL")]
    for x in failed:
        bad = {c["tensor"] for c in x["checks"] if not c["pass"]}
        assert bad and bad <= tensors, (name, x["case"], bad)
PY
  ;;
fuzz-backward)
  # The references' backward against the oracle: a short campaign finds nothing.
  "$bin" fuzz --backward --cases 24 --seed 5 --max-work 200000 --out clean --quiet > clean.txt
  python3 - <<'PY'
import json
j = json.load(open("clean/results-shard-0-of-1.json"))
assert j["backward"] is True and j["failures_total"] == 0, j["failures"]
assert j["cases"] == 24 and len(j["tallies"]) == 3, j["tallies"]
for name, t in j["tallies"].items():
    assert t["pass"] == 24 and t["skipped"] == 0, (name, t)
PY
  # The planted fault: caught, shrunk, saved as a gdn-case/2 file with dO, dhT and the failing
  # gradients, and the replay command the results give reproduces the FAIL.
  expect_rc 1 "$bin" fuzz --backward --impl fault.backward_dk_last_token --cases 500 --stop-at-first --seed 3 \
    --out out --quiet
  python3 - <<'PY'
import json
j = json.load(open("out/results-shard-0-of-1.json"))
assert j["backward"] is True and len(j["failures"]) == 1, j["failures"]
f = j["failures"][0]
assert f["status"] == "FAIL" and not f["nondeterministic"] and f["shrink_steps"], f
failing = {c["tensor"] for c in f["verdict"]["checks"] if not c["pass"]}
assert failing == {"dk"}, failing
open("file.txt", "w").write(f["file"])
open("replay.txt", "w").write(f["replay"] + "\n")
PY
  file=$(cat file.txt)
  read -r -a replay < replay.txt
  [ "${replay[1]}" = replay ] && [ "${replay[2]}" = "$file" ] || { cat replay.txt; exit 1; }
  expect_rc 1 "$bin" "${replay[@]:1}"
  grep -q 'FAIL' out.txt && grep -q "re-ran fault.backward_dk_last_token's backward" out.txt || { cat out.txt; exit 1; }
  grep -q 'dk' out.txt || { cat out.txt; exit 1; }
  "$bin" replay "$file" --expect fail > /dev/null
  # The same case passes the correct reference's backward, and verify judges the stored gradients.
  "$bin" replay "$file" --impl reference.sequential.f64 --expect pass > /dev/null
  expect_rc 1 "$bin" verify "$file"
  python3 - "$file" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
meta = header["__metadata__"]
assert meta["gdn.format"] in ("gdn-case/2", "gdn-case/3"), meta["gdn.format"]  # the oldest version holding it
assert "in.dO" in header and "out.dk" in header and "out.o" not in header, sorted(header)
assert json.loads(meta["gdn.backward"])["generator"] == "fuzz::make_backward_inputs"
problem = json.loads(meta["gdn.problem"])
assert problem["K"] == 1 and problem["V"] == 1 and problem["HV"] == 1, problem
PY
  # Only forward implementations selected: SKIPPED (77), never a pass; bad combinations refused.
  expect_rc 77 "$bin" fuzz --backward --impl fault.dropped_decay --cases 3 --out skip --quiet
  grep -q 'SKIPPED fault.dropped_decay: no backward' out.txt || { cat out.txt; exit 1; }
  expect_rc 2 "$bin" fuzz --backward --intermediate --cases 1 --out u
  grep -q -- '--intermediate' err.txt || { cat err.txt; exit 1; }
  expect_rc 2 "$bin" fuzz --backward --budget 'calibrated(baseline=operands_single)' --cases 1 --out u
  grep -q 'operand model is of the chunked form' err.txt || { cat err.txt; exit 1; }
  # A chunked backward under the operand baseline: judged on the operand model (the budget named
  # in every verdict), and the fp32 chunked emulation, more accurate than that design, passes.
  expect_rc 0 "$bin" fuzz --backward --impl reference.emulate.chunked --budget 'calibrated(baseline=operands_single)' \
    --cases 6 --out operands --json operands.json --quiet
  python3 -c "import json; d=json.load(open('operands.json')); t=d['tallies']['reference.emulate.chunked']; \
assert 'baseline=operands_single' in d['budget'] and t['pass'] == 6, d" || { cat out.txt; exit 1; }
  ;;
*)
  echo "unknown step $step"; exit 2 ;;
esac
echo "cli_test $step: ok"
