"""The fault-injection report (faults.md): which detector catches which planted kernel fault.

Input: the gdn-faults/1 files of scripts/fault_campaign.sh (one per device kind). One table per
file: a row per planted fault (cuda/faults/planted_faults.hpp) and the control row with no fault,
a column per detector, each cell caught / missed / error with its detail below the table. The
summary says whether conformance caught every fault that fuzz caught, the issue's bar.
"""
from __future__ import annotations

MARK = {"caught": "caught", "missed": "**missed**", "error": "error"}
# The control row plants nothing: there "missed" is the right answer.
CONTROL_MARK = {"caught": "**false alarm**", "missed": "passed", "error": "error"}


def build(results, command: str, generated: str) -> str:
    lines = ["# Fault injection: what each detector catches", "",
             f"Generated {generated} by `{command}` from the committed results. Faults are planted in a "
             "fault-campaign build (`-DGDN_KERNEL_FAULTS=ON`, `cuda/faults/planted_faults.hpp`), one at a time, "
             "and found (or not) by what a user runs: `gdn-testbed conformance`, `gdn-testbed fuzz` for a fixed "
             "time on the kernels that run the faulty code, the GPU suite (`cuda_gpu_tests`), and "
             "compute-sanitizer's memcheck and racecheck on the suite's conformance property. The control row "
             "plants nothing: every detector must pass it. The sanitizers see memory errors and races only: "
             "a wrong value is not theirs to catch.", ""]
    for run in results.conformance_runs:
        s = run["summary"]
        lines += [f"Conformance from a copied binary ({run.get('note', '')}): {s['pass']} PASS, {s['fail']} FAIL, "
                  f"{s['error']} ERROR, {s['skipped']} SKIPPED, {run.get('golden_verdicts', '?')} of them golden-vector "
                  f"verdicts; {run.get('device', '?')}, {run.get('date', '?')}, commit `{run.get('commit', '?')}`, "
                  f"`{run.get('command', '?')}` (`{run['source']}`).", ""]
    if not results.faults:
        lines += ["No fault campaign in the results (run `scripts/fault_campaign.sh` on the GPU machine).", ""]
        return "\n".join(lines)
    for run in results.faults:
        detectors = run["detectors"]
        lines += [f"## {run.get('device', '?')}", "",
                  f"Source `{run['source']}`; date {run.get('date', '?')}; commit `{run.get('commit', '?')}`; "
                  f"command `{run.get('command', '?')}`; fuzz {run.get('fuzz_seconds', '?')} s per fault.", ""]
        faults = [r for r in run["faults"] if r["fault"] != "none"]
        control = [r for r in run["faults"] if r["fault"] == "none"]
        fuzz_caught = [r for r in faults if r["detectors"].get("fuzz", {}).get("result") == "caught"]
        conf_gap = [r["fault"] for r in fuzz_caught if r["detectors"]["conformance"]["result"] != "caught"]
        per = {d: sum(1 for r in faults if r["detectors"][d]["result"] == "caught") for d in detectors}
        lines.append(f"Caught, of {len(faults)} planted faults: " +
                     ", ".join(f"{d} {per[d]}" for d in detectors) + ".")
        if "fuzz" in detectors:
            lines.append(("Conformance caught every fault that fuzz caught." if not conf_gap else
                          "Fuzz caught, conformance missed: " + ", ".join(f"`{f}`" for f in conf_gap) + "."))
        if control:
            bad = [d for d in detectors if control[0]["detectors"][d]["result"] != "missed"]
            lines.append("Control (no fault): " + ("every detector passed." if not bad else
                                                  "NOT clean: " + ", ".join(f"{d} {control[0]['detectors'][d]['result']}" for d in bad) + "."))
        lines += ["", "| fault | kind | kernels | " + " | ".join(detectors) + " |",
                  "|---|---|---|" + "---|" * len(detectors)]
        for r in control + faults:
            mark = CONTROL_MARK if r["fault"] == "none" else MARK
            lines.append(f"| `{r['fault']}` | {r.get('kind', '')} | {r.get('kernels', '')} | " +
                         " | ".join(mark[r["detectors"][d]["result"]] for d in detectors) + " |")
        lines += ["", "Details:", ""]
        for r in control + faults:
            lines.append(f"- `{r['fault']}`: {r.get('description', '')}")
            for d in detectors:
                x = r["detectors"][d]
                lines.append(f"  - {d}: {x['result']}: {x.get('detail', '')}")
        lines.append("")
    return "\n".join(lines)
