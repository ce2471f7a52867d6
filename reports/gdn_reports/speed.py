"""The speed report: per device kind, each kernel's default configuration at every benchmarked
shape (its time, fraction of the copy bandwidth and of the FLOP ceiling) and its ratio to every
peer measured in the same GPU call at the same shape; one plot per device kind; every
benchmark row, tuning sweeps included, in a detail file per device kind."""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from .common import fmt, fmt_fixed, fmt_percent, save_figure_atomically, table
from .inputs import SHAPE_KEYS, device_kind

# Used only when the benchmark context names no ceiling; stated as "datasheet" in the report.
# NVIDIA H200 SXM: 989.4 TFLOP/s dense BF16/FP16 tensor-core peak (NVIDIA's H200 datasheet,
# half of the 1979 "with sparsity" figure).
# NVIDIA H100 SXM5 (80GB HBM3): the same 989.4 TFLOP/s dense BF16 figure (its datasheet).
DATASHEET_FLOP_CEILING = [("H200", 989.4e12, "H200 SXM datasheet, dense bf16 tensor core"),
                          ("H100 80GB HBM3", 989.4e12, "H100 SXM5 datasheet, dense bf16 tensor core")]


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
    # A backward is compared with backwards only (cuda/peers/backward_peers.py names its peer
    # "... backward ..."; cuda/bench/backward_bench.cpp's families are BM_backward and
    # BM_backward_chunked).
    if ("backward" in (peer.peer or "").lower()) != family(benchmark).startswith("BM_backward"):
        return False
    # A named shape: the benchmark's label (SetLabel) equals the peer result's name, e.g.
    # "qwen3next_4x8192" in cuda/bench/chunked_bench.cpp and cuda/peers/fla_chunk.py; the token
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
    cuda/bench/bench_common.cpp records it)."""
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


def same_call(peer, benchmark, provenance: dict) -> bool:
    """A peer is compared with a benchmark only when both come from one GPU call: the same folder
    of the result set (one call's files share a folder) and the same commit where both record
    one. Times from different calls (another machine, clocks, driver) make no ratio."""
    if Path(peer.source).parent != Path(benchmark.source).parent:
        return False
    a, b = provenance.get(peer.source), provenance.get(benchmark.source)
    return not (a and b and a.commit and b.commit) or a.commit == b.commit


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


# The benchmark families that measure a kernel's default configuration, the implementation each
# measures, and the value a measurement-mode argument takes in its headline rows (every other
# non-shape argument must be 0: the library's automatic choice). Other families are tuning data
# (other tiles, splits, kernels forced), listed in the detail files only. A benchmark file with
# none of these families shows its rows whose non-shape arguments are all 0.
HEADLINE_FAMILIES = {
    "BM_prefill": ("cuda.recurrent_prefill", {}),
    "BM_decode": ("cuda.decode", {"graph": 1, "held": 1}),  # CUDA graph launch, device time alone
    "BM_chunked_default": ("cuda.chunked_prefill", {}),
    "BM_chunked_single": ("cuda.chunked_prefill.single", {}),
    "BM_chunked_fused": ("cuda.chunked_prefill.bv128.unsplit.fused", {}),
    "BM_chunked_single_fused": ("cuda.chunked_prefill.bv128.unsplit.fused.single", {}),
    "BM_backward": ("cuda.recurrent_prefill.backward", {}),
    "BM_backward_chunked": ("cuda.chunked_prefill.backward", {}),
}
# Name arguments that say which problem ran, not how.
SHAPE_ARGUMENTS = frozenset(SHAPE_KEYS) | {"shape", "batch", "sequences", "length", "items"}


def family(benchmark) -> str:
    return benchmark.name.split("/")[0]


def headline(benchmark, families_present: set) -> str | None:
    """The implementation a benchmark row is the default configuration of, else None."""
    name = family(benchmark)
    arguments = {k: v for k, v in benchmark.shape.items() if k not in SHAPE_ARGUMENTS}
    arguments = {k: v for k, v in arguments.items() if f"{k}:" in benchmark.name}  # name arguments, not counters
    if name in HEADLINE_FAMILIES:
        implementation, preset = HEADLINE_FAMILIES[name]
        ok = all(value == preset.get(key, 0) for key, value in arguments.items())
        return implementation if ok else None
    if families_present & set(HEADLINE_FAMILIES) or is_copy(benchmark):
        return None
    return name if all(value == 0 for value in arguments.values()) else None


def problem_label(benchmark) -> str:
    """The shape as a reader names it: the benchmark's label (a named shape) or its shape
    arguments."""
    shape = {k: v for k, v in benchmark.shape.items() if k in SHAPE_ARGUMENTS}
    text = shape_label(shape)
    return f"{benchmark.label} ({text})" if benchmark.label else text


def summary_rows(results, kind: str) -> list[dict]:
    """Per device kind: every headline row, once per peer measured at its shape in the same
    result set (once with no peer when none was). The test recomputes these."""
    benchmarks = [b for b in results.benchmarks if device_kind(b.source) == kind]
    peers = [p for p in results.peers if device_kind(p.source) == kind]
    provenance = {p.path: p for p in results.provenance}
    rows = []
    by_source = defaultdict(list)
    for b in benchmarks:
        by_source[b.source].append(b)
    for source in sorted(by_source):
        group = by_source[source]
        context = results.context.get(source, {})
        device = provenance[source].device if source in provenance else None
        computed, _, _ = rows_for(group, context, device, [])
        present = {family(b) for b in group}
        measured = [b for b in group if not is_copy(b)]
        shape_names = frozenset(b.label for b in measured if b.label)
        for b, row in zip(measured, computed):
            implementation = headline(b, present)
            if implementation is None:
                continue
            matches = [p for p in peers if peer_matches(p, b) and same_call(p, b, provenance)]
            base = {"kind": kind, "source": source, "implementation": implementation, "benchmark": b.name,
                    "shape": problem_label(b), "time_ms": b.time_ms, "copy_fraction": row["copy_fraction"],
                    "flop_fraction": row["flop_fraction"], "tokens_per_second": row["tokens_per_second"]}
            if not matches:
                rows.append(dict(base, peer=None, peer_ms=None, ratio=None, peer_source=None))
            for p in matches:
                peer_ms = peer_time_ms(p, b)
                rows.append(dict(base, peer=peer_label(p, shape_names), peer_ms=peer_ms, ratio=peer_ms / b.time_ms,
                                 peer_source=p.source))
    return rows


SUMMARY_HEADERS = ["device kind", "kernel", "shape", "time (ms)", "of copy BW", "of FLOP ceiling", "peer",
                   "peer (ms)", "peer / ours", "run"]
# What every result set is expected to hold: a kind that lacks one shows a "not measured" row.
EXPECTED = [("bench_recurrent", "cuda.recurrent_prefill"), ("bench_decode", "cuda.decode"),
            ("bench_chunked", "cuda.chunked_prefill")]


def _plot(rows, kind: str, plot_dir: Path):
    """One figure per device kind: each headline row's fraction of the copy bandwidth and of the
    FLOP ceiling (left), its speed-up over each peer (right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unique = {}
    for r in rows:
        unique.setdefault((r["implementation"], r["shape"]), r)
    labels = [f"{impl}\n{shape[:28]}" for impl, shape in unique]
    compared = [r for r in rows if r["ratio"] is not None]
    figure, (left, right) = plt.subplots(1, 2, figsize=(max(9.0, 0.45 * len(unique) + 6), 4.6),
                                         gridspec_kw={"width_ratios": [max(1, len(unique)), max(1, len(compared))]})
    xs = range(len(unique))
    left.bar([x - 0.2 for x in xs], [100 * (r["copy_fraction"] or 0) for r in unique.values()], 0.4, label="of copy bandwidth")
    left.bar([x + 0.2 for x in xs], [100 * (r["flop_fraction"] or 0) for r in unique.values()], 0.4, label="of FLOP ceiling")
    left.set_xticks(list(xs))
    left.set_xticklabels(labels, rotation=60, ha="right", fontsize=6)
    left.set_ylabel("% of the device's ceiling")
    left.set_title(f"{kind}: fraction of copy bandwidth / FLOP ceiling", fontsize=9)
    left.legend(fontsize=7)
    left.grid(True, axis="y", alpha=0.3)
    if compared:
        right.bar(range(len(compared)), [r["ratio"] for r in compared], 0.6, color="tab:green")
        right.axhline(1.0, color="red", linestyle="--", linewidth=1)
        right.set_xticks(range(len(compared)))
        right.set_xticklabels([f"{r['implementation']} vs {r['peer'][:24]}\n{r['shape'][:28]}" for r in compared],
                              rotation=60, ha="right", fontsize=6)
    else:
        right.text(0.5, 0.5, "no peer measured", ha="center", va="center", transform=right.transAxes)
    right.set_ylabel("peer time / our time")
    right.set_title(f"{kind}: speed-up over peers, same run (above 1: ours faster)", fontsize=9)
    right.grid(True, axis="y", alpha=0.3)
    path = plot_dir / f"speed_{kind}.png"
    save_figure_atomically(figure, path)
    plt.close(figure)
    return path


ROW_HEADERS = ["benchmark", "shape", "time (ms)", "tokens/s", "GB/s", "of copy BW", "TFLOP/s", "of FLOP ceiling"]


def details(results, kind: str) -> str:
    """Every benchmark row of one device kind, with each matching peer of the same kind."""
    inputs = [p for p in results.provenance if device_kind(p.path) == kind
              and (p.kind == "google-benchmark" or p.kind.startswith("peer"))]
    lines = [f"# Speed details: {kind}", "", "Back to [the speed report](../speed.md). Times are the median over "
             "repetitions where the benchmark ran several (else its single run); a peer's ratio is its time over ours "
             "on the same problem, measured in the same GPU call (same folder, same commit); rows timed held (counter held = 1: the device's time alone) use the peer's held "
             "time (held_ms) where it recorded one.", "",
             "## Inputs", "", provenance_table(inputs) if inputs else "No benchmark or peer files.", ""]
    peers = [p for p in results.peers if device_kind(p.source) == kind]
    provenance = {p.path: p for p in results.provenance}
    by_source = defaultdict(list)
    for b in results.benchmarks:
        if device_kind(b.source) == kind:
            by_source[b.source].append(b)
    for source in sorted(by_source):
        context = results.context.get(source, {})
        device = provenance[source].device if source in provenance else None
        same = [p for p in peers if by_source[source] and same_call(p, by_source[source][0], provenance)]
        rows, peer_names, sources = rows_for(by_source[source], context, device, same)
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
    by_peer_file = defaultdict(list)
    for p in peers:
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
    if not by_source and not by_peer_file:
        lines += ["No benchmark results: not measured.", ""]
    return "\n".join(lines)


GRADIENTS = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


def backward_determinism_rows(results) -> list:
    """Per backward peer result that counted them: differing / total elements per gradient."""
    rows = []
    for p in results.peers:
        if not any(f"differing_{g}" in p.counters for g in GRADIENTS):
            continue
        cells = []
        for g in GRADIENTS:
            d, n = p.counters.get(f"differing_{g}"), p.counters.get(f"elements_{g}")
            cells.append("n/a" if d is None or n is None else f"{int(d)} / {int(n)}")
        rows.append([f"`{p.source}`", p.peer, p.name] + cells)
    return rows


def provenance_table(provenance) -> str:
    return table(["input", "kind", "records", "device", "date", "commit", "command"],
                 [[p.path, p.kind, p.records, p.device or "not recorded", p.date or "not recorded",
                   p.commit or "not recorded", f"`{p.command}`" if p.command else "not recorded"] for p in provenance])


def build(results, out_dir: Path, plot_dir: Path, command: str, generated: str) -> tuple[str, dict]:
    """speed.md's text and its detail files ({path relative to out_dir: text})."""
    kinds = sorted({device_kind(p.path) for p in results.provenance} | set(results.manifests))
    provenance = {p.path: p for p in results.provenance}
    cells, cited, plots = [], [], []
    for kind in kinds:
        rows = summary_rows(results, kind)
        for r in rows:
            for source in (r["source"], r["peer_source"]):
                if source and provenance.get(source) is not None and provenance[source] not in cited:
                    cited.append(provenance[source])
            cells.append([kind, r["implementation"], r["shape"], fmt(r["time_ms"]), fmt_percent(r["copy_fraction"]),
                          fmt_percent(r["flop_fraction"]), r["peer"] or "none measured", fmt(r["peer_ms"]),
                          fmt_fixed(r["ratio"], 2) if r["ratio"] is not None else "n/a",
                          f"`{r['source']}`" + (f" + `{r['peer_source']}`" if r["peer_source"] else "")])
        present = {Path(b.source).stem for b in results.benchmarks if device_kind(b.source) == kind}
        for stem, kernel in EXPECTED:
            if stem not in present and not any(r["implementation"] == kernel for r in rows):
                cells.append([kind, kernel, "not measured"] + ["n/a"] * 6 + [f"no `{stem}.json`"])
        if rows:
            plots.append((kind, _plot(rows, kind, plot_dir)))
    detail_files = {f"details/speed_{kind}.md": details(results, kind) for kind in kinds}
    lines = ["# Speed", "",
             f"Generated {generated} by `{command}` from the current result sets in `reports/results/<device kind>/`. "
             "Each kernel's default configuration at every benchmarked shape: its time (median of repetitions, else the "
             "single run), its fraction of the copy bandwidth and of the FLOP ceiling (bf16 tensor core), and each peer "
             "measured in the same GPU call (same folder, same commit) at the same shape (peer / ours above 1: ours faster).", "",
             table(SUMMARY_HEADERS, cells) if cells else "No benchmark results: not measured.", "",
             "Runs (device, date, commit, command of each input above):", "",
             table(["run", "device", "date", "commit", "command"],
                   [[f"`{p.path}`", p.device or "not recorded", p.date or "not recorded", p.commit or "not recorded",
                     f"`{p.command}`" if p.command else "not recorded"] for p in cited]) if cited else "none.", ""]
    for kind, path in plots:
        caption = f"{kind}: fraction of the ceilings and speed-up over peers"
        lines += [f"![{caption}]({path.relative_to(out_dir).as_posix()})", "", f"*{caption}.*", ""]
    determinism = backward_determinism_rows(results)
    if determinism:
        lines += ["Backward run-to-run determinism of the peers (cuda/peers/backward_peers.py): the backward run "
                  "twice on the same inputs and graph, elements whose bits differ / elements, per gradient. "
                  "Ours is bitwise deterministic by construction and tested so (the GPU suite's "
                  "reproducibility properties: a rerun and the reversed pack, bit for bit).", "",
                  table(["run", "peer", "shape"] + list(GRADIENTS), determinism), ""]
    lines += ["Details per device kind (every benchmark row, tuning sweeps, peer tables): " +
              (", ".join(f"[{kind}]({name})" for kind, name in zip(kinds, detail_files)) or "none") + ".", ""]
    return "\n".join(lines), detail_files
