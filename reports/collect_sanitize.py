#!/usr/bin/env python3
"""Turns compute-sanitizer logs into the result set's sanitize.json (reports/README.md):

    python3 reports/collect_sanitize.py --out sanitize.json --device "NVIDIA H200" \
        --commit abc1234 --command "scripts/gpu_run.sh ..." --filter "[conformance]" \
        memcheck=memcheck.log:0 racecheck=racecheck.log:0 initcheck=initcheck.log:0 synccheck=synccheck.log:0

Each TOOL=LOG:EXIT names one tool's log and the exit code the sanitizer returned. A log may also
hold several tools in sections headed `---- TOOL` (`--combined LOG`). Per tool the file states the
errors (the `ERROR SUMMARY` line), the hazards, errors and warnings (racecheck's `RACECHECK
SUMMARY` line), the exit code, whether it passed (exit 0, no errors, no hazards), and the test
filter the suite ran under. A tool of the four that has no log is written as not run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
_ERRORS = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_RACE = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_EXIT = re.compile(r"^(\w+) exit (-?\d+)\s*$", re.M)
_PASSED = re.compile(r"(Passed all \d+ test cases?[^\n]*|test cases: [^\n]*)")


def parse_tool(text: str, exit_code: int | None) -> dict:
    """What one tool's log says. A log may hold several runs (one per test filter) or repeat a
    summary (a tail after the full output): the largest count of any summary line counts, so a
    run with errors is never hidden by a clean one after it."""
    errors = [int(m) for m in _ERRORS.findall(text)]
    races = _RACE.findall(text)
    entry: dict = {"run": True, "exit_code": exit_code}
    if errors:
        entry["errors"] = max(errors)
    if races:
        hazards, race_errors, warnings = (max(int(r[i]) for r in races) for i in range(3))
        entry.update(hazards=hazards, errors=race_errors, warnings=warnings)
    if "errors" not in entry:
        entry["errors"] = None  # no summary line: the tool did not finish
    tests = _PASSED.findall(text)
    if tests:
        entry["tests"] = tests[-1].strip()
    entry["passed"] = (exit_code == 0 and entry["errors"] == 0 and entry.get("hazards", 0) == 0)
    return entry


def split_combined(text: str) -> dict[str, tuple[str, int | None]]:
    """Sections `---- TOOL` (and `---- TOOL full log (tail)`) of one log, with the `TOOL exit N`
    lines they end with."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        header = re.match(r"^---- (\w+)", line)
        if header:
            current = header.group(1)
            sections.setdefault(current, [])
            continue
        if current:
            sections[current].append(line)
    out = {}
    for tool, lines in sections.items():
        body = "\n".join(lines)
        exits = [int(code) for name, code in _EXIT.findall(body) if name == tool]
        out[tool] = (body, exits[-1] if exits else None)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default=None)
    parser.add_argument("--commit", default=None)
    parser.add_argument("--command", default=None)
    parser.add_argument("--date", default=None, help="default: now, UTC")
    parser.add_argument("--filter", default="", help="the test filter the GPU suite ran under")
    parser.add_argument("--combined", default=None, help="one log with a `---- TOOL` section per tool")
    parser.add_argument("logs", nargs="*", help="TOOL=LOG:EXIT")
    args = parser.parse_args(argv)

    found: dict[str, tuple[str, int | None]] = {}
    if args.combined:
        found.update(split_combined(Path(args.combined).read_text(errors="replace")))
    for item in args.logs:
        match = re.match(r"^(\w+)=(.+?)(?::(-?\d+))?$", item)
        if not match:
            parser.error(f"expected TOOL=LOG:EXIT, got {item!r}")
        tool, log, code = match.groups()
        text = Path(log).read_text(errors="replace") if Path(log).is_file() else ""
        found[tool] = (text, int(code) if code is not None else None)

    tools = {}
    for tool in sorted(set(TOOLS) | set(found), key=lambda t: (TOOLS.index(t) if t in TOOLS else 99, t)):
        if tool in found:
            tools[tool] = dict(parse_tool(*found[tool]), filter=args.filter)
        else:
            tools[tool] = {"run": False}
    data = {"format": "gdn-sanitize/1", "device": args.device, "commit": args.commit, "command": args.command,
            "date": args.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tools": tools}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(f".{out.name}.tmp.{os.getpid()}")
    temporary.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, out)
    failed = [t for t, e in tools.items() if e.get("run") and not e.get("passed")]
    print(f"collect_sanitize: {', '.join(t for t, e in tools.items() if e.get('run'))} -> {out}"
          + (f"; not clean: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
