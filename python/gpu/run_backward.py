#!/usr/bin/env python3
"""Verdicts on the backward of the training kernels people use, on the GPU machine (issue 31):
fla's chunk (Triton, and through FlashQLA as fla dispatches it) and fused_recurrent, FlashQLA's
own function, and transformers' torch_chunk / torch_recurrent functions, each differentiated by
torch.autograd (gdn_testbed.autograd_kernel) and judged by gdn_testbed.check_backward against the
exact backward (docs/backward.md, docs/budgets.md "Gradients"). Determinism too: each subject's
backward runs twice on the same inputs (a drawn case and a long fixed one), and the differing
elements of every gradient are counted. The chunked subjects are judged a second time on the same
cases under their design's budget (gdn_testbed.OPERANDS_SINGLE: the backward's operand model,
every product's operand stored in the input dtype, docs/budgets.md "Gradients"): the fp32 budget
says how far a kernel is from fp32 accuracy, the design budget whether it computes what its
design can.

    python3 python/gpu/run_backward.py --out DIR --cases N --total-seconds S --commit SHA

Each subject runs in its own subprocess with a time cap (an exception or a lost CUDA context
there is that subject's ERROR); one JSON comes back, DIR/backward-verdicts.json (format
gdn-backward-verdicts/1), and DIR/backward-failures.tar.xz with the failing cases (.npz).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tarfile
import time
import traceback

# name: (adapter module, kernel factory expression, formulation, chunk size, space, dtypes)
SUBJECTS = [
    ("fla.chunk[triton]", "fla", "chunk('triton')", "chunked", ["bf16"]),
    ("fla.chunk[flash_qla]", "fla", "chunk('flash_qla')", "chunked", ["bf16"]),
    ("fla.fused_recurrent", "fla", "fused_recurrent()", "sequential", ["bf16", "f32"]),
    ("flash_qla.chunk", "flash_qla", "chunk()", "chunked", ["bf16"]),
    ("transformers.torch_chunk", "transformers", "chunk(device=device)", "chunked", ["f32"]),
    ("transformers.torch_recurrent", "transformers", "recurrent(device=device)", "sequential", ["f32"]),
]


def subject_space(gt, module, dtypes):
    """The subject's support matrix, narrowed to few compiled variants (Triton and TileLang
    compile per head size and dtype): H = 2, HV = 2 or 4, K = V = 128 for the GPU libraries."""
    adapter_space = {"fla": "SPACE_CHUNK", "flash_qla": "SPACE", "transformers": "SPACE_CHUNK"}[module]
    import importlib
    space = getattr(importlib.import_module(f"gdn_testbed.adapters.{module}"), adapter_space)
    narrow = dict(input_dtypes=dtypes, state_cache="off", intermediate_states="off")
    if module in ("fla", "flash_qla"):
        # One compiled variant: every constexpr switch of their kernels pinned.
        narrow.update(K_values=[128], V_values=[128], H_values=[2], group_values=[1, 2], max_work=3.0e7,
                      initial_state="always", final_state="always", l2norm="always", fused_gates="off",
                      v_major="off", explicit_scale="off", gate_in_input_dtype="off")
    else:
        narrow.update(max_work=2.0e6)
    return space.replace(**narrow)


def bits_differing(a, b):
    """Elements whose bits differ between two runs (-1 when the shapes or dtypes differ)."""
    import numpy as np
    a, b = np.ascontiguousarray(np.asarray(a)), np.ascontiguousarray(np.asarray(b))
    if a.shape != b.shape or a.dtype != b.dtype:
        return -1
    if a.size == 0:
        return 0
    return int(np.any(a.view(np.uint8).reshape(a.size, -1) != b.view(np.uint8).reshape(b.size, -1), axis=1).sum())


def run_subject(name, module, factory, formulation, dtypes, cases, seconds, out):
    """In a subprocess: one subject's verdicts and determinism; prints one JSON line."""
    import gdn_testbed as gt
    from gdn_testbed import _core
    record = {"subject": name, "module": module, "formulation": formulation, "dtypes": dtypes}
    adapter = __import__(f"gdn_testbed.adapters.{module}", fromlist=["x"])
    why = adapter.available()
    if why is not None:
        record.update(status="SKIPPED", reason=why)
        return record
    record["versions"] = adapter.versions()
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU only in a dry run here
    record["device"] = device
    forward = eval(f"adapter.{factory}", {"adapter": adapter, "device": device})
    kernel = gt.autograd_kernel(forward.fn, name=f"{name}.autograd", formulation=formulation, chunk_size=64,
                                supports=forward.supports, device=device)
    space = subject_space(gt, module, dtypes)
    record["space"] = space.to_json()
    start = time.monotonic()
    summary = gt.check_backward(kernel, space, cases=cases, seed=20261206, out=os.path.join(out, name))
    record.update(status="RAN", cases=summary.cases, passed=summary.passed, failed=summary.failed,
                  errors=summary.errors, skipped=summary.skipped, worst_margin=summary.worst_margin,
                  worst_case=summary.worst_case, check_seconds=round(time.monotonic() - start, 1),
                  failures=[{"original": f.original_problem, "shrunk": f.shrunk_problem, "file": f.file,
                             "summary": f.verdict.summary(), "replay": f.replay} for f in summary.failures[:4]])
    if formulation == "chunked" and time.monotonic() - start < seconds / 2:
        design_start = time.monotonic()
        design = gt.check_backward(kernel, space, cases=cases, seed=20261206, budget=gt.OPERANDS_SINGLE,
                                   out=os.path.join(out, name + ".design"))
        record["design"] = {"budget": gt.OPERANDS_SINGLE, "cases": design.cases, "passed": design.passed,
                            "failed": design.failed, "errors": design.errors, "skipped": design.skipped,
                            "worst_margin": design.worst_margin, "worst_case": design.worst_case,
                            "check_seconds": round(time.monotonic() - design_start, 1),
                            "failures": [{"shrunk": f.shrunk_problem, "file": f.file, "summary": f.verdict.summary()}
                                         for f in design.failures[:4]]}
    elif formulation == "chunked":
        record["design"] = {"status": "not run (time cap)"}
    # Determinism: the same inputs twice, bits compared per gradient; a drawn case and a long one.
    det = []
    long_space = space.replace(min_sequences=2, max_sequences=2, length_values=[2048], min_length=1, max_work=1e9,
                               input_dtypes=[dtypes[0]])
    for label, seed, sp in (("drawn", 7, space), ("2 x 2048 tokens", 11, long_space)):
        if time.monotonic() - start > seconds:
            det.append({"case": label, "status": "not run (time cap)"})
            continue
        try:
            from gdn_testbed.space import _space_text
            problem, inputs, _ = _core.sample_case(_core.case_seed(seed, 0), _core.backward_space(_space_text(sp)))
            if kernel.reason_unsupported(problem) is not None:
                det.append({"case": label, "status": "SKIPPED", "reason": kernel.reason_unsupported(problem)})
                continue
            backward = gt.make_backward_inputs(problem, seed)
            first = kernel.run(problem, inputs, backward)
            second = kernel.run(problem, inputs, backward)
            diff = {k: bits_differing(first[k], second[k]) for k in sorted(first)}
            det.append({"case": label, "problem": problem.describe(), "differing_elements": diff,
                        "elements": {k: int(getattr(first[k], "size", 0)) for k in sorted(first)},
                        "deterministic": all(v == 0 for v in diff.values())})
        except Exception as error:  # recorded, never silent
            det.append({"case": label, "status": "ERROR", "error": f"{type(error).__name__}: {error}"[:500]})
    record["determinism"] = det
    return record


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--total-seconds", type=float, default=300)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--subjects", default="all",
                        help="comma-separated subject names (default all); transformers' must run where fla "
                             "is not importable (python/gpu/README.md)")
    parser.add_argument("--subject", help=argparse.SUPPRESS)  # the subprocess's own entry
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.subject is not None:
        name, module, factory, formulation, dtypes = next(s for s in SUBJECTS if s[0] == args.subject)
        try:
            record = run_subject(name, module, factory, formulation, dtypes, args.cases, args.total_seconds,
                                 os.path.join(args.out, "failures"))
        except Exception as error:
            record = {"subject": name, "status": "ERROR", "error": f"{type(error).__name__}: {error}"[:2000],
                      "traceback": traceback.format_exc()[-3000:]}
        print("RECORD " + json.dumps(record, default=str), flush=True)
        return 0
    began = time.monotonic()
    records = []
    # In the order given: the cheap subjects first, so that a long compile cannot starve them.
    chosen = SUBJECTS if args.subjects == "all" else [s for n in args.subjects.split(",") for s in SUBJECTS if s[0] == n]
    unknown = set(args.subjects.split(",")) - {s[0] for s in SUBJECTS} if args.subjects != "all" else set()
    if unknown or not chosen:
        parser.error(f"--subjects: unknown {sorted(unknown)} (known: {', '.join(s[0] for s in SUBJECTS)})")
    per = args.total_seconds / len(chosen)
    for name, *_ in chosen:
        left = args.total_seconds - (time.monotonic() - began)
        cap = max(30.0, min(left, 2 * per))
        if left < 20:
            records.append({"subject": name, "status": "ERROR", "error": "not run: the total time ran out"})
            continue
        t0 = time.monotonic()
        try:
            done = subprocess.run([sys.executable, __file__, "--out", args.out, "--cases", str(args.cases),
                                   "--total-seconds", str(cap * 0.8), "--subject", name],
                                  capture_output=True, text=True, timeout=cap)
            lines = [l for l in done.stdout.splitlines() if l.startswith("RECORD ")]
            record = json.loads(lines[-1][7:]) if lines else {
                "subject": name, "status": "ERROR", "error": f"exit {done.returncode}: {done.stderr[-1500:]}"}
        except subprocess.TimeoutExpired:
            record = {"subject": name, "status": "ERROR", "error": f"did not finish within {cap:.0f} s"}
        record["wall_seconds"] = round(time.monotonic() - t0, 1)
        print(json.dumps({k: record.get(k) for k in ("subject", "status", "cases", "passed", "failed", "errors",
                                                      "worst_margin", "wall_seconds")}), flush=True)
        records.append(record)
    try:
        device = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        device = "no GPU (nvidia-smi absent)"
    result = {"format": "gdn-backward-verdicts/1", "device": device,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "commit": args.commit, "command": "python3 python/gpu/run_backward.py " + " ".join(sys.argv[1:]),
              "cases_per_subject": args.cases, "subjects": records}
    path = os.path.join(args.out, "backward-verdicts.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1, default=str)
    os.replace(path + ".tmp", path)
    failures = os.path.join(args.out, "failures")
    if os.path.isdir(failures):
        with tarfile.open(os.path.join(args.out, "backward-failures.tar.xz"), "w:xz") as tar:
            tar.add(failures, arcname="failures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
