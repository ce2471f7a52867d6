"""The speed report: gdn-testbed's Google Benchmark results per shape, with throughput, the
fraction of the copy bandwidth and of the FLOP ceiling, and the ratio to every peer measured
at the same shape."""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from .common import fmt, fmt_fixed, fmt_percent, provenance_table, save_figure_atomically, table
from .inputs import SHAPE_KEYS

# Used only when the benchmark context names no ceiling; stated as "datasheet" in the report.
# NVIDIA H200 SXM: 989.4 TFLOP/s dense BF16/FP16 tensor-core peak (NVIDIA's H200 datasheet,
# half of the 1979 "with sparsity" figure).
DATASHEET_FLOP_CEILING = [("H200", 989.4e12, "H200 SXM datasheet, dense bf16 tensor core")]


def counter(counters: dict, *names, scale: float = 1.0):
    for name in names:
        if counters.get(name) is not None and not isinstance(counters[name], str):
            return counters[name] * scale
    return None


def tokens_per_second(counters: dict, shape: dict, time_ms: float):
    value = counter(counters, "tokens_per_second", "tokens_per_s", "items_per_second")
    if value is None and "T" in shape and time_ms > 0:
        value = shape["T"] / (time_ms * 1e-3)
    return value


def bytes_per_second(counters: dict):
    return counter(counters, "bytes_per_second") or counter(counters, "state_GBps", "GBps", scale=1e9)


def flop_per_second(counters: dict):
    value = counter(counters, "flop_per_second", "FLOP_per_second", "flops_per_second", "flop_per_s")
    if value is None:
        value = counter(counters, "TFLOPS", "TFLOP_per_second", "TFLOP_per_s", "tflops", "TFLOPs", scale=1e12)
    return value


def shape_label(shape: dict) -> str:
    keys = [k for k in SHAPE_KEYS if k in shape] + sorted(k for k in shape if k not in SHAPE_KEYS)
    return " ".join(f"{key}={shape[key]}" for key in keys) or "n/a"


def is_copy(benchmark) -> bool:
    return "copy" in benchmark.name.lower()


def peer_matches(peer, benchmark) -> bool:
    """A peer result measures the same problem as a benchmark when every shape field the
    peer gives (N, T, H, HV, K, V, batch, sequences, length, ...) has the same value in the
    benchmark's shape, and its `kind` (decode, prefill), when given, appears in the
    benchmark's name. Tuning arguments only the benchmark has (tile, graph mode) do not
    matter: every variant is compared with the same peer time. Or the benchmark's label is
    the peer result's name (a named shape)."""
    # A named shape: the benchmark's label (SetLabel) equals the peer result's name, e.g.
    # "qwen3next_4x8192" in cuda/chunked_bench.cpp and cuda/peers/fla_chunk.py; the token
    # count must agree where both give it.
    if benchmark.label and peer.name == benchmark.label:
        return "T" not in peer.shape or "T" not in benchmark.shape or peer.shape["T"] == benchmark.shape["T"]
    if not peer.shape or not benchmark.shape:
        return False
    kind = peer.counters.get("kind")
    if isinstance(kind, str) and kind.lower() not in benchmark.name.lower():
        return False
    return all(benchmark.shape.get(key) == value for key, value in peer.shape.items())


def copy_bandwidth(benchmarks, context: dict):
    """(bytes/s, how it was found) of the plain copy measured in the same run: a benchmark
    named *copy* (its bytes_per_second or copy_GBps), else a copy_GBps counter the benchmarks
    carry, else the context's copy_bytes_per_second (or copy_GBps_measured, GB/s, as
    cuda/bench_common.cpp records it)."""
    copies = []
    for b in benchmarks:
        if is_copy(b):
            value = counter(b.counters, "bytes_per_second") or counter(b.counters, "copy_GBps", scale=1e9)
            if value:
                copies.append((value, f"benchmark `{b.name}`"))
    if not copies:
        for b in benchmarks:
            value = counter(b.counters, "copy_GBps", scale=1e9)
            if value:
                copies.append((value, f"counter `copy_GBps` of `{b.name}`"))
                break
    if copies:
        return max(copies)
    for key, scale in (("copy_bytes_per_second", 1.0), ("gdn.copy_bytes_per_second", 1.0),
                       ("copy_GBps_measured", 1e9)):
        if context.get(key):
            try:
                return float(context[key]) * scale, f"context `{key}`"
            except ValueError:
                pass
    return None, None


def flop_ceiling(context: dict, device: str | None):
    for key in ("flop_ceiling_per_second", "gdn.flop_ceiling_per_second"):
        if context.get(key):
            try:
                return float(context[key]), f"context `{key}`"
            except ValueError:
                pass
    for fragment, value, why in DATASHEET_FLOP_CEILING:
        if device and fragment in device:
            return value, why
    return None, None


def peer_label(p, shape_names=frozenset()) -> str:
    """The column of a peer result: its name (the peer's function), or the peer itself when the
    name is a named shape (a benchmark label): one column per function, whatever the shape."""
    return (p.peer or p.name) if p.name in shape_names else p.name


def peer_time_ms(peer, benchmark) -> float:
    """The peer time a benchmark row is compared with: the peer's held time (`held_ms`: the
    device's time alone, the stream held until the call is enqueued) for a row timed held
    (counter `held` = 1), where the peer recorded one; else its median time. A held row against
    the peer's do_bench time would credit gdn-testbed with the peer's Python launch cost."""
    held = peer.counters.get("held_ms")
    if benchmark.counters.get("held") == 1 and held:
        return float(held)
    return peer.time_ms


def rows_for(benchmarks, context: dict, device: str | None, peers) -> tuple[list, list, dict]:
    """Per benchmark: the values the table shows (the test recomputes these)."""
    copy_bw, copy_source = copy_bandwidth(benchmarks, context)
    ceiling, ceiling_source = flop_ceiling(context, device)
    measured = [b for b in benchmarks if not is_copy(b)]
    shape_names = frozenset(b.label for b in measured if b.label)
    peer_names = sorted({peer_label(p, shape_names) for p in peers if any(peer_matches(p, b) for b in measured)})
    rows = []
    for b in measured:
        bytes_s = bytes_per_second(b.counters)
        flops = flop_per_second(b.counters)
        if bytes_s is not None and copy_bw:
            fraction = bytes_s / copy_bw
        else:
            fraction = counter(b.counters, "fraction_of_copy", "copy_fraction")
        row = {"name": b.name, "shape": shape_label(b.shape), "time_ms": b.time_ms, "T": b.shape.get("T"),
               "tokens_per_second": tokens_per_second(b.counters, b.shape, b.time_ms),
               "bytes_per_second": bytes_s, "copy_fraction": fraction, "flop_per_second": flops,
               "flop_fraction": flops / ceiling if flops is not None and ceiling else None, "peers": {}}
        for name in peer_names:
            match = [p for p in peers if peer_label(p, shape_names) == name and peer_matches(p, b)]
            p = match[0] if match else None
            time_ms = peer_time_ms(p, b) if p else None
            row["peers"][name] = (time_ms, time_ms / b.time_ms) if p else (None, None)
        rows.append(row)
    sources = {"copy": (copy_bw, copy_source), "ceiling": (ceiling, ceiling_source)}
    return rows, peer_names, sources


def _plots(sections, out_dir: Path, plot_dir: Path) -> list[tuple[str, Path]]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for slug, title, rows, peer_names in sections:
        if not rows:
            continue
        labels = [f"{r['name'].split('/')[0]}\n{r['shape']}" for r in rows]
        figure, axis = plt.subplots(figsize=(max(6.0, 1.3 * len(rows) + 2), 4.2))
        series = [("gdn-testbed", [r["tokens_per_second"] or 0 for r in rows])]
        for name in peer_names:
            # Same problem, so the peer's tokens/s is ours scaled by the time ratio.
            series.append((name, [(r["tokens_per_second"] / r["peers"][name][1])
                                  if r["peers"][name][1] and r["tokens_per_second"] else 0 for r in rows]))
        width = 0.8 / len(series)
        for i, (name, values) in enumerate(series):
            axis.bar([x + (i - (len(series) - 1) / 2) * width for x in range(len(rows))], values, width, label=name)
        axis.set_xticks(range(len(rows)))
        axis.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        axis.set_ylabel("tokens / s")
        axis.set_title(f"{title}: throughput per shape")
        axis.legend(fontsize=8)
        axis.grid(True, axis="y", alpha=0.3)
        path = plot_dir / f"speed_{slug}_throughput.png"
        save_figure_atomically(figure, path)
        plt.close(figure)
        written.append((f"{title}: tokens per second per shape, gdn-testbed and peers", path))

        if peer_names:
            figure, axis = plt.subplots(figsize=(max(6.0, 1.3 * len(rows) + 2), 4.0))
            width = 0.8 / len(peer_names)
            for i, name in enumerate(peer_names):
                values = [r["peers"][name][1] or 0 for r in rows]
                axis.bar([x + (i - (len(peer_names) - 1) / 2) * width for x in range(len(rows))], values, width,
                         label=f"vs {name}")
            axis.axhline(1.0, color="red", linestyle="--", linewidth=1)
            axis.set_xticks(range(len(rows)))
            axis.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
            axis.set_ylabel("speed-up (peer time / gdn-testbed time)")
            axis.set_title(f"{title}: ratio to each peer (above 1: gdn-testbed faster)")
            axis.legend(fontsize=8)
            axis.grid(True, axis="y", alpha=0.3)
            path = plot_dir / f"speed_{slug}_ratio.png"
            save_figure_atomically(figure, path)
            plt.close(figure)
            written.append((f"{title}: speed-up over each peer at the same shape", path))
    return written


ROW_HEADERS = ["benchmark", "shape", "time (ms)", "tokens/s", "GB/s", "of copy BW", "TFLOP/s", "of FLOP ceiling"]


def build(results, out_dir: Path, plot_dir: Path, command: str, generated: str) -> str:
    inputs = [p for p in results.provenance if p.kind == "google-benchmark" or p.kind.startswith("peer")]
    lines = ["# Speed report", "",
             f"Generated {generated} by `{command}` from the committed results below. Times are the "
             "median over repetitions where the benchmark ran several (else its single run); the ratio to a "
             "peer is the peer's median time over gdn-testbed's on the same problem (every shape field the peer "
             "gives equal in the benchmark's arguments); for rows timed held (counter held = 1: the device's "
             "time alone) it is the peer's held time (held_ms) where the peer recorded one.",
             "", "## Inputs", "", provenance_table(inputs) if inputs else "No benchmark or peer files found.", ""]
    by_source = defaultdict(list)
    for b in results.benchmarks:
        by_source[b.source].append(b)
    provenance = {p.path: p for p in results.provenance}
    sections = []
    for source in sorted(by_source):
        context = results.context.get(source, {})
        device = provenance[source].device if source in provenance else None
        rows, peer_names, sources = rows_for(by_source[source], context, device, results.peers)
        headers = ROW_HEADERS + [h for name in peer_names for h in (f"{name} (ms)", f"speed-up vs {name}")]
        cells = []
        for r in rows:
            cell = [r["name"], r["shape"], fmt(r["time_ms"]), fmt(r["tokens_per_second"]),
                    fmt(r["bytes_per_second"] / 1e9 if r["bytes_per_second"] is not None else None),
                    fmt_percent(r["copy_fraction"]),
                    fmt(r["flop_per_second"] / 1e12 if r["flop_per_second"] is not None else None),
                    fmt_percent(r["flop_fraction"])]
            for name in peer_names:
                peer_ms, ratio = r["peers"][name]
                cell += [fmt(peer_ms), fmt_fixed(ratio, 2) if ratio is not None else "n/a"]
            cells.append(cell)
        copy_bw, copy_source = sources["copy"]
        ceiling, ceiling_source = sources["ceiling"]
        lines += [f"## {source}", "",
                  f"Copy bandwidth: {fmt(copy_bw / 1e9) + ' GB/s (' + copy_source + ')' if copy_bw else 'not measured in this run'}. "
                  f"FLOP ceiling: {fmt(ceiling / 1e12) + ' TFLOP/s (' + ceiling_source + ')' if ceiling else 'not known'}.",
                  "", table(headers, cells), ""]
        slug = "".join(ch if ch.isalnum() else "_" for ch in Path(source).with_suffix("").as_posix())
        sections.append((slug, source, rows, peer_names))

    by_peer_file = defaultdict(list)
    for p in results.peers:
        by_peer_file[p.source].append(p)
    for source in sorted(by_peer_file):
        entries = by_peer_file[source]
        rows = []
        for p in entries:
            bytes_s = bytes_per_second(p.counters)
            rows.append([p.name, (f"{p.counters['kind']} " if isinstance(p.counters.get("kind"), str) else "") +
                         shape_label(p.shape), fmt(p.time_ms), fmt(tokens_per_second(p.counters, p.shape, p.time_ms)),
                         fmt(bytes_s / 1e9 if bytes_s is not None else None),
                         fmt_percent(counter(p.counters, "fraction_of_copy", "copy_fraction"))])
        lines += [f"## Peer {entries[0].peer} {entries[0].version} ({source})", "",
                  table(["name", "shape", "median (ms)", "tokens/s", "GB/s", "of copy BW"], rows), ""]

    plots = _plots(sections, out_dir, plot_dir)
    if plots:
        lines += ["## Plots", ""]
        for caption, path in plots:
            lines += [f"![{caption}]({path.relative_to(out_dir).as_posix()})", "", f"*{caption}.*", ""]
    if not by_source and not by_peer_file:
        lines += ["No benchmark results: nothing to report.", ""]
    return "\n".join(lines)
