"""The report generator on fixture data (pytest; CTest reports/fixtures).

make_reports.py runs on reports/fixtures/results (the layout of reports/results/<kind>/) and the
tests check that the reports, their detail files and plots exist and that the numbers in the
Markdown tables match the fixture inputs. The expected numbers are recomputed here from the raw
fixture JSON with code of its own (not the generator's), so a generator that mislabels, drops or
miscounts a verdict fails. Skipped when matplotlib is missing.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

REPORTS = Path(__file__).resolve().parents[1]
FIXTURES = REPORTS / "fixtures" / "results"
GENERATOR = [sys.executable, str(REPORTS / "make_reports.py")]
DATE = "2025-01-02"

pytest.importorskip("matplotlib", reason="the reports draw their plots with matplotlib")


def make_reports(results: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(GENERATOR + ["--results", str(results), "--out", str(out), *extra],
                          capture_output=True, text=True)


def all_tables(markdown: str) -> list[tuple[str | None, list[dict]]]:
    """Every table in order, with the '## ' heading above it, as a list of {header: cell}."""
    tables, heading, lines = [], None, markdown.splitlines()
    split = lambda row: [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]  # noqa: E731
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## ") or line.startswith("### "):
            heading = line.split(" ", 1)[1].strip()
        if line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            headers = split(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("| "):
                rows.append(dict(zip(headers, split(lines[i]))))
                i += 1
            tables.append((heading, rows))
            continue
        i += 1
    return tables


def parse_tables(markdown: str) -> dict[str | None, list[dict]]:
    """Every table keyed by the heading above it (the first table under a heading)."""
    out: dict = {}
    for heading, rows in all_tables(markdown):
        out.setdefault(heading, rows)
    return out


def summary_and_runs(markdown: str) -> tuple[list[dict], list[dict]]:
    """A report's first table (the summary) and second (its runs: device, date, commit, command)."""
    tables = all_tables(markdown)
    return tables[0][1], tables[1][1]


def value(cell: str):
    if cell in ("n/a", ""):
        return None
    if cell.endswith("%"):
        return float(cell[:-1]) / 100.0
    return float(cell)


def close(cell: str, expected, what: str, percent: bool = False) -> None:
    got = value(cell)
    if expected is None or got is None:
        assert got is None and expected is None, f"{what}: table has {cell!r}, input gives {expected!r}"
        return
    if math.isinf(expected):
        assert got == expected, f"{what}: table has {cell!r}, input gives {expected!r}"
        return
    # Three significant digits (or one decimal of a percentage) are what the tables print.
    tolerance = 0.0006 if percent else 5e-3 * abs(expected)
    assert abs(got - expected) <= tolerance, f"{what}: table has {cell!r}, input gives {expected:.6g}"


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
    folder = FIXTURES / "h200" / "campaign"
    verify = json.loads((folder / "verify_fla_chunk.json").read_text())["verdicts"]
    conformance = json.loads((folder / "verdicts_cuda_list.json").read_text())
    adapter = [json.loads(line) for line in (folder / "adapter_fla_chunk.jsonl").read_text().splitlines() if line]
    regimes = {}
    for record in adapter:
        options = record["generator"]["input_options"]
        regime = options["regime"] + ("+fused" if record["problem_json"]["gate_mode"] == "fused" else "")
        regimes[record["output"] or record["case"]] = regime
    sources = [(verify, "verify_fla_chunk.json"), (conformance, "verdicts_cuda_list.json"),
               ([r for r in adapter if r["status"] != "RAN"], "adapter_fla_chunk.jsonl")]
    for records, judge in sources:
        for record in records:
            metrics = {m["tensor"]: m["rel_rms"] for m in record.get("metrics", [])}
            out.append({"implementation": record["implementation"], "status": record["status"], "judge": judge,
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




@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    """The reports built once from the fixtures."""
    folder = tmp_path_factory.mktemp("reports")
    run = make_reports(FIXTURES, folder, "--date", DATE)
    assert run.returncode == 0, f"make_reports failed ({run.returncode}): {run.stderr}"
    return folder


def read(out: Path, name: str) -> str:
    path = out / name
    assert path.is_file(), f"{name} not written"
    return path.read_text()


def check_rows(rows: list[dict], key_columns: list[str], groups: dict, what: str) -> None:
    seen = set()
    for row in rows:
        key = tuple(row[c] for c in key_columns)
        seen.add(key)
        assert key in groups, f"{what}: unexpected row {key}"
        for column, number in expected_row(groups[key]).items():
            if isinstance(number, int):
                assert row[column] == str(number), f"{what} {key} {column}: table has {row[column]!r}, input gives {number}"
            else:
                close(row[column], number, f"{what} {key} {column}")
    assert seen == set(groups), f"{what}: rows {sorted(seen)} != expected {sorted(groups)}"


def test_reports_open_with_their_summary_and_stay_small(out):
    for name in ("accuracy.md", "speed.md"):
        text = read(out, name)
        assert len(text.encode()) < 30_000, f"{name} is {len(text.encode())} bytes"
        first_table = text.index("\n| ")
        assert first_table < 1200, f"{name}: the summary table should open the report"
        assert f"Generated {DATE}" in text


def test_accuracy_summary_matches_the_verdicts(out):
    summary, runs = summary_and_runs(read(out, "accuracy.md"))
    verdicts = raw_verdicts()
    assert len(verdicts) == 16, f"fixture verdict count changed: {len(verdicts)}"
    groups = defaultdict(list)
    for v in verdicts:
        groups[(v["implementation"], v["judge"])].append(v)
    rows = [r for r in summary if r["judged by"] in {judge for _, judge in groups}]
    assert {(r["implementation"], r["judged by"]) for r in rows} == set(groups)
    for r in rows:
        group = groups[(r["implementation"], r["judged by"])]
        e = expected_row(group)
        for column in ("pass", "fail", "error", "skipped"):
            assert r[column] == str(e[column]), f"summary {r['implementation']} {r['judged by']} {column}"
        close(r["worst error/budget"], e["max error/budget"], f"summary {r['implementation']} worst margin")
        close(r["median rel RMS o"], e["median rel RMS o"], f"summary {r['implementation']} median")
        close(r["max rel RMS o"], e["max rel RMS o"], f"summary {r['implementation']} max")
        assert r["device kind"] == "h200" and r["run"] == "`h200/campaign/" + r["judged by"] + "`"

    tally = json.loads((FIXTURES / "h200" / "conformance.json").read_text())["kernels"]
    for kernel, entry in tally.items():
        row = [r for r in summary if r["implementation"] == kernel and r["judged by"].startswith("GPU suite")]
        assert len(row) == 1, f"GPU suite row of {kernel}"
        props = entry["properties"].values()
        assert row[0]["fail"] == str(sum(p["failed"] for p in props))
        assert row[0]["pass"] == str(sum(p["run"] - p["failed"] for p in props))
        close(row[0]["worst error/budget"], max(p["worst_margin"] for p in props), f"GPU suite {kernel}")

    fuzz = json.loads((FIXTURES / "h200" / "campaign" / "fuzz_shard0.json").read_text())
    rows = {r["implementation"]: r for r in summary if r["judged by"] == "fuzz"}
    assert set(rows) == set(fuzz["tallies"])
    for name, t in fuzz["tallies"].items():
        for column in ("pass", "fail", "error", "skipped"):
            assert rows[name][column] == str(t[column]), f"fuzz {name} {column}"
    # Every input of the table is stated with device, date, commit and command.
    verify = {r["run"]: r for r in runs}.get("`h200/campaign/verify_fla_chunk.json`")
    assert verify and verify["commit"] == "0000000fixture" and verify["date"] == "2025-01-01"
    # A device kind without a campaign, and the sanitizers: visible, never a crash.
    text = read(out, "accuracy.md")
    assert "racecheck 2 hazards, exit 1 **NOT CLEAN**" in text and "synccheck not run" in text
    assert re.search(r"\| not measured \|  \| h100 \| campaign", text), "h100 has no campaign: a not-measured row"
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        path = out / image
        assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000, image
    assert len(re.findall(r"!\[", text)) == 2, "accuracy report should show 2 plots"


def test_accuracy_details(out):
    text = read(out, "accuracy.md")
    assert "(details/accuracy_h200.md)" in text
    tables = parse_tables(read(out, "details/accuracy_h200.md"))
    verdicts = raw_verdicts()
    by_impl, by_dtype, by_regime = defaultdict(list), defaultdict(list), defaultdict(list)
    for v in verdicts:
        by_impl[(v["implementation"],)].append(v)
        by_dtype[(v["implementation"], v["dtype"])].append(v)
        by_regime[(v["implementation"], v["regime"])].append(v)
    check_rows(tables.get("Verdicts per implementation", []), ["implementation"], by_impl, "per implementation")
    check_rows(tables.get("By input dtype", []), ["implementation", "input dtype"], by_dtype, "by dtype")
    check_rows(tables.get("By gate regime", []), ["implementation", "gate regime"], by_regime, "by regime")
    for heading in ("By longest sequence (tokens)", "By head size"):
        assert sum(int(r["cases"]) for r in tables.get(heading, [])) == len(verdicts), heading
    failures = tables.get("Failures and errors (worst first)", [])
    assert sorted(r["status"] for r in failures) == sorted(v["status"] for v in verdicts if v["status"] in ("FAIL", "ERROR"))
    tally = json.loads((FIXTURES / "h200" / "conformance.json").read_text())["kernels"]
    expected = {(k, p): c for k, e in tally.items() for p, c in e["properties"].items()}
    rows = tables.get("GPU suite, per property", [])
    assert {(r["kernel"], r["property"]) for r in rows} == set(expected)
    for r in rows:
        c = expected[(r["kernel"], r["property"])]
        for column in ("run", "failed", "skipped"):
            assert r[column] == str(c[column])
        close(r["worst error/budget"], c["worst_margin"], f"tally {r['kernel']}/{r['property']}")
    fuzz = json.loads((FIXTURES / "h200" / "campaign" / "fuzz_shard0.json").read_text())
    shrunk = tables.get("Shrunk fuzz failures", [])
    assert len(shrunk) == 1 and shrunk[0]["replay"] == f"`{fuzz['failures'][0]['replay']}`"
    assert shrunk[0]["shrunk problem"] == fuzz["failures"][0]["shrunk_problem"]


def test_speed_summary_and_details(out):
    text = read(out, "speed.md")
    summary, _ = summary_and_runs(text)
    folder = FIXTURES / "h200"
    bench = json.loads((folder / "bench_chunked.json").read_text())["benchmarks"]
    peers = json.loads((folder / "peer_fla_chunk.json").read_text())["results"]
    copy = [b for b in bench if b["name"].startswith("BM_copy")][0]["bytes_per_second"]
    medians = {b["run_name"]: b for b in bench if b.get("aggregate_name") == "median"}
    singles = {b["run_name"]: b for b in bench if b["run_type"] == "iteration" and b["repetitions"] == 1
               and not b["name"].startswith("BM_copy")}
    expected = {**singles, **medians}
    chunked = [r for r in summary if r["kernel"] == "BM_prefill_chunked"]
    assert len(chunked) == len(expected), f"summary rows {chunked}"
    for row in chunked:
        matches = [b for b in expected.values() if abs(b["real_time"] - float(row["time (ms)"])) <= 5e-3 * b["real_time"]]
        assert len(matches) == 1, row
        b = matches[0]
        close(row["of copy BW"], b["bytes_per_second"] / copy, "copy fraction", percent=True)
        close(row["of FLOP ceiling"], b["flop_per_second"] / 989.4e12, "FLOP fraction", percent=True)
        shape = {k: int(b[k]) for k in ("N", "T", "H", "HV", "K", "V")}
        peer = [p for p in peers if {k: p["shape"].get(k) for k in shape} == shape]
        if peer:
            close(row["peer (ms)"], peer[0]["median_ms"], "peer time")
            assert abs(float(row["peer / ours"]) - peer[0]["median_ms"] / b["real_time"]) <= 0.0051
        else:
            assert row["peer"] == "none measured" and row["peer / ours"] == "n/a"
    # Decode: the headline rows are graph mode (and held where the name says), compared with the
    # peer's held time where the row is held.
    decode = json.loads((folder / "bench_decode.json").read_text())["benchmarks"]
    recurrent_peers = json.loads((folder / "peer_fla_recurrent.json").read_text())["results"]
    headline = [b for b in decode if b["name"].startswith("BM_decode") and "graph:1" in b["name"]]
    rows = [r for r in summary if r["kernel"] == "cuda.decode" and r["device kind"] == "h200"]
    assert len(rows) == len(headline), rows
    for b in headline:
        row = [r for r in rows if r["shape"] == f"batch={int(b['batch'])}" and
               abs(float(r["time (ms)"]) - b["real_time"] * 1e-6) <= 5e-3 * b["real_time"] * 1e-6]
        assert len(row) == 1, (b["name"], rows)
        peer = [p for p in recurrent_peers if p["kind"] == "decode" and p["batch"] == b["batch"]][0]
        peer_ms = peer["held_ms"] if b.get("held") == 1 and "held_ms" in peer else peer["ms"]
        close(row[0]["peer (ms)"], peer_ms, f"{b['name']} peer time")
    # Result sets that lack a benchmark file show it.
    assert re.search(r"\| h200 \| cuda.recurrent_prefill \| not measured", text)
    assert len(re.findall(r"!\[", text)) == 1, "one plot per device kind"

    details = parse_tables(read(out, "details/speed_h200.md"))
    rows = details.get("h200/bench_chunked.json", [])
    assert sorted(r["benchmark"] for r in rows) == sorted(expected)
    for row in rows:
        b = expected[row["benchmark"]]
        close(row["time (ms)"], b["real_time"], "time")
        close(row["tokens/s"], b["tokens_per_second"], "tokens/s")
        close(row["GB/s"], b["bytes_per_second"] / 1e9, "GB/s")
        close(row["TFLOP/s"], b["flop_per_second"] / 1e12, "TFLOP/s")
    rows = details.get("h200/bench_decode.json", [])
    measured = {b["name"]: b for b in decode if not b["name"].startswith("BM_copy")}
    assert sorted(r["benchmark"] for r in rows) == sorted(measured)
    peer_rows = [r for heading, table in details.items() if heading and heading.startswith("Peer ") for r in table]
    assert len(peer_rows) == len(peers) + len(recurrent_peers)
    assert "4.27e+03 GB/s" in read(out, "details/speed_h200.md"), "copy bandwidth line"


def test_regenerating_is_byte_identical_and_removes_stale_files(out):
    first = {p: p.read_bytes() for p in out.rglob("*.md")}
    (out / "plots" / "speed_old.png").write_bytes(b"stale")
    (out / "details" / "accuracy_gone.md").write_text("stale")
    run = make_reports(FIXTURES, out, "--date", DATE)
    assert run.returncode == 0, run.stderr
    assert {p: p.read_bytes() for p in out.rglob("*.md")} == first
    assert not (out / "plots" / "speed_old.png").exists() and not (out / "details" / "accuracy_gone.md").exists()
    assert not list(out.rglob(".*.tmp.*")), "temporary files left behind"


def test_campaign_summary_reports_what_the_raw_files_do(tmp_path):
    """summarize_campaign.py condenses the raw campaign; the reports built from the summary show
    the same summary rows (the run column names the summary instead of each raw file)."""
    raw = tmp_path / "raw" / "h200"
    shutil.copytree(FIXTURES / "h200" / "campaign", raw / "campaign")
    condensed = tmp_path / "condensed" / "h200" / "campaign"
    run = subprocess.run([sys.executable, str(REPORTS / "campaign" / "summarize_campaign.py"), "--raw",
                          str(raw / "campaign"), "--out", str(condensed / "summary.json")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    for name in ("raw", "condensed"):
        assert make_reports(tmp_path / name, tmp_path / f"out_{name}", "--date", DATE).returncode == 0
    rows = {}
    for name in ("raw", "condensed"):
        table, _ = summary_and_runs((tmp_path / f"out_{name}" / "accuracy.md").read_text())
        rows[name] = {(r["implementation"], r["judged by"]): {k: v for k, v in r.items() if k != "run"} for r in table}
    assert rows["raw"] == rows["condensed"]
    raw_details = parse_tables((tmp_path / "out_raw" / "details" / "accuracy_h200.md").read_text())
    condensed_details = parse_tables((tmp_path / "out_condensed" / "details" / "accuracy_h200.md").read_text())
    for heading in ("Verdicts per implementation", "By input dtype", "By gate regime", "By longest sequence (tokens)",
                    "Fuzz campaigns", "Skipped (not supported by the implementation, never counted as passed)"):
        strip = lambda rows: [{k: v for k, v in r.items() if k != "input"} for r in rows]  # noqa: E731
        assert strip(raw_details[heading]) == strip(condensed_details[heading]), heading


def test_project_formats_and_named_shapes(tmp_path):
    """The project's own benchmark formats (cuda/bench/bench_common.cpp, cuda/bench/chunked_bench.cpp,
    cuda/peers/fla_chunk.py): COMMIT/DEVICE context keys in capitals, copy bandwidth in the context
    (copy_GBps_measured), shapes named by the benchmark label and the peer result's name."""
    named = tmp_path / "results" / "h100"
    named.mkdir(parents=True)
    (named / "bench_chunked.json").write_text(json.dumps({
        "context": {"date": "2025-01-01T00:00:00+00:00", "COMMIT": "abc1234", "DEVICE": "NVIDIA H100 80GB HBM3",
                    "COMMAND": "bench", "copy_GBps_measured": "4000"},
        "benchmarks": [{"name": "BM_chunked_default/shape:0", "run_name": "BM_chunked_default/shape:0", "run_type": "iteration",
                        "repetitions": 1, "real_time": 2.0, "time_unit": "ms", "label": "big_4x8192",
                        "T": 32768, "GBps": 400.0, "TFLOPs": 98.94},
                       {"name": "BM_chunked_default/shape:1", "run_name": "BM_chunked_default/shape:1", "run_type": "iteration",
                        "repetitions": 1, "real_time": 1.0, "time_unit": "ms", "label": "small_1x64", "T": 64},
                       {"name": "BM_chunked/shape:0/value_tile:64", "run_name": "BM_chunked/shape:0/value_tile:64",
                        "run_type": "iteration", "repetitions": 1, "real_time": 3.0, "time_unit": "ms",
                        "label": "big_4x8192", "T": 32768}]}))
    (named / "peer_fla_chunk.json").write_text(json.dumps({
        "peer": "flash-linear-attention chunk_gated_delta_rule", "fla_version": "0.6.0", "commit": "abc1234",
        "results": [{"name": "big_4x8192", "T": 32768, "H": 16, "HV": 32, "ms": 1.5},
                    {"name": "small_1x64", "T": 128, "ms": 0.5}]}))
    # The same peer timed in another GPU call (another commit, and another folder): never a ratio.
    (named / "peer_fla_chunk_other_call.json").write_text(json.dumps({
        "peer": "flash-linear-attention chunk_gated_delta_rule", "fla_version": "0.6.0", "commit": "fff0000",
        "command": "another call", "results": [{"name": "big_4x8192", "T": 32768, "H": 16, "HV": 32, "ms": 9.0}]}))
    (named / "elsewhere").mkdir()
    (named / "elsewhere" / "peer_fla_chunk.json").write_text(json.dumps({
        "peer": "flash-linear-attention chunk_gated_delta_rule", "fla_version": "0.6.0", "commit": "abc1234",
        "results": [{"name": "big_4x8192", "T": 32768, "H": 16, "HV": 32, "ms": 9.0}]}))
    run = make_reports(tmp_path / "results", tmp_path / "out")
    assert run.returncode == 0, run.stderr
    text = (tmp_path / "out" / "speed.md").read_text()
    summary, _ = summary_and_runs(text)
    rows = {r["shape"].split()[0]: r for r in summary if r["kernel"] == "cuda.chunked_prefill"}
    assert set(rows) == {"big_4x8192", "small_1x64"}, "tuning rows stay out of the summary"
    assert not [r for r in summary if r["peer (ms)"] == "9.00e+00"], "a peer of another call was paired"
    assert "9.00e+00" not in (tmp_path / "out" / "details" / "speed_h100.md").read_text().split("## Peer")[0]
    big, small = rows["big_4x8192"], rows["small_1x64"]
    assert big["peer (ms)"] == "1.50e+00" and big["peer / ours"] == "0.75", big
    assert small["peer"] == "none measured", "a named shape with a different T must not match"
    assert big["of copy BW"] == "10.0%" and big["of FLOP ceiling"] == "10.0%", big
    assert "abc1234" in text and "NVIDIA H100 80GB HBM3" in text


def test_a_file_that_breaks_its_schema_is_an_error(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(FIXTURES, broken)
    (broken / "h200" / "bad_peer.json").write_text(json.dumps({"peer": {"name": "x"}, "results": [{"name": "y", "shape": {}}]}))
    run = make_reports(broken, tmp_path / "o2")
    assert run.returncode == 2 and "bad_peer.json" in run.stderr and "median_ms" in run.stderr, run.stderr
    assert not (tmp_path / "o2" / "accuracy.md").exists(), "a failed run must not write reports"


def test_empty_results_show_not_measured(tmp_path):
    (tmp_path / "results" / "h100").mkdir(parents=True)
    (tmp_path / "results" / "h100" / "manifest.json").write_text(json.dumps({"format": "gdn-manifest/1", "device": "x"}))
    run = make_reports(tmp_path / "results", tmp_path / "out")
    assert run.returncode == 0, run.stderr
    for name in ("accuracy.md", "speed.md"):
        assert "not measured" in (tmp_path / "out" / name).read_text()


def test_collect_sanitize(tmp_path):
    log = tmp_path / "combined.log"
    log.write_text("---- memcheck\n========= ERROR SUMMARY: 0 errors\nmemcheck exit 0\n"
                   "---- racecheck\n========= RACECHECK SUMMARY: 3 hazards displayed (1 error, 2 warnings)\nracecheck exit 1\n")
    sync = tmp_path / "sync.log"
    sync.write_text("Passed all 4 test cases with 9 assertions.\n========= ERROR SUMMARY: 0 errors\n")
    out = tmp_path / "sanitize.json"
    run = subprocess.run([sys.executable, str(REPORTS / "collect_sanitize.py"), "--out", str(out), "--device", "d",
                          "--commit", "c", "--command", "cmd", "--filter", "[f]", "--combined", str(log),
                          f"synccheck={sync}:0"], capture_output=True, text=True)
    assert run.returncode == 1, "racecheck is not clean"
    tools = json.loads(out.read_text())["tools"]
    assert tools["memcheck"] == {"run": True, "exit_code": 0, "errors": 0, "passed": True, "filter": "[f]"}
    assert tools["racecheck"]["hazards"] == 3 and tools["racecheck"]["errors"] == 1 and not tools["racecheck"]["passed"]
    assert tools["synccheck"]["passed"] and tools["synccheck"]["tests"].startswith("Passed all 4")
    assert tools["initcheck"] == {"run": False}


def _fault_run(rows):
    detectors = ["conformance", "fuzz", "suite", "memcheck", "racecheck"]
    faults = []
    for name, results in rows:
        faults.append({"fault": name, "kind": "boundary", "kernels": "k", "description": name,
                       "detectors": {d: {"result": r, "detail": f"{d} {r}"} for d, r in zip(detectors, results)}})
    return {"format": "gdn-faults/1", "device": "NVIDIA H100 80GB HBM3", "date": "2026-12-06", "commit": "abc1234",
            "command": "bash scripts/fault_campaign.sh", "fuzz_seconds": 60, "detectors": detectors, "faults": faults}


def test_fault_campaign_table_and_its_verdict_on_conformance(tmp_path):
    results = tmp_path / "results" / "h100"
    results.mkdir(parents=True)
    ok = ["missed"] * 5
    run = _fault_run([("none", ok), ("a", ["caught", "caught", "caught", "missed", "missed"]),
                      ("b", ["missed", "caught", "caught", "missed", "caught"])])
    (results / "faults-h100.json").write_text(json.dumps(run))
    done = make_reports(tmp_path / "results", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "out" / "faults.md").read_text()
    rows = {r["fault"]: r for _, table in all_tables(text) for r in table}
    assert rows["`a`"]["conformance"] == "caught" and rows["`b`"]["conformance"] == "**missed**", rows
    assert "Fuzz caught, conformance missed: `b`." in text
    assert "Control (no fault): every detector passed." in text
    assert "Caught, of 2 planted faults: conformance 1, fuzz 2, suite 2, memcheck 0, racecheck 1." in text
    # A dirty control row is said so; a cell outside caught/missed/error is a schema error.
    run["faults"][0]["detectors"]["suite"]["result"] = "caught"
    (results / "faults-h100.json").write_text(json.dumps(run))
    assert make_reports(tmp_path / "results", tmp_path / "out").returncode == 0
    assert "NOT clean: suite caught" in (tmp_path / "out" / "faults.md").read_text()
    run["faults"][1]["detectors"]["fuzz"]["result"] = "maybe"
    (results / "faults-h100.json").write_text(json.dumps(run))
    broken = make_reports(tmp_path / "results", tmp_path / "out2")
    assert broken.returncode == 2 and "faults-h100.json" in broken.stderr and "fuzz" in broken.stderr, broken.stderr


def test_adapter_and_backward_verdicts_make_peers_md(tmp_path):
    results = tmp_path / "results" / "h100" / "python"
    results.mkdir(parents=True)
    run = {"format": "gdn-adapter-verdicts/1", "created": "2026-12-06", "commit": "abc1234", "command": "x",
           "device": {"nvidia_smi": "NVIDIA H100 80GB HBM3, 580"},
           "table": [{"id": "lib.chunk", "status": "DONE", "verdict": "FAIL", "judged": 10, "failed": 2, "errors": 0,
                      "skipped": 1, "worst_margin": 12.5, "budget": "calibrated",
                      "quality": {"o": {"worst_margin": 0.5}, "hT": {"worst_margin": 800.0}}}],
           "runs": [{"id": "lib.chunk", "failures": [{"status": "FAIL", "shrunk_problem": "N=1 T=2",
                                                     "worst_check": {"tensor": "o", "metric": "rel_rms", "margin": 12.5}}]}]}
    back = {"format": "gdn-backward-verdicts/1", "device": "H100", "date": "2026-12-06", "commit": "abc1234",
            "command": "y", "subjects": [{"subject": "lib.chunk", "status": "RAN", "cases": 3, "passed": 3, "failed": 0,
                                          "errors": 0, "worst_margin": 0.4, "determinism": [
                                              {"case": "drawn", "differing_elements": {"dq": 5, "dk": 0}}]}]}
    (results / "a.json").write_text(json.dumps(run))
    (results / "b.json").write_text(json.dumps(back))
    done = make_reports(tmp_path / "results", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "out" / "peers.md").read_text()
    rows = {r.get("run", r.get("subject")): r for _, table in all_tables(text) for r in table}
    assert rows["`lib.chunk`"]["failed"] in ("2", "0"), rows
    assert "12.5" in text and "800" in text and "shrunk to `N=1 T=2`" in text
    assert "drawn: 5" in text, text
    back["subjects"] = [{"status": "RAN"}]
    (results / "b.json").write_text(json.dumps(back))
    broken = make_reports(tmp_path / "results", tmp_path / "out2")
    assert broken.returncode == 2 and "b.json" in broken.stderr, broken.stderr


def test_peers_md_explains_the_fails_it_shows(tmp_path):
    """peers.md carries "What the FAILs mean" (gdn_reports/peer_findings.py) when the runs it
    explains FAIL in the results, and not otherwise."""
    results = tmp_path / "results" / "h100" / "python"
    results.mkdir(parents=True)
    run = {"format": "gdn-adapter-verdicts/1", "created": "2026-12-06", "commit": "abc1234", "command": "x",
           "device": {"nvidia_smi": "H100"}, "runs": [],
           "table": [{"id": "flash_qla.chunk", "status": "DONE", "verdict": "FAIL", "judged": 435, "failed": 1,
                      "errors": 0, "skipped": 0, "worst_margin": 2.09, "budget": "calibrated"}]}
    (results / "a.json").write_text(json.dumps(run))
    assert make_reports(tmp_path / "results", tmp_path / "out").returncode == 0
    text = (tmp_path / "out" / "peers.md").read_text()
    assert "## What the FAILs mean: bug or design" in text and "operands_single_qk" in text
    run["table"][0]["verdict"] = "PASS"
    (results / "a.json").write_text(json.dumps(run))
    assert make_reports(tmp_path / "results", tmp_path / "out2").returncode == 0
    assert "What the FAILs mean" not in (tmp_path / "out2" / "peers.md").read_text()
