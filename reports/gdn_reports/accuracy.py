"""The accuracy report: every verdict's error against its budget, per implementation, broken
down by input dtype, sequence length, head size and gate regime, with plots of error against
sequence length and of error over budget."""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path

from .common import fmt, maximum, median, provenance_table, save_figure_atomically, table

# Buckets of the longest sequence of a case: a chunked kernel changes behaviour at one chunk
# (64 tokens) and then every few chunks, so the edges follow powers of four from 64.
LENGTH_BUCKETS = [(0, 1, "0-1"), (2, 64, "2-64"), (65, 256, "65-256"), (257, 1024, "257-1024"),
                  (1025, 4096, "1025-4096"), (4097, math.inf, ">4096")]
DTYPE_ORDER = ["f64", "f32", "bf16", "f16"]


def longest_sequence(v) -> tuple[int | None, bool]:
    """(longest sequence length, exact?): exact from cu_seqlens; T / N (the mean) otherwise."""
    cu = v.problem.get("cu_seqlens")
    if isinstance(cu, list) and len(cu) >= 2:
        return max(int(b) - int(a) for a, b in zip(cu, cu[1:])), True
    T, N = v.problem.get("T"), v.problem.get("N")
    if T is not None and N:
        return int(math.ceil(T / N)), False
    return None, False


def length_bucket(v) -> str:
    length, _ = longest_sequence(v)
    if length is None:
        return "unknown"
    for low, high, label in LENGTH_BUCKETS:
        if low <= length <= high:
            return label
    return "unknown"


def dtype_of(v) -> str:
    return str(v.problem.get("input_dtype", "unknown"))


def head_size(v) -> str:
    K, V = v.problem.get("K"), v.problem.get("V")
    return f"K={K} V={V}" if K is not None and V is not None else "unknown"


def gate_regime(v) -> str:
    """The generator's decay regime (fuzz::GateRegime), with +fused for in-kernel gates and
    +negeig when beta may exceed 1; "not recorded" when neither the verdict nor an adapter log
    carries the case's gdn.generator (hand-made and shrunk cases have none)."""
    if v.generator is None:
        base = "not recorded"
    else:
        options = v.generator.get("input_options", v.generator)
        base = str(options.get("regime", "unknown"))
    extras = []
    if v.problem.get("gate_mode") == "fused":
        extras.append("fused")
    beta_max = None
    if v.generator is not None:
        beta_max = (v.generator.get("input_options", v.generator) or {}).get("beta_max")
    if v.problem.get("allow_negative_eigenvalues") or (isinstance(beta_max, (int, float)) and beta_max > 1):
        extras.append("negeig")
    return "+".join([base] + extras)


DIMENSIONS = [("input dtype", dtype_of), ("longest sequence (tokens)", length_bucket),
              ("head size", head_size), ("gate regime", gate_regime)]


def summarize(verdicts) -> dict:
    """The numbers one table row shows, for a group of verdicts (the test recomputes these)."""
    counts = Counter(v.status for v in verdicts)
    judged = [v for v in verdicts if v.status in ("PASS", "FAIL")]
    return {
        "cases": len(verdicts), "PASS": counts["PASS"], "FAIL": counts["FAIL"], "ERROR": counts["ERROR"],
        "SKIPPED": counts["SKIPPED"],
        "median_rel_rms_o": median([v.rel_rms.get("o") for v in judged]),
        "max_rel_rms_o": maximum([v.rel_rms.get("o") for v in judged]),
        "max_rel_rms_hT": maximum([v.rel_rms.get("hT") for v in judged]),
        "median_margin": median([v.worst_margin for v in judged]),
        "max_margin": maximum([v.worst_margin for v in judged]),
    }


SUMMARY_HEADERS = ["cases", "pass", "fail", "error", "skipped", "median rel RMS o", "max rel RMS o",
                   "max rel RMS hT", "median error/budget", "max error/budget"]


def summary_cells(s: dict) -> list:
    return [s["cases"], s["PASS"], s["FAIL"], s["ERROR"], s["SKIPPED"], fmt(s["median_rel_rms_o"]),
            fmt(s["max_rel_rms_o"]), fmt(s["max_rel_rms_hT"]), fmt(s["median_margin"]), fmt(s["max_margin"])]


def _sort_key(dimension: str, value: str):
    if dimension == "input dtype":
        return (DTYPE_ORDER.index(value) if value in DTYPE_ORDER else 99, value)
    if dimension == "longest sequence (tokens)":
        labels = [b[2] for b in LENGTH_BUCKETS]
        return (labels.index(value) if value in labels else 99, value)
    if dimension == "head size":
        try:
            k, vv = (int(part.split("=")[1]) for part in value.split())
            return (k, vv, value)
        except (ValueError, IndexError):
            return (10**9, 0, value)
    return (0, value)


def _plots(verdicts, out_dir: Path, plot_dir: Path) -> list[tuple[str, Path]]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    judged = [v for v in verdicts if v.status in ("PASS", "FAIL")]
    implementations = sorted({v.implementation for v in judged})
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(implementations)}
    from matplotlib.ticker import NullFormatter
    # One marker per implementation, open and filled in turn, so coinciding points stay visible.
    markers = {name: "osD^v<>"[i % 7] for i, name in enumerate(implementations)}
    filled = {name: i % 2 == 0 for i, name in enumerate(implementations)}
    written = []

    # Error against sequence length, one panel per dtype (the dtype sets the error's scale).
    dtypes = sorted({dtype_of(v) for v in judged}, key=lambda d: _sort_key("input dtype", d))
    if judged:
        figure, axes = plt.subplots(1, max(1, len(dtypes)), figsize=(4.6 * max(1, len(dtypes)), 3.8),
                                    squeeze=False)
        for axis, dtype in zip(axes[0], dtypes):
            for name in implementations:
                points = [(longest_sequence(v)[0], v.rel_rms.get("o")) for v in judged
                          if v.implementation == name and dtype_of(v) == dtype]
                points = [(x, y) for x, y in points if x is not None and y is not None and y > 0 and math.isfinite(y)]
                if points:
                    xs, ys = zip(*points)
                    axis.scatter(xs, ys, s=22 if filled[name] else 40, marker=markers[name], label=name, alpha=0.8,
                                 facecolors=colors[name] if filled[name] else "none", edgecolors=colors[name])
            axis.set_xscale("symlog", linthresh=1)
            axis.set_yscale("log")
            low, high = axis.get_ylim()
            if high / low < 100:  # at least two decades, so the major ticks label the axis
                middle = math.sqrt(low * high)
                axis.set_ylim(middle / 10, middle * 10)
            axis.yaxis.set_minor_formatter(NullFormatter())
            axis.set_title(f"input dtype {dtype}")
            axis.set_xlabel("longest sequence (tokens)")
            axis.set_ylabel("relative RMS error of o")
            axis.grid(True, which="major", alpha=0.3)
        handles, labels = axes[0][0].get_legend_handles_labels()
        for axis in axes[0][1:]:
            h, l = axis.get_legend_handles_labels()
            handles += [hh for hh, ll in zip(h, l) if ll not in labels]
            labels += [ll for ll in l if ll not in labels]
        if handles:
            figure.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)), fontsize=8,
                          bbox_to_anchor=(0.5, -0.12))
        figure.suptitle("Error of o against the double-precision oracle", y=1.04)
        path = plot_dir / "accuracy_error_vs_length.png"
        save_figure_atomically(figure, path)
        plt.close(figure)
        written.append(("Relative RMS error of o against the longest sequence, per input dtype", path))

    # Error over budget: every judged case's worst margin; above 1 fails.
    if judged:
        figure, axis = plt.subplots(figsize=(max(5.0, 1.6 * len(implementations) + 2), 4.0))
        for index, name in enumerate(implementations):
            margins = [v.worst_margin for v in judged if v.implementation == name]
            finite = [m for m in margins if m is not None and math.isfinite(m) and m > 0]
            jitter = [index + 0.25 * (((i * 0.618034) % 1.0) - 0.5) for i in range(len(finite))]
            axis.scatter(jitter, finite, s=12, color=colors[name], alpha=0.7)
            infinite = sum(1 for m in margins if m is not None and math.isinf(m))
            if infinite:
                axis.annotate(f"{infinite} inf", (index, 1), textcoords="offset points", xytext=(0, 10),
                              ha="center", fontsize=8, color="red")
        axis.axhline(1.0, color="red", linewidth=1, linestyle="--", label="budget")
        axis.set_yscale("log")
        axis.set_xticks(range(len(implementations)))
        axis.set_xticklabels(implementations, rotation=20, ha="right", fontsize=8)
        axis.set_ylabel("error / budget (worst check)")
        axis.set_title("Error over budget per case (above the line: FAIL)")
        axis.grid(True, axis="y", alpha=0.3)
        path = plot_dir / "accuracy_margin.png"
        save_figure_atomically(figure, path)
        plt.close(figure)
        written.append(("Error over budget, every judged case", path))
    return written


def build(results, out_dir: Path, plot_dir: Path, command: str, generated: str) -> str:
    verdicts = results.verdicts
    verdict_inputs = [p for p in results.provenance
                      if p.kind in ("verdicts", "adapter log", "conformance tally", "fuzz results")]
    lines = ["# Accuracy report", "",
             f"Generated {generated} by `{command}` from the committed results below. "
             "Errors are against the double-precision oracle; a verdict passes when every check's "
             "error is within its budget (oracle/BUDGETS.md), error/budget is the worst check's margin.",
             "", "## Inputs", "", provenance_table(verdict_inputs) if verdict_inputs else "No verdict files found.", ""]
    if results.tallies:
        lines += ["## Conformance tallies", "",
                  "Counts the GPU conformance suite wrote (no per-case verdicts): cases run, failed and skipped "
                  "per kernel and property, with the worst error/budget seen.", "",
                  table(["input", "kernel", "property", "run", "failed", "skipped", "worst error/budget"],
                        [[t["source"], t["kernel"], t["property"], t["run"], t["failed"], t["skipped"],
                          fmt(t["worst_margin"])] for t in results.tallies]), ""]
    if results.fuzz:
        lines += ["## Fuzz campaigns", "",
                  "Tallies of `gdn-testbed fuzz` runs (random cases; failures shrunk and saved as case files).", "",
                  table(["input", "implementation", "pass", "fail", "error", "skipped", "worst error/budget",
                         "worst case", "run cases", "seconds"],
                        [[t["source"], t["implementation"], t["pass"], t["fail"], t["error"], t["skipped"],
                          fmt(t["worst_margin"]), t["worst_case"], t["cases"] if t["cases"] is not None else "n/a",
                          fmt(t["seconds"])] for t in results.fuzz]), ""]
        if results.fuzz_failures:
            lines += ["### Shrunk fuzz failures", "",
                      table(["input", "implementation", "status", "shrunk problem", "verdict", "replay"],
                            [[f["source"], f["implementation"], f["status"], f["shrunk_problem"], f["summary"][:160],
                              f"`{f['replay']}`" if f["replay"] else ""] for f in results.fuzz_failures[:30]]), ""]
    if not verdicts:
        lines += ["No verdicts: nothing more to report.", ""]
        return "\n".join(lines)

    by_impl = defaultdict(list)
    for v in verdicts:
        by_impl[v.implementation].append(v)
    lines += ["## Per implementation", "",
              table(["implementation"] + SUMMARY_HEADERS,
                    [[name] + summary_cells(summarize(group)) for name, group in sorted(by_impl.items())]), ""]

    for dimension, key in DIMENSIONS:
        groups = defaultdict(list)
        for v in verdicts:
            groups[(v.implementation, key(v))].append(v)
        rows = [[name, value] + summary_cells(summarize(group))
                for (name, value), group in sorted(groups.items(), key=lambda item: (item[0][0], _sort_key(dimension, item[0][1])))]
        lines += [f"## By {dimension}", "", table(["implementation", dimension] + SUMMARY_HEADERS, rows), ""]
        if dimension == "longest sequence (tokens)" and any(not longest_sequence(v)[1] for v in verdicts):
            lines += ["Cases without cu_seqlens in their verdict or adapter log are bucketed by T / N.", ""]

    plots = _plots(verdicts, out_dir, plot_dir)
    if plots:
        lines += ["## Plots", ""]
        for caption, path in plots:
            lines += [f"![{caption}]({path.relative_to(out_dir).as_posix()})", "", f"*{caption}.*", ""]

    bad = sorted((v for v in verdicts if v.status in ("FAIL", "ERROR")),
                 key=lambda v: -(v.worst_margin if v.worst_margin is not None else math.inf))
    lines += ["## Failures and errors", ""]
    if bad:
        rows = []
        for v in bad[:30]:
            worst = max((c for c in v.checks if c["margin"] is not None), key=lambda c: c["margin"], default=None)
            check = (f"{worst['tensor']} {worst['metric']}: {fmt(worst['error'])} > {fmt(worst['budget'])}"
                     if worst and not worst["pass"] else "")
            rows.append([v.implementation, v.case, v.status, fmt(v.worst_margin), check,
                         v.problem_text or "", v.message[:160]])
        lines += [table(["implementation", "case", "status", "error/budget", "worst check", "problem", "message"], rows), ""]
        if len(bad) > 30:
            lines += [f"... and {len(bad) - 30} more.", ""]
    else:
        lines += ["None.", ""]

    skipped = Counter((v.implementation, v.message) for v in verdicts if v.status == "SKIPPED")
    lines += ["## Skipped (not supported by the implementation, never counted as passed)", ""]
    if skipped:
        lines += [table(["implementation", "reason", "cases"],
                        [[name, reason, count] for (name, reason), count in sorted(skipped.items())]), ""]
    else:
        lines += ["None.", ""]
    return "\n".join(lines)
