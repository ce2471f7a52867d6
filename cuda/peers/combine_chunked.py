#!/usr/bin/env python3
"""Combines one H200 call's chunked-prefill results into prefill_peers.json: our Google Benchmark
rows (prefill.json, automatic V tile), fla's timed run (fla_chunk.json) and the accuracy judge
(accuracy.json), matched by shape name. Ratios only between files of the same call (the commits
must agree). Written atomically.

usage: combine_chunked.py PREFILL_JSON FLA_JSON ACCURACY_JSON OUT_JSON [--accuracy-call NOTE]
"""
import json
import os
import sys
import tempfile


def main(argv):
    if len(argv) < 5:
        sys.exit(__doc__)
    prefill, fla, accuracy = (json.load(open(p)) for p in argv[1:4])
    out_path = argv[4]
    note = argv[6] if len(argv) > 6 and argv[5] == "--accuracy-call" else ""
    commit = prefill["context"].get("COMMIT") or prefill["context"].get("commit")
    if fla.get("commit") != commit:
        sys.exit(f"prefill.json is commit {commit}, fla_chunk.json {fla.get('commit')}: not the same call")
    ours = {}
    for b in prefill["benchmarks"]:
        if "/value_tile:0/" in b["name"]:  # the automatic V tile: what a caller gets
            ours[b.get("label", b["name"])] = b
    rows = []
    for r in fla["results"]:
        b = ours.get(r["name"])
        if b is None:
            continue
        rows.append({
            "shape": r["name"], "T": r["T"], "H": r["H"], "HV": r["HV"], "sequences": r["sequences"],
            "ours_ms": b["ms"], "fla_ms": r["ms"], "speed_vs_fla": r["ms"] / b["ms"],
            "ours_TFLOPs": b["TFLOPs"], "fla_TFLOPs": r["TFLOPs"],
            "ours_fraction_of_copy": b["fraction_of_copy"], "fla_fraction_of_copy": r.get("fraction_of_copy"),
            "ours_value_tile": b["value_tile"],
        })
    out = {
        "what": "gdn-testbed cuda.chunked_prefill vs flash-linear-attention chunk_gated_delta_rule, same H200 call",
        "device": fla.get("device"), "date": fla.get("date"), "commit": commit,
        "command": prefill["context"].get("COMMAND", "") + " ; " + fla.get("command", ""),
        "speed_comparison": rows,
        "speed_fla": fla,
        "speed_ours": "prefill.json (Google Benchmark JSON, same call)",
        "accuracy": accuracy,
        "accuracy_note": note,
    }
    folder = os.path.dirname(os.path.abspath(out_path))
    with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as f:
        json.dump(out, f, indent=1)
        tmp = f.name
    os.replace(tmp, out_path)
    for r in rows:
        print(f"{r['shape']:20s} ours {r['ours_ms']:.3f} ms  fla {r['fla_ms']:.3f} ms  fla/ours {r['speed_vs_fla']:.2f}x")


if __name__ == "__main__":
    main(sys.argv)
