#!/usr/bin/env python3
"""CTest: runs make_reports.py on reports/fixtures/results and checks that the reports and
their plots exist and that the numbers in the Markdown tables match the fixture inputs.

The expected numbers are recomputed here from the raw fixture JSON with code of its own (not
the generator's), so a generator that mislabels, drops or miscounts a verdict fails. Exit 77
(CTest SKIP_RETURN_CODE) only when matplotlib is missing.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPORTS = Path(__file__).resolve().parents[1]
FIXTURES = REPORTS / "fixtures" / "results"
FAILURES: list[str] = []


def check(condition: bool, what: str) -> None:
    if not condition:
        FAILURES.append(what)


def parse_tables(markdown: str) -> dict[str, list[dict]]:
    """Every table, keyed by the '## ' heading above it, as a list of {header: cell}."""
    tables, heading, lines = {}, None, markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## ") or line.startswith("### "):
            heading = line.split(" ", 1)[1].strip()
        if line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            split = lambda row: [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]  # noqa: E731
            headers = split(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("| "):
                rows.append(dict(zip(headers, split(lines[i]))))
                i += 1
            tables[heading] = rows
            continue
        i += 1
    return tables


def value(cell: str):
    if cell in ("n/a", ""):
        return None
    if cell.endswith("%"):
        return float(cell[:-1]) / 100.0
    return float(cell)


def close(cell: str, expected, what: str, percent: bool = False) -> None:
    got = value(cell)
    if expected is None or got is None:
        check(got is None and expected is None, f"{what}: table has {cell!r}, input gives {expected!r}")
        return
    if math.isinf(expected):
        check(got == expected, f"{what}: table has {cell!r}, input gives {expected!r}")
        return
    # Three significant digits (or one decimal of a percentage) are what the tables print.
    tolerance = 0.0006 if percent else 5e-3 * abs(expected)
    check(abs(got - expected) <= tolerance, f"{what}: table has {cell!r}, input gives {expected:.6g}")


def median(values):
    values = sorted(values)
    if not values:
        return None
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def raw_verdicts() -> list[dict]:
    """Verdict records from the fixture files, read directly: verify's object, the bare list,
    and the adapter log's SKIPPED/ERROR lines; with the input dtype from the problem text."""
    out = []
    folder = FIXTURES / "h200-fixture"
    verify = json.loads((folder / "verify_fla_chunk.json").read_text())["verdicts"]
    conformance = json.loads((folder / "verdicts_cuda_list.json").read_text())
    adapter = [json.loads(line) for line in (folder / "adapter_fla_chunk.jsonl").read_text().splitlines() if line]
    regimes = {}
    for record in adapter:
        options = record["generator"]["input_options"]
        regime = options["regime"] + ("+fused" if record["problem_json"]["gate_mode"] == "fused" else "")
        regimes[record["output"] or record["case"]] = regime
    for record in verify + conformance + [r for r in adapter if r["status"] != "RAN"]:
        metrics = {m["tensor"]: m["rel_rms"] for m in record.get("metrics", [])}
        out.append({"implementation": record["implementation"], "status": record["status"],
                    "dtype": re.search(r"dtype=(\w+)", record["problem"]).group(1),
                    "rel_rms_o": metrics.get("o"), "rel_rms_hT": metrics.get("hT"),
                    "margin": record.get("worst_margin"),
                    "regime": regimes.get(record.get("output") or record["case"], "not recorded")})
    return out


def expected_row(group: list[dict]) -> dict:
    judged = [v for v in group if v["status"] in ("PASS", "FAIL")]
    count = lambda s: sum(1 for v in group if v["status"] == s)  # noqa: E731
    return {"cases": len(group), "pass": count("PASS"), "fail": count("FAIL"), "error": count("ERROR"),
            "skipped": count("SKIPPED"),
            "median rel RMS o": median([v["rel_rms_o"] for v in judged]),
            "max rel RMS o": max([v["rel_rms_o"] for v in judged], default=None),
            "max rel RMS hT": max([v["rel_rms_hT"] for v in judged], default=None),
            "median error/budget": median([v["margin"] for v in judged]),
            "max error/budget": max([v["margin"] for v in judged], default=None)}


def check_rows(table: list[dict], key_columns: list[str], groups: dict, what: str) -> None:
    seen = set()
    for row in table:
        key = tuple(row[c] for c in key_columns)
        seen.add(key)
        if key not in groups:
            check(False, f"{what}: unexpected row {key}")
            continue
        expected = expected_row(groups[key])
        for column, number in expected.items():
            if isinstance(number, int):
                check(row[column] == str(number), f"{what} {key} {column}: table has {row[column]!r}, input gives {number}")
            else:
                close(row[column], number, f"{what} {key} {column}")
    check(seen == set(groups), f"{what}: rows {sorted(seen)} != expected {sorted(groups)}")


def check_accuracy(markdown: str, out: Path) -> None:
    tables = parse_tables(markdown)
    verdicts = raw_verdicts()
    check(len(verdicts) == 16, f"fixture verdict count changed: {len(verdicts)}")
    by_impl, by_dtype, by_regime = defaultdict(list), defaultdict(list), defaultdict(list)
    for v in verdicts:
        by_impl[(v["implementation"],)].append(v)
        by_dtype[(v["implementation"], v["dtype"])].append(v)
        by_regime[(v["implementation"], v["regime"])].append(v)
    check_rows(tables.get("Per implementation", []), ["implementation"], by_impl, "accuracy per implementation")
    check_tally(tables)
    check_fuzz(tables)
    check_rows(tables.get("By input dtype", []), ["implementation", "input dtype"], by_dtype, "accuracy by dtype")
    check_rows(tables.get("By gate regime", []), ["implementation", "gate regime"], by_regime, "accuracy by regime")
    for heading in ("By longest sequence (tokens)", "By head size"):
        rows = tables.get(heading, [])
        check(sum(int(r["cases"]) for r in rows) == len(verdicts), f"{heading}: cases do not add up to {len(verdicts)}")
    failures = tables.get("Failures and errors", [])
    check(sorted(r["status"] for r in failures) == sorted(v["status"] for v in verdicts if v["status"] in ("FAIL", "ERROR")),
          "failure table does not list every FAIL and ERROR")
    inputs = tables.get("Inputs", [])
    verify_row = [r for r in inputs if r["input"].endswith("verify_fla_chunk.json")]
    check(len(verify_row) == 1 and verify_row[0]["commit"] == "0000000fixture" and verify_row[0]["date"] == "2025-01-01",
          "accuracy inputs table lacks the verify file's date/commit")
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown):
        path = out / image
        check(path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000,
              f"plot {image} missing or not a PNG")
    check(len(re.findall(r"!\[", markdown)) == 2, "accuracy report should show 2 plots")


def check_speed(markdown: str, out: Path) -> None:
    tables = parse_tables(markdown)
    folder = FIXTURES / "h200-fixture"
    bench = json.loads((folder / "prefill.json").read_text())["benchmarks"]
    peers = json.loads((folder / "prefill_peers.json").read_text())["results"]
    copy = [b for b in bench if b["name"].startswith("BM_copy")][0]["bytes_per_second"]
    medians = {b["run_name"]: b for b in bench if b.get("aggregate_name") == "median"}
    singles = {b["run_name"]: b for b in bench if b["run_type"] == "iteration" and b["repetitions"] == 1
               and not b["name"].startswith("BM_copy")}
    expected = {**singles, **medians}
    rows = tables.get("h200-fixture/prefill.json", [])
    check(sorted(r["benchmark"] for r in rows) == sorted(expected), f"speed rows {[r['benchmark'] for r in rows]}")
    peer_column = "fla.chunk_gated_delta_rule (ms)"
    ratio_column = "speed-up vs fla.chunk_gated_delta_rule"
    for row in rows:
        b = expected.get(row["benchmark"])
        if b is None:
            continue
        close(row["time (ms)"], b["real_time"], f"{row['benchmark']} time")
        close(row["tokens/s"], b["tokens_per_second"], f"{row['benchmark']} tokens/s")
        close(row["GB/s"], b["bytes_per_second"] / 1e9, f"{row['benchmark']} GB/s")
        close(row["of copy BW"], b["bytes_per_second"] / copy, f"{row['benchmark']} copy fraction", percent=True)
        close(row["TFLOP/s"], b["flop_per_second"] / 1e12, f"{row['benchmark']} TFLOP/s")
        close(row["of FLOP ceiling"], b["flop_per_second"] / 989.4e12, f"{row['benchmark']} FLOP fraction", percent=True)
        shape = {k: int(b[k]) for k in ("N", "T", "H", "HV", "K", "V")}
        peer = [p for p in peers if {k: p["shape"].get(k) for k in shape} == shape]
        if peer:
            close(row[peer_column], peer[0]["median_ms"], f"{row['benchmark']} peer time")
            ratio = peer[0]["median_ms"] / b["real_time"]
            check(abs(float(row[ratio_column]) - ratio) <= 0.0051, f"{row['benchmark']} ratio {row[ratio_column]} != {ratio:.4f}")
        else:
            check(row[peer_column] == "n/a" and row[ratio_column] == "n/a", f"{row['benchmark']}: a peer where none matches")
    check_decode(tables, folder)
    peer_rows = [r for heading, table in tables.items() if heading.startswith("Peer ") for r in table]
    recurrent_peers = json.loads((folder / "fla_recurrent.json").read_text())["results"]
    check(len(peer_rows) == len(peers) + len(recurrent_peers), "peer tables should list every peer result")
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown):
        path = out / image
        check(path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"plot {image} missing or not a PNG")
    check(len(re.findall(r"!\[", markdown)) == 4, "speed report should show 2 plots per benchmark file")
    check("4.27e+03 GB/s" in markdown, "copy bandwidth line missing")


def check_decode(tables: dict, folder: Path) -> None:
    """The CUDA helpers' formats: counters tokens_per_s / state_GBps / copy_GBps in ns-timed
    benchmarks, and a peer file whose results carry kind + batch instead of a shape object."""
    bench = json.loads((folder / "decode.json").read_text())["benchmarks"]
    peers = json.loads((folder / "fla_recurrent.json").read_text())["results"]
    copy = [b for b in bench if b["name"].startswith("BM_copy")][0]["copy_GBps"]
    measured = {b["name"]: b for b in bench if not b["name"].startswith("BM_copy")}
    rows = tables.get("h200-fixture/decode.json", [])
    check(sorted(r["benchmark"] for r in rows) == sorted(measured), f"decode rows {[r['benchmark'] for r in rows]}")
    label = "flash-linear-attention fused_recurrent_gated_delta_rule"
    for row in rows:
        b = measured.get(row["benchmark"])
        if b is None:
            continue
        close(row["time (ms)"], b["real_time"] * 1e-6, f"{row['benchmark']} time")
        close(row["tokens/s"], b["tokens_per_s"], f"{row['benchmark']} tokens/s")
        close(row["GB/s"], b["state_GBps"], f"{row['benchmark']} GB/s")
        close(row["of copy BW"], b["state_GBps"] / copy, f"{row['benchmark']} copy fraction", percent=True)
        check(row["TFLOP/s"] == "n/a", f"{row['benchmark']}: no FLOP counter, so no TFLOP/s")
        peer = [p for p in peers if p["kind"] == "decode" and p["batch"] == b["batch"]]
        check(len(peer) == 1, f"fixture: one decode peer per batch ({b['batch']})")
        if peer:
            # Held rows are compared with the peer's held time, the others with its do_bench time.
            peer_ms = peer[0]["held_ms"] if b.get("held") == 1 and "held_ms" in peer[0] else peer[0]["ms"]
            close(row[f"{label} (ms)"], peer_ms, f"{row['benchmark']} peer time")
            ratio = peer_ms / (b["real_time"] * 1e-6)
            check(abs(float(row[f"speed-up vs {label}"]) - ratio) <= 0.0051, f"{row['benchmark']} ratio")


def check_fuzz(tables: dict) -> None:
    fuzz = json.loads((FIXTURES / "h200-fixture" / "fuzz_shard0.json").read_text())
    rows = [r for r in tables.get("Fuzz campaigns", []) if "pass" in r]
    check({r["implementation"] for r in rows} == set(fuzz["tallies"]), "fuzz tally rows")
    for r in rows:
        t = fuzz["tallies"].get(r["implementation"])
        if t:
            for column in ("pass", "fail", "error", "skipped"):
                check(r[column] == str(t[column]), f"fuzz {r['implementation']} {column}")
            check(r["worst error/budget"] == ("inf" if t["worst_margin"] == "inf" else r["worst error/budget"]),
                  f"fuzz {r['implementation']} worst margin")
    shrunk = tables.get("Shrunk fuzz failures", [])
    check(len(shrunk) == 1 and shrunk[0]["replay"] == f"`{fuzz['failures'][0]['replay']}`"
          and shrunk[0]["shrunk problem"] == fuzz["failures"][0]["shrunk_problem"], "shrunk fuzz failure row")


def check_tally(tables: dict) -> None:
    tally = json.loads((FIXTURES / "h200-fixture" / "conformance.json").read_text())["kernels"]
    expected = {(k, p): c for k, e in tally.items() for p, c in e["properties"].items()}
    rows = tables.get("Conformance tallies", [])
    check({(r["kernel"], r["property"]) for r in rows} == set(expected), "conformance tally rows")
    for r in rows:
        c = expected.get((r["kernel"], r["property"]))
        if c:
            for column in ("run", "failed", "skipped"):
                check(r[column] == str(c[column]), f"tally {r['kernel']}/{r['property']} {column}")
            close(r["worst error/budget"], c["worst_margin"], f"tally {r['kernel']}/{r['property']} margin")


def main() -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("SKIPPED: matplotlib is not installed")
        return 77
    generator = [sys.executable, str(REPORTS / "make_reports.py")]
    with tempfile.TemporaryDirectory() as temporary:
        out = Path(temporary) / "out"
        run = subprocess.run(generator + ["--results", str(FIXTURES), "--out", str(out), "--date", "2025-01-02"],
                             capture_output=True, text=True)
        check(run.returncode == 0, f"make_reports failed ({run.returncode}): {run.stderr}")
        accuracy, speed = out / "accuracy.md", out / "speed.md"
        check(accuracy.is_file() and speed.is_file(), "accuracy.md / speed.md not written")
        if accuracy.is_file() and speed.is_file():
            check_accuracy(accuracy.read_text(), out)
            check_speed(speed.read_text(), out)
            first = accuracy.read_text() + speed.read_text()
            subprocess.run(generator + ["--results", str(FIXTURES), "--out", str(out), "--date", "2025-01-02"],
                           capture_output=True, text=True)
            check(first == accuracy.read_text() + speed.read_text(), "regenerating changed the reports")
            check(not list(out.rglob(".*.tmp.*")), "temporary files left behind")

        # The project's own benchmark formats (cuda/bench_common.cpp, cuda/chunked_bench.cpp,
        # cuda/peers/fla_chunk.py): COMMIT/DEVICE context keys in capitals, copy bandwidth in
        # the context (copy_GBps_measured), shapes named by the benchmark label and the peer
        # result's name, and merged fuzz results (gdn-fuzz-merged/1).
        named = Path(temporary) / "named"
        named.mkdir()
        (named / "prefill.json").write_text(json.dumps({
            "context": {"date": "2025-01-01T00:00:00+00:00", "COMMIT": "abc1234", "DEVICE": "NVIDIA H200",
                        "COMMAND": "bench", "copy_GBps_measured": "4000"},
            "benchmarks": [{"name": "BM_chunked/shape:0", "run_name": "BM_chunked/shape:0", "run_type": "iteration",
                            "repetitions": 1, "real_time": 2.0, "time_unit": "ms", "label": "big_4x8192",
                            "T": 32768, "GBps": 400.0},
                           {"name": "BM_chunked/shape:1", "run_name": "BM_chunked/shape:1", "run_type": "iteration",
                            "repetitions": 1, "real_time": 1.0, "time_unit": "ms", "label": "small_1x64", "T": 64}]}))
        (named / "peer.json").write_text(json.dumps({
            "peer": "flash-linear-attention chunk_gated_delta_rule", "fla_version": "0.6.0", "commit": "abc1234",
            "results": [{"name": "big_4x8192", "T": 32768, "H": 16, "HV": 32, "ms": 1.5},
                        {"name": "small_1x64", "T": 128, "ms": 0.5}]}))
        (named / "merged.json").write_text(json.dumps({
            "format": "gdn-fuzz-merged/1", "cases": 10, "wall_seconds": 3.0, "device": "NVIDIA H200",
            "commit": "abc1234", "tallies": {"k": {"pass": 9, "fail": 1, "error": 0, "skipped": 0}}, "failures": []}))
        run = subprocess.run(generator + ["--results", str(named), "--out", str(Path(temporary) / "o3")],
                             capture_output=True, text=True)
        check(run.returncode == 0, f"named-shape inputs: make_reports failed ({run.returncode}): {run.stderr}")
        if run.returncode == 0:
            text = (Path(temporary) / "o3" / "speed.md").read_text()
            tables = parse_tables(text)
            rows = {r["benchmark"]: r for r in tables.get("prefill.json", [])}
            column = "flash-linear-attention chunk_gated_delta_rule (ms)"
            big, small = rows.get("BM_chunked/shape:0", {}), rows.get("BM_chunked/shape:1", {})
            check(big.get(column) == "1.50e+00" and big.get("speed-up vs flash-linear-attention chunk_gated_delta_rule") == "0.75",
                  f"named shape: peer time and ratio of the 4x8192 row: {big}")
            check(small.get(column) == "n/a", f"named shape with a different T must not match: {small}")
            check(big.get("of copy BW") == "10.0%", f"copy bandwidth from the context: {big.get('of copy BW')}")
            check("abc1234" in text and "NVIDIA H200" in text, "COMMIT/DEVICE context keys in the inputs table")
            fuzz = parse_tables((Path(temporary) / "o3" / "accuracy.md").read_text()).get("Fuzz campaigns", [])
            check(len(fuzz) == 1 and fuzz[0].get("fail") == "1", f"merged fuzz results in the accuracy report: {fuzz}")

        # A file that breaks its schema is an error naming the file, not a silent gap.
        broken = Path(temporary) / "broken"
        shutil.copytree(FIXTURES, broken)
        (broken / "bad_peer.json").write_text(json.dumps({"peer": {"name": "x"}, "results": [{"name": "y", "shape": {}}]}))
        run = subprocess.run(generator + ["--results", str(broken), "--out", str(Path(temporary) / "o2")],
                             capture_output=True, text=True)
        check(run.returncode == 2 and "bad_peer.json" in run.stderr and "median_ms" in run.stderr,
              f"a peer result without median_ms should fail naming the file: rc {run.returncode}, {run.stderr!r}")
        check(not (Path(temporary) / "o2" / "accuracy.md").exists(), "a failed run must not write reports")

    for failure in FAILURES:
        print("FAIL:", failure)
    print(f"reports fixture test: {len(FAILURES)} failed checks")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
