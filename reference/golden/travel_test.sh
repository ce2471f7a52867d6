#!/usr/bin/env bash
# The golden vectors travel with the binary: gdn-testbed copied to a fresh folder and run from
# another working directory (the source tree out of reach of any relative path) judges every
# golden case, with no ERROR and no "not run", and gives the same verdicts as the binary where
# it was built. Then GDN_GOLDEN_DIR: a folder of golden files is read instead of the embedded
# ones; a missing or empty one is an ERROR that names it.
# Usage: travel_test.sh GDN_TESTBED WORK_DIR
set -euo pipefail
binary=$1
work=$2
rm -rf "$work"
mkdir -p "$work/bin" "$work/elsewhere"
cp "$binary" "$work/bin/gdn-testbed"
# The copy is the build's binary again (hundreds of MB under the sanitizers): never keep it.
trap 'rm -rf "$work/bin"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Only the double references: the golden verdicts are per reference, and the built-in cases of
# the other implementations are not what this test is about.
run() { (cd "$work/elsewhere" && env -u GDN_GOLDEN_DIR "$@"); }
set +e
run "$work/bin/gdn-testbed" conformance --impl reference.sequential.f64 --json "$work/copied.json" > "$work/copied.txt" 2>&1
rc=$?
set -e
cat "$work/copied.txt"
[[ $rc -eq 0 ]] || fail "conformance from the copied binary exited $rc"
grep -q "^ERROR" "$work/copied.txt" && fail "an ERROR verdict from the copied binary"
grep -q "golden vectors: not run" "$work/copied.txt" && fail "the golden vectors were not run"
golden=$(python3 -c "import json,sys; v=json.load(open(sys.argv[1]))['verdicts']; \
print(sum(1 for x in v if x['case'].startswith('golden/') and x['status']=='PASS'))" "$work/copied.json")
total=$(python3 -c "import json,sys; v=json.load(open(sys.argv[1]))['verdicts']; \
print(sum(1 for x in v if x['case'].startswith('golden/')))" "$work/copied.json")
echo "golden verdicts from the copied binary: $golden PASS of $total"
[[ $total -ge 40 ]] || fail "expected the embedded golden cases (at least 40 verdicts), got $total"
[[ $golden -eq $total ]] || fail "$((total - golden)) golden verdicts did not pass"

# The same verdicts, case for case, from a folder given through GDN_GOLDEN_DIR (the source's).
data="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/data"
# On the build machine the source folder still exists, so the run above would pass even with its
# path compiled in: the binary must not hold that path at all.
if grep -aqF "$data" "$work/bin/gdn-testbed"; then
  fail "the binary holds the path of the golden folder ($data): it would not travel"
fi
(cd "$work/elsewhere" && GDN_GOLDEN_DIR="$data" "$work/bin/gdn-testbed" conformance --impl reference.sequential.f64 \
  --json "$work/folder.json" > "$work/folder.txt" 2>&1) || fail "conformance with GDN_GOLDEN_DIR=$data failed"
python3 - "$work/copied.json" "$work/folder.json" <<'PY' || fail "embedded and folder golden verdicts differ"
import json, sys
def golden(path):
    return sorted((v['case'], v['implementation'], v['status']) for v in json.load(open(path))['verdicts']
                  if v['case'].startswith('golden/'))
a, b = golden(sys.argv[1]), golden(sys.argv[2])
sys.exit(0 if a == b and a else 1)
PY

# A folder that does not exist, or holds no golden file: ERROR naming it, exit 1.
for bad in "$work/no-such-folder" "$work/elsewhere"; do
  set +e
  (cd "$work/elsewhere" && GDN_GOLDEN_DIR="$bad" "$work/bin/gdn-testbed" conformance --impl reference.sequential.f64 \
    > "$work/bad.txt" 2>&1)
  rc=$?
  set -e
  [[ $rc -eq 1 ]] || fail "GDN_GOLDEN_DIR=$bad: expected exit 1, got $rc"
  grep -q "^ERROR" "$work/bad.txt" || fail "GDN_GOLDEN_DIR=$bad: no ERROR verdict"
  grep -qF "$bad" "$work/bad.txt" || fail "GDN_GOLDEN_DIR=$bad: the error does not name the folder"
done
echo "PASS: the golden vectors travel with the binary"
