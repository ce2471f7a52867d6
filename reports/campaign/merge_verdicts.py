#!/usr/bin/env python3
"""Joins the verdict JSON files (`gdn-verdicts/1`) that parallel `gdn-testbed verify` shards
wrote into one, with the provenance the reports state (device, date, commit, command), and
copies a few failing case files for replay.

    python3 reports/campaign/merge_verdicts.py --out verify_fla_chunk.json --device "NVIDIA H200" \
        --command "scripts/gpu_run.sh ..." [--failures DIR] SHARD.json...

The output keeps gdn-testbed's format (format, command, versions, summary, verdicts) and adds
top-level device, date, commit and shards; it is written atomically.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
from pathlib import Path


def write_json_atomically(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    temporary.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shards", nargs="*")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default=None)
    parser.add_argument("--date", default=None)
    parser.add_argument("--commit", default=None)
    parser.add_argument("--command", default=None)
    parser.add_argument("--failures", default=None, help="copy failing case files here (with REPLAY.md)")
    parser.add_argument("--max-failures", type=int, default=8)
    parser.add_argument("--max-failure-bytes", type=int, default=4 << 20)
    args = parser.parse_args(argv)

    verdicts, versions, commands, problems = [], {}, [], []
    for shard in args.shards:
        try:
            data = json.loads(Path(shard).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            problems.append(f"{shard}: {error}")
            continue
        if data.get("format") != "gdn-verdicts/1":
            problems.append(f"{shard}: format {data.get('format')!r}, expected 'gdn-verdicts/1'")
            continue
        verdicts.extend(data.get("verdicts", []))
        versions.update(data.get("versions", {}))
        commands.append(data.get("command", ""))
    summary = {"total": len(verdicts)}
    for status in ("PASS", "FAIL", "ERROR", "SKIPPED"):
        summary[status.lower()] = sum(1 for v in verdicts if v.get("status") == status)
    merged = {"format": "gdn-verdicts/1", "command": args.command or " ; ".join(commands),
              "device": args.device,
              "date": args.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "commit": args.commit or versions.get("gdn-testbed"), "versions": versions, "summary": summary,
              "shards": {"count": len(args.shards), "commands": commands, "unreadable": problems},
              "verdicts": verdicts}
    write_json_atomically(Path(args.out), merged)

    if args.failures:
        folder = Path(args.failures)
        copied = []
        for v in verdicts:
            if len(copied) >= args.max_failures:
                break
            path = Path(v.get("message", ""))
            if v.get("status") in ("FAIL", "ERROR") and path.is_file() and path.stat().st_size <= args.max_failure_bytes:
                folder.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, folder / path.name)
                copied.append((path.name, v))
        if copied:
            lines = ["# Failing case files (outputs of the implementation included)", "",
                     "Replay one with `gdn-testbed replay FILE` (it judges the outputs stored in the file).", ""]
            for name, v in copied:
                lines.append(f"- `{name}`: {v.get('implementation')} {v.get('status')} "
                             f"error/budget {v.get('worst_margin')}: {v.get('problem')}")
            (folder / "REPLAY.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"merge_verdicts: {len(verdicts)} verdicts from {len(args.shards)} shards -> {args.out} "
          f"(pass {summary['pass']}, fail {summary['fail']}, error {summary['error']}, skipped {summary['skipped']})"
          + (f"; unreadable: {problems}" if problems else ""))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
