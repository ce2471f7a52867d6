#!/usr/bin/env python3
"""Condenses a campaign's raw outputs into the one file the result set keeps, campaign/summary.json:

    python3 reports/campaign/summarize_campaign.py --raw RAW_DIR --out results/<kind>/campaign/summary.json \
        [--device D --commit C --command CMD --date DATE]

RAW_DIR holds what the campaign wrote: verdict JSON of `gdn-testbed verify / conformance --json`
(merge_verdicts.py's merged files included), adapter logs (`adapter_*.jsonl`), the merged fuzz
results (`gdn-testbed merge`, stamped by stamp_provenance.py). They are read by the reports' own
loader (gdn_reports.inputs), so the summary holds exactly what the reports would have shown from
the raw files: one compact row per verdict (implementation, case, status, dtype, K, V, longest
sequence (T and N where the longest is not known), gate regime, relative RMS error of o and hT, worst error/budget (6 significant digits), the raw file that
judged it; problem, worst check and message only for verdicts that did not pass; names and raw
files as indices into `implementations` and `judges`), the fuzz tallies and shrunk failures, and the
provenance of every raw file. Format `gdn-campaign-summary/1` (reports/README.md). The raw files
(a few MB of per-check metrics) stay out of the tree.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gdn_reports.common import fmt  # noqa: E402
from gdn_reports.accuracy import dtype_of, gate_regime, longest_sequence  # noqa: E402
from gdn_reports.inputs import InputError, load_results  # noqa: E402

FORMAT = "gdn-campaign-summary/1"
COLUMNS = ["implementation", "case", "status", "dtype", "K", "V", "T", "N", "longest", "regime", "rel_rms_o", "rel_rms_hT",
           "worst_margin", "source", "problem", "worst_check", "message"]


def finite_or_text(value):
    """JSON has no inf/nan: the oracle's spelling ("inf", "nan") keeps them."""
    if value is None:
        return None
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return float(f"{value:.6g}")


def worst_check_text(v) -> str:
    failing = [c for c in v.checks if c["margin"] is not None and not c["pass"]]
    if not failing:
        return v.worst_check
    worst = max(failing, key=lambda c: c["margin"])
    return f"{worst['tensor']} {worst['metric']}: {fmt(worst['error'])} > {fmt(worst['budget'])}"


def summarize(raw: Path, overrides: dict) -> dict:
    results = load_results(raw)
    names = sorted({v.implementation for v in results.verdicts})
    judges = sorted({v.judge for v in results.verdicts})
    rows = []
    for v in results.verdicts:
        longest, exact = longest_sequence(v)
        passed = v.status == "PASS"
        # verify's message is the judged file's path: nothing a reader needs once the file is gone.
        message = "" if passed or v.message.endswith(".safetensors") else v.message[:160]
        rows.append([names.index(v.implementation), "" if passed else v.case, v.status, dtype_of(v),
                     v.problem.get("K"), v.problem.get("V"), None if exact else v.problem.get("T"),
                     None if exact else v.problem.get("N"), longest if exact else None, gate_regime(v), finite_or_text(v.rel_rms.get("o")),
                     finite_or_text(v.rel_rms.get("hT")), finite_or_text(v.worst_margin), judges.index(v.judge),
                     "" if passed else v.problem_text, "" if passed else worst_check_text(v), message])
    sources = [{"file": p.path, "kind": p.kind, "records": p.records, "device": p.device, "date": p.date,
                "commit": p.commit, "command": p.command} for p in results.provenance]

    def first(key):
        values = [s[key] for s in sources if s.get(key)]
        return values[0] if values else None

    fuzz = None
    if results.fuzz:
        fuzz = {"tallies": {t["implementation"]: {k: (finite_or_text(t[k]) if k == "worst_margin" else t[k])
                                                  for k in ("pass", "fail", "error", "skipped", "worst_margin", "worst_case")}
                            for t in results.fuzz},
                "cases": sum(t["cases"] or 0 for t in {t["source"]: t for t in results.fuzz}.values()),
                "seconds": results.fuzz[0]["seconds"],
                "failures": results.fuzz_failures}
    return {"format": FORMAT,
            "device": overrides.get("device") or first("device"), "date": overrides.get("date") or first("date"),
            "commit": overrides.get("commit") or first("commit"), "command": overrides.get("command") or first("command"),
            "sources": sources, "ignored": [{"file": f, "why": why} for f, why in results.ignored],
            "implementations": names, "judges": judges, "columns": COLUMNS, "verdicts": rows, "fuzz": fuzz}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--raw", required=True, help="folder of the campaign's raw outputs")
    parser.add_argument("--out", required=True, help="the summary JSON to write")
    for key in ("device", "date", "commit", "command"):
        parser.add_argument(f"--{key}", default=None, help=f"the campaign's {key} (default: the first raw file's)")
    args = parser.parse_args(argv)
    try:
        summary = summarize(Path(args.raw), vars(args))
    except InputError as error:
        print(f"summarize_campaign: {error}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(f".{out.name}.tmp.{os.getpid()}")
    # One verdict per line: small diffs between runs, readable with grep.
    lines = json.dumps({k: v for k, v in summary.items() if k != "verdicts"}, indent=1)[:-2]
    body = ",\n".join(json.dumps(row, separators=(",", ":")) for row in summary["verdicts"])
    temporary.write_text(lines + ',\n "verdicts": [\n' + body + "\n ]\n}\n", encoding="utf-8")
    json.loads(temporary.read_text(encoding="utf-8"))
    os.replace(temporary, out)
    print(f"summarize_campaign: {len(summary['verdicts'])} verdicts of {len(summary['implementations'])} "
          f"implementations -> {out} ({out.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
