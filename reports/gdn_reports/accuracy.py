"""The accuracy report: one summary row per implementation and judge (GPU suite, fuzz, CLI
conformance, verify of an external kernel, the chunked accuracy judge) with its verdict counts,
worst error/budget and relative RMS error, two plots (error against sequence length, error over
budget), and per device kind a detail file broken down by property, input dtype, sequence
length, head size and gate regime, with the failures and skips."""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path

from .common import fmt, maximum, median, save_figure_atomically, table
from .inputs import device_kind

# Buckets of the longest sequence of a case: a chunked kernel changes behaviour at one chunk
# (64 tokens) and then every few chunks, so the edges follow powers of four from 64.
LENGTH_BUCKETS = [(0, 1, "0-1"), (2, 64, "2-64"), (65, 256, "65-256"), (257, 1024, "257-1024"),
                  (1025, 4096, "1025-4096"), (4097, math.inf, ">4096")]
DTYPE_ORDER = ["f64", "f32", "bf16", "f16"]


def longest_sequence(v) -> tuple[int | None, bool]:
    """(longest sequence length, exact?): exact from cu_seqlens (or a campaign summary's
    `longest`); T / N (the mean) otherwise."""
    if v.problem.get("longest") is not None:
        return int(v.problem["longest"]), True
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
    if v.regime:
        return v.regime
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


def origin(implementation: str) -> str:
    """ours (the project's CUDA kernels), reference (its references and models), or external."""
    name = implementation.split(" [")[0]
    if name.startswith("cuda."):
        return "ours"
    if name.startswith(("reference.", "model.", "emulation", "oracle")):
        return "reference"
    return "external"


ORIGIN_ORDER = {"ours": 0, "external": 1, "reference": 2}


def summary_rows(results) -> list[dict]:
    """One row per implementation and judge: the GPU suite's tallies, the fuzz campaign's
    tallies, each file of verdicts (CLI conformance, verify of an external kernel), and the
    chunked accuracy judge's errors. The test recomputes these from the raw inputs."""
    rows = []
    suite = defaultdict(list)
    for t in results.tallies:
        suite[(device_kind(t["source"]), t["source"], t["kernel"])].append(t)
    for (kind, source, kernel), group in suite.items():
        run, failed, skipped = (sum(t[k] for t in group) for k in ("run", "failed", "skipped"))
        rows.append({"implementation": kernel, "judge": f"GPU suite, {len(group)} properties", "kind": kind,
                     "source": source, "pass": run - failed, "fail": failed, "error": None, "skipped": skipped,
                     "worst_margin": maximum([t["worst_margin"] for t in group]), "median_o": None, "max_o": None})
    for t in results.fuzz:
        rows.append({"implementation": t["implementation"], "judge": "fuzz", "kind": device_kind(t["source"]),
                     "source": t["source"], "pass": t["pass"], "fail": t["fail"], "error": t["error"],
                     "skipped": t["skipped"], "worst_margin": t["worst_margin"], "median_o": None, "max_o": None})
    groups = defaultdict(list)
    for v in results.verdicts:
        groups[(device_kind(v.source), v.source, v.judge, v.implementation)].append(v)
    for (kind, source, judge, name), group in groups.items():
        s = summarize(group)
        rows.append({"implementation": name, "judge": judge or "verdicts", "kind": kind, "source": source,
                     "pass": s["PASS"], "fail": s["FAIL"], "error": s["ERROR"], "skipped": s["SKIPPED"],
                     "worst_margin": s["max_margin"], "median_o": s["median_rel_rms_o"], "max_o": s["max_rel_rms_o"]})
    measured = defaultdict(list)
    for e in results.errors:
        measured[(device_kind(e["source"]), e["source"], e["implementation"])].append(e)
    for (kind, source, name), group in measured.items():
        rows.append({"implementation": name, "judge": f"chunked accuracy judge, {len(group)} cases", "kind": kind,
                     "source": source, "pass": None, "fail": None, "error": None, "skipped": None,
                     "worst_margin": None, "median_o": median([e["rel_rms_o"] for e in group]),
                     "max_o": maximum([e["rel_rms_o"] for e in group])})
    rows.sort(key=lambda r: (ORIGIN_ORDER[origin(r["implementation"])], r["implementation"], r["kind"], r["judge"]))
    return rows


SUMMARY_TABLE_HEADERS = ["implementation", "origin", "device kind", "judged by", "pass", "fail", "error", "skipped",
                         "worst error/budget", "median rel RMS o", "max rel RMS o", "run"]

# What the summary expects from every result set: a kind that lacks one shows a "not measured" row.
EXPECTED = [("conformance tally", "GPU suite (conformance.json)"), ("campaign summary", "campaign (campaign/summary.json)")]


def _cell(value):
    return "n/a" if value is None else value


def run_label(p) -> str:
    return f"`{p.path}`"


def runs_table(provenance) -> str:
    return table(["run", "device", "date", "commit", "command"],
                 [[run_label(p), p.device or "not recorded", p.date or "not recorded", p.commit or "not recorded",
                   f"`{p.command}`" if p.command else "not recorded"] for p in provenance])


def sanitizer_line(results, kind: str) -> str:
    """One line per sanitize run (result file) of the kind: its tools' verdicts and the tests it ran."""
    entries = [s for s in results.sanitize if device_kind(s["source"]) == kind]
    if not entries:
        return f"- {kind}: not measured (no sanitize.json)"
    lines = []
    for source in sorted({s["source"] for s in entries}):
        parts = []
        run = [s for s in entries if s["source"] == source]
        for s in run:
            if not s.get("run"):
                parts.append(f"{s['tool']} not run")
                continue
            count = f"{s['hazards']} hazards" if "hazards" in s else f"{_cell(s.get('errors'))} errors"
            parts.append(f"{s['tool']} {count}, exit {_cell(s.get('exit_code'))}" +
                         ("" if s.get("passed") else " **NOT CLEAN**"))
        filters = sorted({f.strip() for s in run for f in str(s.get("filter") or "").split(";") if f.strip()})
        lines.append(f"- {kind}, `{Path(source).name}`: " + "; ".join(parts) +
                     (f" (tests: {'; '.join(filters)})" if filters else ""))
    return "\n".join(lines)


def details(results, kind: str) -> str:
    """Everything per case and per property of one device kind's result set."""
    inputs = [p for p in results.provenance if device_kind(p.path) == kind and p.kind not in ("google-benchmark",)
              and not p.kind.startswith("peer")]
    verdicts = [v for v in results.verdicts if device_kind(v.source) == kind]
    lines = [f"# Accuracy details: {kind}", "", "Back to [the accuracy report](../accuracy.md).", "",
             "## Inputs", "", runs_table(inputs) if inputs else "No accuracy inputs.", ""]
    tallies = [t for t in results.tallies if device_kind(t["source"]) == kind]
    if tallies:
        lines += ["## GPU suite, per property", "",
                  "Checks run, failed and skipped per kernel and property, with the worst error/budget seen.", "",
                  table(["input", "kernel", "property", "run", "failed", "skipped", "worst error/budget"],
                        [[t["source"], t["kernel"], t["property"], t["run"], t["failed"], t["skipped"],
                          fmt(t["worst_margin"])] for t in tallies]), ""]
    sanitize = [s for s in results.sanitize if device_kind(s["source"]) == kind]
    if sanitize:
        lines += ["## Sanitizers", "",
                  table(["tool", "run", "errors", "hazards", "exit code", "passed", "tests", "filter"],
                        [[s["tool"], s.get("run"), _cell(s.get("errors")), _cell(s.get("hazards")), _cell(s.get("exit_code")),
                          _cell(s.get("passed")), s.get("tests", ""), s.get("filter", "")] for s in sanitize]), ""]
    fuzz = [t for t in results.fuzz if device_kind(t["source"]) == kind]
    if fuzz:
        lines += ["## Fuzz campaigns", "",
                  table(["input", "implementation", "pass", "fail", "error", "skipped", "worst error/budget",
                         "worst case", "run cases", "seconds"],
                        [[t["source"], t["implementation"], t["pass"], t["fail"], t["error"], t["skipped"],
                          fmt(t["worst_margin"]), t["worst_case"], t["cases"] if t["cases"] is not None else "n/a",
                          fmt(t["seconds"])] for t in fuzz]), ""]
        shrunk = [f for f in results.fuzz_failures if device_kind(f["source"]) == kind]
        if shrunk:
            lines += ["### Shrunk fuzz failures", "",
                      table(["input", "implementation", "status", "shrunk problem", "verdict", "replay"],
                            [[f["source"], f["implementation"], f["status"], f["shrunk_problem"], f["summary"][:160],
                              f"`{f['replay']}`" if f["replay"] else ""] for f in shrunk[:30]]), ""]
            if len(shrunk) > 30:
                lines += [f"... and {len(shrunk) - 30} more.", ""]
    errors = [e for e in results.errors if device_kind(e["source"]) == kind]
    if errors:
        lines += ["## Chunked accuracy judge, per case", "",
                  "Relative RMS error against the exact recurrence on the same inputs (no budget: a measurement).", "",
                  table(["case", "problem", "implementation", "rel RMS o", "rel RMS hT"],
                        [[e["case"], e["problem"], e["implementation"], fmt(e["rel_rms_o"]), fmt(e["rel_rms_hT"])]
                         for e in errors]), ""]
    if verdicts:
        by_impl = defaultdict(list)
        for v in verdicts:
            by_impl[v.implementation].append(v)
        lines += ["## Verdicts per implementation", "",
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
        bad = sorted((v for v in verdicts if v.status in ("FAIL", "ERROR")),
                     key=lambda v: -(v.worst_margin if v.worst_margin is not None else math.inf))
        lines += ["## Failures and errors (worst first)", ""]
        if bad:
            rows = []
            for v in bad[:40]:
                worst = max((c for c in v.checks if c["margin"] is not None), key=lambda c: c["margin"], default=None)
                check = (f"{worst['tensor']} {worst['metric']}: {fmt(worst['error'])} > {fmt(worst['budget'])}"
                         if worst and not worst["pass"] else v.worst_check)
                rows.append([v.implementation, v.case, v.status, fmt(v.worst_margin), check,
                             v.problem_text or "", v.message[:160]])
            lines += [table(["implementation", "case", "status", "error/budget", "worst check", "problem", "message"], rows), ""]
            if len(bad) > 40:
                lines += [f"... and {len(bad) - 40} more.", ""]
        else:
            lines += ["None.", ""]
        skipped = Counter((v.implementation, v.message) for v in verdicts if v.status == "SKIPPED")
        lines += ["## Skipped (not supported by the implementation, never counted as passed)", ""]
        lines += [table(["implementation", "reason", "cases"], [[n, r, c] for (n, r), c in sorted(skipped.items())]), ""] \
            if skipped else ["None.", ""]
    return "\n".join(lines)


def build(results, out_dir: Path, plot_dir: Path, command: str, generated: str) -> tuple[str, dict]:
    """accuracy.md's text and its detail files ({path relative to out_dir: text})."""
    kinds = sorted({device_kind(p.path) for p in results.provenance} | set(results.manifests))
    rows = summary_rows(results)
    provenance = {p.path: p for p in results.provenance}
    cited = []
    cells = []
    for r in rows:
        p = provenance.get(r["source"])
        if p is not None and p not in cited:
            cited.append(p)
        cells.append([r["implementation"], origin(r["implementation"]), r["kind"], r["judge"], _cell(r["pass"]),
                      _cell(r["fail"]), _cell(r["error"]), _cell(r["skipped"]), fmt(r["worst_margin"]),
                      fmt(r["median_o"]), fmt(r["max_o"]), f"`{r['source']}`"])
    present = {(device_kind(p.path), p.kind) for p in results.provenance}
    present |= {(device_kind(p.path), "campaign summary") for p in results.provenance
                if Path(p.path).parts[1:2] == ("campaign",)}  # a campaign's raw files count as its summary
    for kind in kinds:
        for input_kind, what in EXPECTED:
            if (kind, input_kind) not in present:
                cells.append(["not measured", "", kind, what] + ["n/a"] * 7 + ["missing"])
    detail_files = {f"details/accuracy_{kind}.md": details(results, kind) for kind in kinds}
    lines = ["# Accuracy", "",
             f"Generated {generated} by `{command}` from the current result sets in `reports/results/<device kind>/`. "
             "Errors are against the double-precision oracle; a verdict passes when every check's error is within its "
             "budget (docs/budgets.md); error/budget is the worst check's margin (above 1 fails). The GPU suite counts "
             "checks, the other judges cases; `[fixed budget]` rows judge the same outputs under the fixed thresholds.", "",
             table(SUMMARY_TABLE_HEADERS, cells) if cells else "No accuracy results: not measured.", "",
             "Runs (device, date, commit, command of each input above):", "",
             runs_table(cited) if cited else "none.", "",
             "Sanitizers (compute-sanitizer on the GPU suite):", ""]
    lines += [sanitizer_line(results, kind) for kind in kinds] or ["- not measured"]
    lines += [""]
    plots = _plots(results.verdicts, out_dir, plot_dir) if results.verdicts else []
    for caption, path in plots:
        lines += [f"![{caption}]({path.relative_to(out_dir).as_posix()})", "", f"*{caption}.*", ""]
    lines += ["Details per device kind (per property, per case, failures, skips): " +
              (", ".join(f"[{kind}]({name})" for kind, name in zip(kinds, detail_files)) or "none") + ".", ""]
    return "\n".join(lines), detail_files
