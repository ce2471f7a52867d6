#!/usr/bin/env python3
"""Combines one device call's chunked-prefill results into prefill_peers.json: our Google Benchmark
rows (prefill.json: the default, automatic V tile without the sequence split, and where the
benchmark ran it the automatic split, a named mode that is not batch invariant), fla's timed run (fla_chunk.json) and the accuracy judge
(accuracy.json), matched by shape name; BM_chunked_default rows (ChunkedOptions{}) are ours where present,
BM_chunked_two_tiles rows (the plan's two V tiles) and the one-tile unsplit rows beside them,
BM_chunked_single rows (ChunkedRounding::single, a named mode) as ours_single. Ratios only between files of the same call (the commits
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
    ours, unsplit, split, two, single = {}, {}, {}, {}, {}
    has_default = any(b["name"].startswith("BM_chunked_default/") for b in prefill["benchmarks"])
    for b in prefill["benchmarks"]:
        name = b["name"]
        # What a caller gets with ChunkedOptions{}: BM_chunked_default where the file has it
        # (since the defaults became the split by the heads and the plan's two V tiles), else
        # the automatic V tile without the split (the default of older files; older still have
        # no split argument).
        one_tile = "/value_tile:0/split:0/" in name or (
            name.startswith("BM_chunked/") and "/value_tile:0/" in name and "/split:" not in name)
        if name.startswith("BM_chunked_default/") or (one_tile and not has_default):
            ours[b.get("label", name)] = b
        if one_tile and has_default:
            unsplit[b.get("label", name)] = b
        if "/value_tile:0/split:-1/" in name:  # kChunkedSplitAuto
            split[b.get("label", name)] = b
        if name.startswith("BM_chunked_single/"):
            single[b.get("label", name)] = b
        # The plan's two V tiles (older files: the row has only the shape argument).
        if name.startswith("BM_chunked_two_tiles/") and ("/long_value_tile:0/" in name or "/long_value_tile:" not in name):
            two[b.get("label", name)] = b
    rows = []
    for r in fla["results"]:
        b = ours.get(r["name"])
        if b is None:
            continue
        s = split.get(r["name"])
        extra = {}
        if s is not None:
            extra = {"ours_split_auto_ms": s["ms"], "speed_vs_fla_split_auto": r["ms"] / s["ms"],
                     "split_auto_chunks": s.get("split_chunks"), "split_auto_value_tile": s.get("value_tile")}
        u = unsplit.get(r["name"])
        if u is not None:
            extra.update({"ours_one_tile_unsplit_ms": u["ms"], "speed_vs_fla_one_tile_unsplit": r["ms"] / u["ms"],
                          "one_tile_unsplit_value_tile": u.get("value_tile")})
        w = two.get(r["name"])
        if w is not None:
            extra.update({"ours_two_tiles_ms": w["ms"], "speed_vs_fla_two_tiles": r["ms"] / w["ms"],
                          "two_tiles_long_value_tile": w.get("long_value_tile"),
                          "two_tiles_long_above_chunks": w.get("long_above_chunks"),
                          "two_tiles_value_tile": w.get("value_tile")})
        g = single.get(r["name"])
        if g is not None:
            extra.update({"ours_single_ms": g["ms"], "speed_vs_fla_single": r["ms"] / g["ms"],
                          "single_value_tile": g.get("value_tile"), "single_split_chunks": g.get("split_chunks")})
        rows.append({
            "shape": r["name"], "T": r["T"], "H": r["H"], "HV": r["HV"], "sequences": r["sequences"],
            "ours_ms": b["ms"], "fla_ms": r["ms"], "speed_vs_fla": r["ms"] / b["ms"],
            "ours_TFLOPs": b["TFLOPs"], "fla_TFLOPs": r["TFLOPs"],
            "ours_fraction_of_copy": b["fraction_of_copy"], "fla_fraction_of_copy": r.get("fraction_of_copy"),
            "ours_value_tile": b["value_tile"], "ours_split_chunks": b.get("split_chunks"),
            "ours_long_value_tile": b.get("long_value_tile"), "ours_long_above_chunks": b.get("long_above_chunks"),
            **extra,
        })
    out = {
        "what": "gdn-testbed cuda.chunked_prefill vs flash-linear-attention chunk_gated_delta_rule, same device call",
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
        line = f"{r['shape']:20s} ours {r['ours_ms']:.3f} ms  fla {r['fla_ms']:.3f} ms  fla/ours {r['speed_vs_fla']:.2f}x"
        if "ours_one_tile_unsplit_ms" in r:
            line += f"  one tile unsplit {r['ours_one_tile_unsplit_ms']:.3f} ms ({r['speed_vs_fla_one_tile_unsplit']:.2f}x)"
        if "ours_split_auto_ms" in r:
            line += f"  split auto {r['ours_split_auto_ms']:.3f} ms ({r['speed_vs_fla_split_auto']:.2f}x)"
        if "ours_two_tiles_ms" in r:
            line += f"  two tiles {r['ours_two_tiles_ms']:.3f} ms ({r['speed_vs_fla_two_tiles']:.2f}x)"
        if "ours_single_ms" in r:
            line += f"  single rounding {r['ours_single_ms']:.3f} ms ({r['speed_vs_fla_single']:.2f}x)"
        print(line)


if __name__ == "__main__":
    main(sys.argv)
