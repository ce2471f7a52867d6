#!/usr/bin/env bash
# End-to-end checks of the gdn-testbed binary (run by CTest):
#   cli_test.sh BINARY WORKDIR STEP
# STEP: conformance | fuzz | replay | generate-verify | merge | usage
set -euo pipefail
bin=$1
work=$2
step=$3
rm -rf "$work/$step"
mkdir -p "$work/$step"
cd "$work/$step"

case "$step" in
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
              --max-sequences --max-work --intermediate; do
    grep -q -- "^  $flag " help-fuzz.txt || { echo "fuzz --help does not describe $flag"; exit 1; }
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
  expect_usage_error "needs --seconds S or --cases N" fuzz
  ;;
*)
  echo "unknown step $step"; exit 2 ;;
esac
echo "cli_test $step: ok"
