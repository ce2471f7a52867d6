#!/usr/bin/env python3
"""Builds the accuracy and speed reports from the current result sets, in one command:

    python3 reports/make_reports.py --results reports/results --out reports/

Reads every *.json / *.jsonl under --results (one folder per device kind: results/<kind>/, the
layout and schemas in reports/README.md) and writes, atomically, --out/accuracy.md,
--out/speed.md, --out/faults.md (when a fault campaign is among the results), --out/peers.md (when
Python adapter or backward verdicts are), their detail files under --out/details/ and their plots under --out/plots/;
plots and detail files of an earlier run that this run did not write are removed, so that
what is there comes from the current results only. A missing result file shows as a "not
measured" row. Exit status: 0 on success, 2 when an input breaks its schema (the message names
the file and the rule; nothing is written), 77 when matplotlib is missing (CTest's skip code).
"""
from __future__ import annotations

import argparse
import datetime
import re
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", required=True, help="folder of committed results (searched recursively)")
    parser.add_argument("--out", required=True, help="folder for accuracy.md, speed.md and plots/")
    parser.add_argument("--date", default=None,
                        help="date written into the reports (default: today, UTC); fixed dates keep "
                             "regenerated reports byte-identical")
    args = parser.parse_args(argv)

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("make_reports: SKIPPED: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return 77

    from gdn_reports import accuracy, faults, peer_verdicts, speed
    from gdn_reports.common import write_text_atomically
    from gdn_reports.inputs import InputError, load_results

    results_dir, out_dir = Path(args.results), Path(args.out)
    if not results_dir.is_dir():
        print(f"make_reports: --results: no such folder '{results_dir}'", file=sys.stderr)
        return 2
    try:
        results = load_results(results_dir)
    except InputError as error:
        print(f"make_reports: {error}", file=sys.stderr)
        return 2
    # The command as a user would retype it: paths as given, not the interpreter's.
    command = "python3 reports/make_reports.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    generated = args.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    plot_dir = out_dir / "plots"

    existing_plots = set(plot_dir.glob("accuracy_*.png")) | set(plot_dir.glob("speed_*.png"))
    existing_details = set((out_dir / "details").glob("*.md"))
    accuracy_text, accuracy_details = accuracy.build(results, out_dir, plot_dir, command, generated)
    speed_text, speed_details = speed.build(results, out_dir, plot_dir, command, generated)
    if results.ignored:
        note = "\n## Ignored files\n\n" + "\n".join(f"- `{path}`: {why}" for path, why in results.ignored) + "\n"
        accuracy_text += note
        speed_text += note
    details = {**accuracy_details, **speed_details}
    for name, text in details.items():
        write_text_atomically(out_dir / name, text)
    write_text_atomically(out_dir / "accuracy.md", accuracy_text)
    write_text_atomically(out_dir / "speed.md", speed_text)
    if results.adapter_runs or results.backward_runs:
        write_text_atomically(out_dir / "peers.md", peer_verdicts.build(results, command, generated))
    if results.faults or results.conformance_runs:
        write_text_atomically(out_dir / "faults.md", faults.build(results, command, generated))
    written = {out_dir / name for name in details}
    linked = {out_dir / link for text in (accuracy_text, speed_text)
              for link in re.findall(r"!\[[^\]]*\]\((plots/[^)]+)\)", text)}
    for stale in sorted((existing_plots - linked) | (existing_details - written)):
        stale.unlink()
    print(f"make_reports: {len(results.verdicts)} verdicts, {len(results.benchmarks)} benchmarks, "
          f"{len(results.peers)} peer results -> {out_dir / 'accuracy.md'}, {out_dir / 'speed.md'}, "
          f"{len(details)} detail files, {len(linked)} plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
