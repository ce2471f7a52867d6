"""Verdicts on other libraries' kernels through the Python package (peers.md).

Inputs: gdn-adapter-verdicts/1 (python/gpu/run_adapters.py: each adapter and mode under its
declared precision design, with the fp32-baseline accuracy as a quality figure) and
gdn-backward-verdicts/1 (python/gpu/run_backward.py: backward through torch.autograd, judged by
the gradient budget, and a rerun's differing elements). One table per file, the failures'
shrunk cases below it.
"""
from __future__ import annotations

from .peer_findings import FINDINGS


def _g(x) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, (int,)) and not isinstance(x, bool):
        return str(x)
    try:
        return f"{float(x):.3g}"
    except (TypeError, ValueError):
        return str(x)


def build(results, command: str, generated: str) -> str:
    lines = ["# Other libraries' kernels, judged through the Python package", "",
             f"Generated {generated} by `{command}` from the committed results. Each kernel runs in-process "
             "through its adapter (`python/gdn_testbed/adapters/`) on its pinned case space and is judged against "
             "the exact reference; a kernel that declares a precision design (intermediates stored in the input "
             "dtype) is judged by that design's emulation (`calibrated(state_unit=input,baseline=operands_single)`, "
             "or `baseline=operands_single_qk` where the normalised q, k are stored too; the table's budget column "
             "says which judged each run), "
             "and its accuracy against the fp32 baseline is a quality figure, not a verdict (docs/python.md, "
             "\"Precision designs\"). Shrunk failures are case files under `results/<kind>/python/failures/`.", ""]
    if not results.adapter_runs and not results.backward_runs:
        return "\n".join(lines + ["No adapter results.", ""])
    for run in results.adapter_runs:
        env = run.get("device") if isinstance(run.get("device"), dict) else {}
        lines += [f"## Forward: `{run['source']}`", "",
                  f"{env.get('nvidia_smi', env.get('gpu', '?'))}; {run.get('created', '?')}; commit "
                  f"`{run.get('commit', '?')}`; `{run.get('command', '?')}`.", "",
                  "| run | status | verdict | judged | failed | errors | skipped | worst margin | budget | quality o | quality hT |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in run["table"]:
            q = r.get("quality") or {}
            lines.append(f"| `{r['id']}` | {r.get('status')} | {r.get('verdict')} | {_g(r.get('judged'))} | "
                         f"{_g(r.get('failed'))} | {_g(r.get('errors'))} | {_g(r.get('skipped'))} | "
                         f"{_g(r.get('worst_margin'))} | {r.get('budget') or ''} | "
                         f"{_g((q.get('o') or {}).get('worst_margin')) if q else ''} | "
                         f"{_g((q.get('hT') or {}).get('worst_margin')) if q else ''} |")
        notes = []
        for r in run.get("runs", []):
            if r.get("reason"):
                notes.append(f"- `{r['id']}`: {r['reason']}")
            for f in (r.get("failures") or [])[:2]:
                w = f.get("worst_check") or {}
                notes.append(f"- `{r['id']}` {f.get('status')}: shrunk to `{f.get('shrunk_problem')}`, worst "
                             f"{w.get('tensor', '?')} {w.get('metric', '?')} margin {_g(w.get('margin'))}"
                             + (f"; {f['message'].strip().splitlines()[0][:200]}" if f.get("message") else ""))
        lines += [""] + (notes or ["No failures."]) + [""]
    for run in results.backward_runs:
        lines += [f"## Backward: `{run['source']}`", "",
                  f"{run.get('device', '?')}; {run.get('date', '?')}; commit `{run.get('commit', '?')}`; "
                  f"`{run.get('command', '?')}`; gradients judged by the calibrated gradient budget "
                  "(docs/budgets.md, \"Gradients\").", "",
                  "| subject | status | cases | passed | failed | errors | worst margin | rerun: differing elements |",
                  "|---|---|---|---|---|---|---|---|"]
        notes = []
        for s in run["subjects"]:
            det = []
            for d in s.get("determinism", []) or []:
                if "differing_elements" in d:
                    total = sum(v for v in d["differing_elements"].values() if isinstance(v, int) and v > 0)
                    det.append(f"{d['case']}: {total}")
                else:
                    det.append(f"{d.get('case')}: {d.get('status')}")
            lines.append(f"| `{s['subject']}` | {s.get('status')} | {_g(s.get('cases'))} | {_g(s.get('passed'))} | "
                         f"{_g(s.get('failed'))} | {_g(s.get('errors'))} | {_g(s.get('worst_margin'))} | "
                         f"{'; '.join(det)} |")
            if s.get("error"):
                notes.append(f"- `{s['subject']}`: {str(s['error'])[:300]}")
            for d in s.get("determinism", []) or []:
                if d.get("status") == "ERROR":
                    notes.append(f"- `{s['subject']}` rerun ({d.get('case')}): {str(d.get('error'))[:300]}")
            for f in (s.get("failures") or [])[:2]:
                notes.append(f"- `{s['subject']}`: shrunk to `{f.get('shrunk')}`: {f.get('summary', '')[:300]}")
        lines += [""] + (notes or ["No failures."]) + [""]
    # The explanation of the FAILs (peer_findings.py) goes with the results it explains.
    explained = {"flash_qla.chunk", "fla.chunk.flash_qla", "fla.fused_recurrent", "fla.chunk.triton.f32"}
    if any(r.get("id") in explained and r.get("verdict") == "FAIL"
           for run in results.adapter_runs for r in run.get("table", [])):
        lines += [FINDINGS.strip(), ""]
    return "\n".join(lines)
