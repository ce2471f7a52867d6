#!/usr/bin/env python3
"""Verdicts of every gdn_testbed adapter on the machine it runs on (python/gpu/README.md).

    python3 python/gpu/run_adapters.py --out DIR [--cases N] [--seconds S] [--total-seconds T]

For each run of RUNS (an adapter's kernel on a space inside its support matrix) this runs, in a
subprocess of its own, a warm-up (the kernel called on a few cases of the space, unjudged, so
that Triton and TileLang compile before anything is timed), `gdn_testbed.check(kernel, space,
cases=N)` and a time-bounded `gdn_testbed.fuzz(kernel, space, seconds=S)` with a different seed,
and records the library versions, the backend that actually ran, the counts, the worst margin,
each failure with its shrunk problem, worst check and replay command, and the wall time.

Writes into DIR (at most three files, so that they come back from a device call):
  adapter-verdicts.json      format gdn-adapter-verdicts/1: the machine, the packages, the
                             settings, one entry per run
  adapter-failures.tar.xz    runs/ID/: each run's result.json, the fuzz results files, its log
                             and the shrunk failing case files (and the cases as generated,
                             while small); the verdicts name the files by these paths
Exit status 0 when every run finished or was SKIPPED (whatever its verdicts), 1 when a run
ended in ERROR or TIMEOUT or was NOT RUN (its lane's budget spent), 2 for bad arguments.

Why subprocesses: a kernel that corrupts its CUDA context (an illegal address) poisons every
later call in that process; a hang or a compile that takes too long is ended from outside.
Each run gets a time cap from what is left of its lane's budget (weights below); at the cap it
gets SIGINT (the fuzz loop finishes the case in hand, keeps its shrunk failures and returns),
then SIGKILL if it does not end. An adapter whose library is not installed is a SKIPPED run
with the reason, never dropped. Two lanes run side by side, each with the whole budget: "gpu"
(one run at a time) and "side": first a compile-only warm-up of FlashQLA (TileLang compiles with
nvcc on the CPU while the GPU lane runs the Triton kernels; the FlashQLA runs come last in the
GPU lane and find their kernels in TileLang's cache), then transformers' torch functions (on
the CPU by default).

The spaces: each run starts from the adapter's declared space and narrows it only where a
compiled kernel would otherwise spend the budget compiling: fla's Triton kernels autotune per
(H, HV, K, V), so H = 2, HV / H in {1, 2} and K = V = 128 (K, V in {64, 128} for the fused
recurrent kernel); FlashQLA's TileLang kernels take head counts, scale, gate dtypes and the
state flags as compile-time parameters, so one variant of those (FLASH_QLA below). The run
fla.chunk.triton.bf16.pinned draws one compile variant of fla's Triton path (FLA_ONE_SHAPE), so
that a bounded run judges hundreds of cases. `--full-spaces` keeps the declared spaces;
`--narrow ID=JSON` narrows one run's space further. Every run records the space it drew from in
full.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import hashlib
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback

FORMAT = "gdn-adapter-verdicts/1"

# Narrowing for compiled kernels (see the module docstring).
COMPILED_HEADS = dict(H_values=[2], group_values=[1, 2])
K128 = dict(K_values=[128], V_values=[128], min_work=2.0e5, max_work=2.0e7)
# FlashQLA's TileLang kernels take the head counts, the scale, the gate dtypes and the flags
# (initial state, final state, V-major state, context parallelism) as compile-time parameters,
# each variant an nvcc compile of tens of seconds: one head layout (GVA, HV = 4), the default
# scale, fp32 gates, a K-major state read and written.
FLASH_QLA = dict(H_values=[2], group_values=[2], input_dtypes=["bf16"], explicit_scale="off",
                 gate_in_input_dtype="off", initial_state="always", final_state="always", v_major="off")

# fla's Triton kernels compile once per combination of their constexpr switches (initial and
# final state, l2norm, gate form): one combination, so that the run judges cases instead of
# compiling.
FLA_ONE_VARIANT = dict(initial_state="always", final_state="always", l2norm="always", fused_gates="off",
                       v_major="off", explicit_scale="off", gate_in_input_dtype="off")
# One compile variant of fla's Triton chunk path, for runs that judge hundreds of cases instead of
# compiling: the autotune keys of its kernels are (H, HV, K, V, BT) and their constexpr flags
# (chunk_delta_h.py, chunk_o.py, wy_fast.py, chunk_fwd.py, cumsum.py, solve_tril.py of fla 0.6;
# T is do_not_specialize everywhere), so one head layout (H = HV = 2) with FLA_ONE_VARIANT's
# flags and K = V = 128 is one key per kernel. The lengths are whole chunks (multiples of 64), so
# that no integer argument derived from T changes Triton's ==1 / %16 specialisation either; the
# edge lengths (1, C-1, C+1) stay in the unpinned run's space. Compiled once in the warm-up.
FLA_ONE_SHAPE = dict(H_values=[2], group_values=[1], length_values=[64, 128, 192, 256], min_sequences=1,
                     max_sequences=4, max_tokens=1024)

# id, lane, adapter module, kernel (a Kernel of the module, or a factory taking device=),
# narrowing of the kernel's space, weight in its lane's time budget. compile_only: a warm-up
# alone (no verdict), run in the side lane so that TileLang compiles while the GPU lane runs
# the Triton kernels; the FlashQLA runs come last in the GPU lane and find the compiled kernels
# in TileLang's cache.
RUNS = [
    dict(id="fla.chunk.triton.bf16", lane="gpu", module="fla", kernel="CHUNK_TRITON",
         narrow=dict(COMPILED_HEADS, input_dtypes=["bf16"], **K128, **FLA_ONE_VARIANT), weight=1.0),
    dict(id="fla.chunk.triton.f32", lane="gpu", module="fla", kernel="CHUNK_TRITON",
         narrow=dict(COMPILED_HEADS, input_dtypes=["f32"], **K128, **FLA_ONE_VARIANT), weight=1.0),
    # One compile variant (FLA_ONE_SHAPE): run alone (--only), it judges hundreds of cases.
    dict(id="fla.chunk.triton.bf16.pinned", lane="gpu", module="fla", kernel="CHUNK_TRITON",
         narrow=dict(input_dtypes=["bf16"], **K128, **FLA_ONE_VARIANT, **FLA_ONE_SHAPE), weight=1.5),
    dict(id="fla.fused_recurrent", lane="gpu", module="fla", kernel="FUSED_RECURRENT",
         narrow=dict(COMPILED_HEADS, input_dtypes=["f32", "bf16"], K_values=[64, 128], V_values=[64, 128]),
         weight=0.8),
    dict(id="flash_qla.chunk", lane="gpu", module="flash_qla", kernel="CHUNK", narrow=dict(FLASH_QLA), weight=1.2),
    dict(id="fla.chunk.flash_qla", lane="gpu", module="fla", kernel="CHUNK_FLASH_QLA", narrow=dict(FLASH_QLA),
         weight=1.0),
    dict(id="flashinfer.prefill", lane="gpu", module="flashinfer", kernel="PREFILL", narrow=dict(COMPILED_HEADS),
         weight=0.5),
    dict(id="flashinfer.decode", lane="gpu", module="flashinfer", kernel="DECODE", narrow=dict(COMPILED_HEADS),
         weight=0.3),
    dict(id="vllm.chunk", lane="gpu", module="vllm", kernel="CHUNK", narrow=dict(COMPILED_HEADS, **K128), weight=0.5),
    dict(id="vllm.recurrent", lane="gpu", module="vllm", kernel="RECURRENT",
         narrow=dict(COMPILED_HEADS, K_values=[128], V_values=[128]), weight=0.3),
    dict(id="flash_qla.compile", lane="side", module="flash_qla", kernel="CHUNK", narrow=dict(FLASH_QLA), weight=2.5,
         compile_only=True),
    dict(id="transformers.chunk.f32", lane="side", module="transformers", kernel="chunk",
         narrow=dict(input_dtypes=["f32"]), weight=1.0),
    dict(id="transformers.chunk.bf16", lane="side", module="transformers", kernel="chunk",
         narrow=dict(input_dtypes=["bf16"]), weight=1.0),
    dict(id="transformers.recurrent.f32", lane="side", module="transformers", kernel="recurrent",
         narrow=dict(input_dtypes=["f32"]), weight=0.8),
    dict(id="transformers.recurrent.bf16", lane="side", module="transformers", kernel="recurrent",
         narrow=dict(input_dtypes=["bf16"]), weight=0.8),
]
# Why a library may be missing on the workplace's GPU machine (added to a SKIPPED run's reason
# when its adapter says the library is not installed; python/gpu/README.md).
NOT_CARRIED = {
    "flashinfer": "not carried to the GPU machine: flashinfer-python 0.7.4 is a 101 MB wheel and its SM90 GDN "
                  "prefill and decode are CuTe DSL kernels needing nvidia-cutlass-dsl-libs-cu13 (92 MB), over the "
                  "64 MiB a device call carries",
    "vllm": "not carried to the GPU machine: vLLM is far over the 64 MiB a device call carries",
}

RUN_IDS = [r["id"] for r in RUNS]

PACKAGES = ["gdn_testbed", "torch", "triton", "numpy", "fla-core", "flash-qla", "tilelang", "apache-tvm-ffi",
            "torch-c-dlpack-ext", "z3-solver", "einops", "transformers", "flashinfer-python", "nvidia-cutlass-dsl",
            "vllm"]


def log(message: str) -> None:
    print(f"[run_adapters {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def write_json(path: str, data) -> None:
    """Atomically: a temporary file renamed over the target."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=False, default=str, allow_nan=True)
        f.write("\n")
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# The worker: one run, in its own process.
# ----------------------------------------------------------------------------------------------

def make_kernel(run: dict, module, device):
    factory = getattr(module, run["kernel"])
    if callable(factory) and not hasattr(factory, "_gdn_run"):   # a factory function (transformers)
        return factory(device=device)
    return factory


def summary_dict(s) -> dict:
    return dict(cases=s.cases, passed=s.passed, failed=s.failed, errors=s.errors, skipped=s.skipped,
                judged=s.judged, worst_margin=s.worst_margin, worst_case=s.worst_case, seconds=s.seconds,
                stop_reason=s.stop_reason, interrupted=s.interrupted, failures_total=s.failures_total)


def failure_dict(f, phase: str, run_dir: str) -> dict:
    worst = f.verdict.worst_check
    rel = lambda p: os.path.join("runs", os.path.basename(run_dir), os.path.relpath(p, run_dir)) if p else p
    return dict(phase=phase, status=f.verdict.status, case_index=f.case_index, case_seed=str(f.case_seed),
                original_problem=f.original_problem, shrunk_problem=f.shrunk_problem,
                worst_check=worst, message=(f.verdict.message or "").strip()[:2000],
                original_status=f.original_verdict.status, original_worst_check=f.original_verdict.worst_check,
                file=rel(f.file), original_file=rel(f.original_file), replay=f.replay,
                replay_from_archive=f.replay.replace(f.file, rel(f.file)) if f.file else f.replay,
                shrink_steps=f.shrink_steps)


# Errors after which a CUDA context is unusable: every later call in the process fails too.
FATAL_CUDA = ("illegal memory access", "illegal instruction", "device-side assert", "unspecified launch failure",
              "misaligned address", "CUDA error: an illegal", "cudaErrorIllegalAddress", "CUDA_ERROR_ILLEGAL_ADDRESS")


class Counter:
    """Counts the kernel's calls (and, for fla, how many went to its FlashQLA backend), and
    notices a fatal CUDA error: the calls after it fail with a message saying so, since their
    ERRORs (and shrinking them) say nothing about their cases."""

    def __init__(self):
        self.calls = 0
        self.flash_qla_backend_calls = None
        self.fatal = None   # (call number, problem, error) of the first fatal CUDA error
        self.in_campaign = False

    def wrap_kernel(self, kernel):
        counted = copy.copy(kernel)
        fn = kernel.fn

        def counting(problem, x):
            self.calls += 1
            if self.fatal is not None:
                raise RuntimeError(f"not run: the CUDA context was lost at call {self.fatal[0]} ({self.fatal[1]}: "
                                   f"{self.fatal[2][:300]}); this case was not judged")
            try:
                out = fn(problem, x)
                if _cuda_ready():
                    import torch
                    torch.cuda.synchronize()   # an asynchronous fault is charged to the case that made it
                return out
            except Exception as error:
                text = f"{type(error).__name__}: {error}"
                if self.fatal is None and any(p in text for p in FATAL_CUDA):
                    self.fatal = (self.calls, problem.describe(), text)
                    if self.in_campaign:
                        # The campaign's own SIGINT handling: finish this case, save, return.
                        os.kill(os.getpid(), signal.SIGINT)
                raise

        counted.fn = counting
        return counted

    def watch_fla_backend(self):
        from fla.ops.gated_delta_rule.backends.flash_qla import FlashQLABackend
        original = FlashQLABackend.chunk_gated_delta_rule
        self.flash_qla_backend_calls = 0

        def counting(backend, *args, **kwargs):
            self.flash_qla_backend_calls += 1
            return original(backend, *args, **kwargs)

        FlashQLABackend.chunk_gated_delta_rule = counting

    def backend(self, run: dict, kernel_device) -> dict:
        out = dict(kernel_calls=self.calls)
        module = run["module"]
        if module == "fla":
            out["fla_flash_qla_backend_calls"] = self.flash_qla_backend_calls
            if run["kernel"] == "FUSED_RECURRENT":
                out["used"] = "fla Triton fused_recurrent kernel"
            elif self.flash_qla_backend_calls is None:
                out["used"] = "unknown (fla's FlashQLA backend class not found)"
            elif self.calls and self.flash_qla_backend_calls == self.calls:
                out["used"] = "FlashQLA (TileLang) through fla's backend registry"
            elif self.flash_qla_backend_calls == 0:
                out["used"] = "fla Triton chunk kernels (FlashQLA backend not called)"
            else:
                out["used"] = "mixed: some calls went to FlashQLA, some to Triton"
        elif module == "flash_qla":
            out["used"] = "flash_qla.chunk_gated_delta_rule (TileLang)"
        elif module == "transformers":
            out["used"] = f"torch ops on {kernel_device}"
        else:
            out["used"] = module
        return out


def _cuda_ready() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()


def device_info() -> dict:
    info = dict(python=sys.version.split()[0], platform=platform.platform(), cpu_count=os.cpu_count(),
                nvcc=shutil.which("nvcc"), cuda_home=os.environ.get("CUDA_HOME"))
    try:
        import torch
        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info.update(gpu=p.name, capability=list(torch.cuda.get_device_capability(0)),
                        multiprocessors=p.multi_processor_count, gpu_memory_gib=round(p.total_memory / 2**30, 1),
                        tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
        else:
            info["gpu"] = None
    except Exception as error:   # noqa: BLE001 - recorded, not fatal
        info["torch_error"] = repr(error)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if smi.returncode == 0:
            info["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def package_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def worker(args) -> int:
    run = next(r for r in RUNS if r["id"] == args.worker)
    run_dir = os.path.join(args.work, run["id"])
    os.makedirs(run_dir, exist_ok=True)
    result_path = os.path.join(run_dir, "result.json")
    t0 = time.monotonic()
    deadline = t0 + args.cap
    res = dict(id=run["id"], adapter=f"gdn_testbed.adapters.{run['module']}", lane=run["lane"], status="RUNNING",
               verdict=None, reason=None, cap_seconds=args.cap, phases={}, failures=[])

    def save():
        res["wall_seconds"] = round(time.monotonic() - t0, 2)
        write_json(result_path, res)

    save()
    try:
        import gdn_testbed as gt
        import importlib
        res["gdn_testbed"] = dict(file=gt.__file__, version=gt.__version__)
        module = importlib.import_module(f"gdn_testbed.adapters.{run['module']}")
        try:
            res["versions"] = module.versions()
        except Exception as error:   # noqa: BLE001
            res["versions"] = {"error": repr(error)}
        why = module.available()
        if why:
            res.update(status="SKIPPED", verdict="SKIPPED", reason=why)
            save()
            return 0
        if run["module"] == "transformers" and args.transformers_device == "cpu":
            import torch
            torch.set_num_threads(max(1, args.cpu_threads))
        kernel_device = args.transformers_device if run["module"] == "transformers" else None
        base = make_kernel(run, module, kernel_device)
        res["kernel"] = base.name
        res["replay_kernel"] = base.replay
        res["formulation"] = base.formulation
        res["chunk_size"] = base.chunk_size
        res["kernel_device"] = str(base.device) if base.device is not None else "default (cuda when available)"
        # The verdicts are judged by the kernel's own budget (its declared precision design, else
        # the fp32 baseline): check and fuzz take it from the Kernel.
        res["budget"] = gt.budget_describe(base.budget or gt.QUALITY_BUDGET)
        res["design"] = base.design
        space = base.space
        narrow = run_narrowing(run, args)
        if narrow:
            res["space_narrowed"] = narrow
            space = space.replace(**narrow)
        res["space"] = space.to_json()
        counter = Counter()
        if run["module"] == "fla":
            try:
                counter.watch_fla_backend()
            except Exception as error:   # noqa: BLE001
                res["backend_watch_error"] = repr(error)
        kernel = counter.wrap_kernel(base)

        # Warm-up: compile what the first cases need; errors are recorded, judged later anyway.
        t = time.monotonic()
        warm = dict(cases=0, run=0, skipped=0, errors=[])
        compile_only = bool(run.get("compile_only"))
        count = max(args.warmup, 24) if compile_only else args.warmup
        for case in space.cases(count, seed=args.seed + 1000):
            if time.monotonic() > deadline - (0.1 if compile_only else 0.5) * args.cap:
                break
            warm["cases"] += 1
            if kernel._gdn_supports(case.problem) is not None:
                warm["skipped"] += 1
                continue
            try:
                kernel._gdn_run(case.problem, case.inputs)
                warm["run"] += 1
            except Exception as error:   # noqa: BLE001
                warm["errors"].append(f"{case.problem.describe()}: {type(error).__name__}: {str(error)[:300]}")
        warm["seconds"] = round(time.monotonic() - t, 2)
        res["phases"]["warmup"] = warm
        save()
        log(f"{run['id']}: warm-up {warm['run']} run, {len(warm['errors'])} errors, {warm['seconds']} s")
        if compile_only:
            res.update(status="DONE", verdict="NONE (compile only)", backend=counter.backend(run, res["kernel_device"]))
            save()
            return 0

        # check: the first N cases of seed S, stopping at the first failure. The campaign's clock
        # runs through shrinking and it stops at its time limit, so a phase ends by its seconds
        # plus at most one shrink (shrink_seconds) plus the case in hand.
        left = deadline - time.monotonic() - 3
        shrink = min(args.shrink_seconds, 0.25 * left)
        if counter.fatal is not None:
            res["phases"]["check"] = dict(skipped_reason="the CUDA context was lost in the warm-up")
        elif left - shrink >= 3:
            counter.in_campaign = True
            s = gt.check(kernel, space, cases=args.cases, seed=args.seed, out=os.path.join(run_dir, "check"),
                         seconds=max(3.0, 0.5 * left - shrink), shrink_seconds=max(1.0, shrink))
            res["phases"]["check"] = summary_dict(s)
            res["failures"] += [failure_dict(f, "check", run_dir) for f in s.failures]
            save()
            log(f"{run['id']}: check: {s.describe()}")
        else:
            res["phases"]["check"] = dict(skipped_reason=f"only {max(0.0, left):.1f} s left of the run's cap")

        # quality: for a kernel with a declared design, its accuracy against the fp32 baseline
        # on a few cases, a figure beside the verdicts, never one of them.
        if base.design is not None and args.quality_cases > 0 and counter.fatal is None:
            until = min(deadline, time.monotonic() + 0.15 * args.cap)
            res["quality"] = quality(gt, kernel, space, args, res["budget"], until)
            save()
            log(f"{run['id']}: quality: {res['quality'].get('summary')}")

        # fuzz: another seed, for what time is left.
        left = deadline - time.monotonic() - 3
        shrink = min(args.shrink_seconds, 0.25 * left)
        seconds = min(args.seconds, left - shrink)
        if counter.fatal is not None:
            res["phases"]["fuzz"] = dict(skipped_reason="the CUDA context was lost before the fuzz phase")
        elif seconds >= 3:
            counter.in_campaign = True
            s = gt.fuzz(kernel, space, seconds=seconds, seed=args.seed + 1, out=os.path.join(run_dir, "fuzz"),
                        max_failures=args.max_failures, shrink_seconds=max(1.0, shrink), progress=False)
            res["phases"]["fuzz"] = summary_dict(s)
            res["failures"] += [failure_dict(f, "fuzz", run_dir) for f in s.failures]
            log(f"{run['id']}: fuzz: {s.describe()}")
        else:
            res["phases"]["fuzz"] = dict(skipped_reason=f"only {max(0.0, left):.1f} s left of the run's cap")
        res["backend"] = counter.backend(run, res["kernel_device"])
        if counter.fatal is not None:
            res["cuda_context_lost"] = dict(
                call=counter.fatal[0], problem=counter.fatal[1], error=counter.fatal[2][:2000],
                note="every later call of this run was refused; the shrunk file of the failure that hit it was "
                     "shrunk on a dead context: its as-generated file is the evidence")
        res["status"] = "DONE"
        res["verdict"] = overall_verdict(res["phases"])
        if counter.fatal is not None and res["verdict"] in ("PASS", "NOTHING JUDGED"):
            res["verdict"] = "ERROR"
        save()
        return 0
    except KeyboardInterrupt:
        res.update(status="TIMEOUT", reason="interrupted at the run's time cap outside the fuzz loop")
        save()
        return 1
    except BaseException as error:   # noqa: BLE001 - an adapter's crash is a recorded ERROR
        res.update(status="ERROR", verdict="ERROR", reason=f"{type(error).__name__}: {error}",
                   traceback=traceback.format_exc()[-6000:])
        save()
        return 1


def quality(gt, kernel, space, args, design_budget: str, until: float) -> dict:
    """The kernel on up to --quality-cases cases of the space (seed + 2000), each output judged
    twice: by the design's budget (as the verdicts are) and by the fp32 baseline's
    (QUALITY_BUDGET). The second is how far the design is from what fp32 can achieve: reported
    per tensor as the worst margin and relative RMS error, labelled quality, not a verdict."""
    out = dict(note="accuracy against the fp32-state baseline (budget " + gt.QUALITY_BUDGET + "): a quality "
                    "figure, not a verdict; margin > 1 means the design misses what fp32 intermediates achieve",
               budget=gt.budget_describe(gt.QUALITY_BUDGET), design_budget=design_budget, cases=[], per_tensor={},
               skipped=0, errors=[])
    t = time.monotonic()
    for case in space.cases(args.quality_cases, seed=args.seed + 2000):
        if time.monotonic() > until:
            out["stopped"] = "time slice spent (15% of the run's cap)"
            break
        problem = case.problem
        if kernel._gdn_supports(problem) is not None:
            out["skipped"] += 1
            continue
        try:
            outputs = kernel._gdn_run(problem, case.inputs)
            judged = {}
            for label, budget in (("design", design_budget), ("quality", gt.QUALITY_BUDGET)):
                v = gt.judge(problem, case.inputs, outputs, formulation=kernel.formulation,
                             chunk_size=kernel.chunk_size, budget=budget, implementation=kernel.name)
                judged[label] = v
        except Exception as error:   # noqa: BLE001 - recorded; the verdicts judge the kernel
            out["errors"].append(f"{problem.describe()}: {type(error).__name__}: {str(error)[:300]}")
            continue
        row = dict(problem=problem.describe(), design_status=judged["design"].status,
                   design_worst_margin=judged["design"].worst_margin, quality={})
        for c in judged["quality"].checks:
            if c.get("metric") != "rel_rms":
                continue
            row["quality"][c["tensor"]] = dict(rel_rms=c["error"], budget=c["budget"], margin=c["margin"])
            agg = out["per_tensor"].setdefault(c["tensor"], dict(worst_margin=0.0, worst_rel_rms=0.0, cases=0))
            agg["cases"] += 1
            agg["worst_margin"] = max(agg["worst_margin"], float(c["margin"]))
            agg["worst_rel_rms"] = max(agg["worst_rel_rms"], float(c["error"]))
        out["cases"].append(row)
    out["seconds"] = round(time.monotonic() - t, 2)
    out["summary"] = ", ".join(f"{name} worst margin {a['worst_margin']:.3g} (rel_rms {a['worst_rel_rms']:.3g}, "
                               f"{a['cases']} cases)" for name, a in sorted(out["per_tensor"].items())) or "no case judged"
    return out


def overall_verdict(phases: dict) -> str:
    judged = failed = errors = 0
    for name in ("check", "fuzz"):
        p = phases.get(name) or {}
        judged += p.get("judged", 0)
        failed += p.get("failed", 0)
        errors += p.get("errors", 0)
    if failed:
        return "FAIL"
    if errors:
        return "ERROR"
    return "PASS" if judged else "NOTHING JUDGED"


# ----------------------------------------------------------------------------------------------
# The driver: lanes of subprocesses, the JSON, the archive.
# ----------------------------------------------------------------------------------------------

class Lane:
    def __init__(self, name: str, runs: list, budget: float):
        self.name, self.queue, self.budget = name, list(runs), budget
        self.start = time.monotonic()
        self.proc = None
        self.current = None
        self.run_start = 0.0
        self.cap = 0.0
        self.interrupted_at = None
        self.log = None

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)


def source_digest() -> dict:
    """sha256 of the imported gdn_testbed's Python sources (which adapter code ran)."""
    import gdn_testbed
    root = os.path.dirname(gdn_testbed.__file__)
    digest = hashlib.sha256()
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    digest.update(f.read())
    return dict(path=root, sha256=digest.hexdigest())


def driver(args) -> int:
    t0 = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    if os.path.isdir(args.work):
        shutil.rmtree(args.work)
    os.makedirs(args.work)
    selected = [r for r in RUNS if not args.only or r["id"] in args.only]
    header = dict(format=FORMAT, created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  command=" ".join(shlex.quote(a) for a in [os.path.basename(sys.executable), *sys.argv]),
                  commit=args.commit or os.environ.get("GDN_COMMIT") or git_commit(),
                  device=device_info(), packages=package_versions(), source=source_digest(),
                  settings=dict(cases=args.cases, seconds=args.seconds, total_seconds=args.total_seconds,
                                seed=args.seed, warmup=args.warmup, max_failures=args.max_failures,
                                shrink_seconds=args.shrink_seconds, full_spaces=args.full_spaces,
                                narrow=args.extra_narrow or None,
                                quality_cases=args.quality_cases,
                                transformers_device=args.transformers_device, runs=[r["id"] for r in selected]))
    log(f"device: {header['device'].get('gpu')}, torch {header['device'].get('torch')}; "
        f"packages: {', '.join(f'{k} {v}' for k, v in header['packages'].items() if v)}")
    results = {}
    queued = []
    for r in selected:
        # A library that is not installed (or no GPU) is a SKIPPED run decided here, so that its
        # share of the lane's budget goes to the runs that can use it.
        skipped = skip_reason(r)
        if skipped is None:
            queued.append(r)
        else:
            results[r["id"]] = skipped
            log(f"skip {r['id']}: {skipped['reason']}")
    lanes = [Lane(name, [r for r in queued if r["lane"] == name], args.total_seconds) for name in ("gpu", "side")]
    while any(lane.queue or lane.proc for lane in lanes):
        for lane in lanes:
            while lane.proc is None and lane.queue and lane.left() < 10:
                # The lane's budget is spent: what is left is recorded, not started.
                run = lane.queue.pop(0)
                results[run["id"]] = dict(id=run["id"], adapter=f"gdn_testbed.adapters.{run['module']}",
                                          lane=run["lane"], status="NOT RUN", verdict="NOT RUN",
                                          reason=f"the {lane.name} lane's budget of {lane.budget:.0f} s was spent "
                                                 f"by the runs before it", phases={}, failures=[], wall_seconds=0.0)
                log(f"[{lane.name}] not run: {run['id']} (budget spent)")
            if lane.proc is None and lane.queue:
                start_next(lane, args)
            if lane.proc is not None:
                poll(lane, args, results)
        time.sleep(0.5)
    runs = []
    for r in selected:
        res = results.get(r["id"]) or dict(id=r["id"], status="ERROR", verdict="ERROR", reason="no result")
        runs.append(res)
    verdicts = dict(header, wall_seconds=round(time.monotonic() - t0, 1), runs=runs,
                    table=[dict(id=r["id"], status=r.get("status"), verdict=r.get("verdict"),
                                judged=sum((r.get("phases", {}).get(p) or {}).get("judged", 0) for p in ("check", "fuzz")),
                                failed=sum((r.get("phases", {}).get(p) or {}).get("failed", 0) for p in ("check", "fuzz")),
                                errors=sum((r.get("phases", {}).get(p) or {}).get("errors", 0) for p in ("check", "fuzz")),
                                skipped=sum((r.get("phases", {}).get(p) or {}).get("skipped", 0) for p in ("check", "fuzz")),
                                worst_margin=max([(r.get("phases", {}).get(p) or {}).get("worst_margin", 0.0) or 0.0
                                                  for p in ("check", "fuzz")]),
                                budget=r.get("budget"), design=r.get("design") is not None,
                                quality={name: dict(worst_margin=a["worst_margin"], worst_rel_rms=a["worst_rel_rms"])
                                         for name, a in ((r.get("quality") or {}).get("per_tensor") or {}).items()}
                                or None,
                                backend=(r.get("backend") or {}).get("used"), reason=r.get("reason"),
                                wall_seconds=r.get("wall_seconds")) for r in runs])
    write_json(os.path.join(args.out, "adapter-verdicts.json"), verdicts)
    pack(args)
    for row in verdicts["table"]:
        log(f"{row['id']:30s} {str(row['status']):8s} {str(row['verdict']):14s} judged {row['judged']:4d} "
            f"fail {row['failed']:3d} error {row['errors']:3d} skipped {row['skipped']:4d} "
            f"worst margin {row['worst_margin']:.3g} {row['wall_seconds']} s"
            + ("".join(f"  [quality {t}: margin {q['worst_margin']:.3g}]" for t, q in row["quality"].items())
               if row.get("quality") else "")
            + (f"  ({row['reason'][:160]})" if row["reason"] else ""))
    log(f"wrote {args.out}/adapter-verdicts.json and adapter-failures.tar.xz in {time.monotonic() - t0:.0f} s")
    return 1 if any(r.get("status") in ("ERROR", "TIMEOUT", "NOT RUN") for r in runs) else 0


def skip_reason(run: dict):
    """The SKIPPED record of a run whose adapter says it is not available here, else None."""
    import importlib
    module = importlib.import_module(f"gdn_testbed.adapters.{run['module']}")
    why = module.available()
    if not why:
        return None
    try:
        versions = module.versions()
    except Exception as error:   # noqa: BLE001
        versions = {"error": repr(error)}
    if "not installed" in why and run["module"] in NOT_CARRIED:
        why = f"{why} ({NOT_CARRIED[run['module']]})"
    return dict(id=run["id"], adapter=f"gdn_testbed.adapters.{run['module']}", lane=run["lane"], status="SKIPPED",
                verdict="SKIPPED", reason=why, versions=versions, phases={}, failures=[], wall_seconds=0.0)


def git_commit():
    try:
        p = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                           cwd=os.path.dirname(os.path.abspath(__file__)))
        return p.stdout.strip() if p.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def worker_command(run: dict, args, cap: float) -> list:
    """The command line of run's worker process: the driver's settings, and its --narrow items."""
    return [sys.executable, os.path.abspath(__file__), "--worker", run["id"], "--work", args.work,
            "--cap", f"{cap:.1f}", "--cases", str(args.cases), "--seconds", str(args.seconds), "--seed",
            str(args.seed), "--warmup", str(args.warmup), "--max-failures", str(args.max_failures),
            "--shrink-seconds", str(args.shrink_seconds), "--transformers-device", args.transformers_device,
            "--cpu-threads", str(args.cpu_threads), "--quality-cases", str(args.quality_cases), "--out", args.out] + \
        (["--full-spaces"] if args.full_spaces else []) + \
        [f"--narrow={item}" for item in args.narrow if item.partition("=")[0] == run["id"]]


def run_narrowing(run: dict, args) -> dict:
    """The CaseSpace fields run's space is narrowed by: the run's own (none with --full-spaces),
    then those --narrow gives for it."""
    return dict({} if args.full_spaces else run["narrow"], **args.extra_narrow.get(run["id"], {}))


def start_next(lane: Lane, args) -> None:
    run = lane.queue.pop(0)
    weights = run["weight"] + sum(r["weight"] for r in lane.queue)
    cap = max(0.0, lane.left()) * run["weight"] / weights
    lane.current, lane.cap, lane.run_start, lane.interrupted_at = run, cap, time.monotonic(), None
    run_dir = os.path.join(args.work, run["id"])
    os.makedirs(run_dir, exist_ok=True)
    lane.log = open(os.path.join(run_dir, "log.txt"), "w", encoding="utf-8")
    command = worker_command(run, args, cap)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log(f"[{lane.name}] start {run['id']} (cap {cap:.0f} s)")
    lane.proc = subprocess.Popen(command, stdout=lane.log, stderr=subprocess.STDOUT, env=env)


def poll(lane: Lane, args, results: dict) -> None:
    run, proc = lane.current, lane.proc
    elapsed = time.monotonic() - lane.run_start
    code = proc.poll()
    if code is None:
        over = elapsed > lane.cap + args.grace or lane.left() < -args.grace
        if over and lane.interrupted_at is None:
            log(f"[{lane.name}] {run['id']}: over its cap of {lane.cap:.0f} s: SIGINT")
            proc.send_signal(signal.SIGINT)
            lane.interrupted_at = time.monotonic()
        elif lane.interrupted_at is not None and time.monotonic() - lane.interrupted_at > args.kill_after:
            log(f"[{lane.name}] {run['id']}: still running {args.kill_after} s after SIGINT: SIGKILL")
            proc.kill()
            proc.wait()
            code = proc.returncode
        if code is None:
            return
    lane.log.close()
    run_dir = os.path.join(args.work, run["id"])
    path = os.path.join(run_dir, "result.json")
    try:
        with open(path, encoding="utf-8") as f:
            res = json.load(f)
    except (OSError, ValueError) as error:
        res = dict(id=run["id"], status="ERROR", verdict="ERROR", reason=f"no result file ({error})")
    if res.get("status") == "RUNNING":
        res["status"] = "TIMEOUT" if lane.interrupted_at is not None else "ERROR"
        res["verdict"] = res.get("verdict") or overall_verdict(res.get("phases", {})) + " (partial)"
        res["reason"] = (f"ended at the run's cap ({lane.cap:.0f} s) before finishing" if lane.interrupted_at
                         is not None else f"the worker exited with status {code} before finishing")
    elif lane.interrupted_at is not None and res.get("status") == "DONE":
        res["note"] = f"interrupted at the run's cap ({lane.cap:.0f} s); the fuzz phase returned early"
    res["exit_status"] = code
    res["process_seconds"] = round(time.monotonic() - lane.run_start, 2)
    with open(os.path.join(run_dir, "log.txt"), encoding="utf-8", errors="replace") as f:
        res["log_tail"] = f.read()[-3000:]
    write_json(path, res)
    results[run["id"]] = res
    log(f"[{lane.name}] done {run['id']}: {res.get('status')} {res.get('verdict')} in {res['process_seconds']} s"
        + (f" ({str(res.get('reason'))[:200]})" if res.get("reason") else ""))
    lane.proc, lane.current = None, None


def pack(args) -> None:
    """runs/ID/... into OUT/adapter-failures.tar.xz: results, logs and shrunk case files;
    the cases as generated only while they are small."""
    path = os.path.join(args.out, "adapter-failures.tar.xz")
    tmp = path + ".tmp"
    total = 0
    with tarfile.open(tmp, "w:xz") as tar:
        for folder, _, files in sorted(os.walk(args.work)):
            for name in sorted(files):
                full = os.path.join(folder, name)
                size = os.path.getsize(full)
                if name.endswith(".original.safetensors") and (size > args.max_original_bytes
                                                              or total + size > args.max_archive_bytes):
                    continue
                if name.endswith(".safetensors") and total + size > args.max_archive_bytes:
                    continue
                total += size
                tar.add(full, arcname=os.path.join("runs", os.path.relpath(full, args.work)))
    os.replace(tmp, path)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for adapter-verdicts.json and adapter-failures.tar.xz")
    p.add_argument("--cases", type=int, default=30, help="cases of the check phase per run (default 30)")
    p.add_argument("--seconds", type=float, default=60.0, help="fuzz seconds per run, at most (default 60)")
    p.add_argument("--total-seconds", type=float, default=420.0,
                   help="time budget of each lane, shared by its runs by weight (default 420)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warmup", type=int, default=4, help="unjudged warm-up calls per run (default 4)")
    p.add_argument("--max-failures", type=int, default=2, help="failures the fuzz phase shrinks and saves")
    p.add_argument("--shrink-seconds", type=float, default=20.0, help="time to shrink one failure")
    p.add_argument("--quality-cases", type=int, default=6,
                   help="cases on which a kernel with a declared design is also judged against the fp32 baseline "
                        "(a quality figure, not a verdict; at most 15%% of the run's cap; 0: none; default 6)")
    p.add_argument("--full-spaces", action="store_true", help="the adapters' declared spaces, not narrowed")
    p.add_argument("--narrow", action="append", default=[], metavar="ID=JSON",
                   help="more narrowing of run ID's space, a JSON object of CaseSpace fields merged over the run's "
                        "own (e.g. 'fla.chunk.triton.bf16={\"length_values\": [64, 128]}'); repeatable")
    p.add_argument("--transformers-device", default="cpu", help="torch device of the transformers runs")
    p.add_argument("--cpu-threads", type=int, default=4, help="torch threads of a cpu-lane run")
    p.add_argument("--only", nargs="*", choices=RUN_IDS, help="these runs only")
    p.add_argument("--commit", help="the commit tested (default: $GDN_COMMIT, else git rev-parse HEAD)")
    p.add_argument("--work", default="/tmp/gdn-adapter-runs", help="scratch folder (emptied first)")
    p.add_argument("--grace", type=float, default=10.0, help="seconds past a run's cap before SIGINT")
    p.add_argument("--kill-after", type=float, default=30.0, help="seconds after SIGINT before SIGKILL")
    p.add_argument("--max-archive-bytes", type=int, default=12 << 20, help="uncompressed cap of the archive")
    p.add_argument("--max-original-bytes", type=int, default=1 << 20, help="largest as-generated case kept")
    p.add_argument("--worker", choices=RUN_IDS, help=argparse.SUPPRESS)
    p.add_argument("--cap", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.extra_narrow = {}
    for item in args.narrow:
        run_id, eq, text = item.partition("=")
        if not eq or run_id not in RUN_IDS:
            p.error(f"--narrow {item!r}: expected ID=JSON with ID one of {', '.join(RUN_IDS)}")
        try:
            fields = json.loads(text)
        except ValueError as error:
            p.error(f"--narrow {run_id}: the narrowing is not JSON ({error})")
        if not isinstance(fields, dict) or not fields:
            p.error(f"--narrow {run_id}: the narrowing must be a non-empty JSON object of CaseSpace fields")
        try:
            import gdn_testbed as gt
            run = next(r for r in RUNS if r["id"] == run_id)
            gt.CaseSpace("chunked").replace(**{**run["narrow"], **fields})
        except ImportError:
            pass   # checked again where the run starts
        except Exception as error:   # noqa: BLE001 - a bad field is an argument error, before any work
            p.error(f"--narrow {run_id}: {type(error).__name__}: {error}")
        args.extra_narrow.setdefault(run_id, {}).update(fields)
    for name in ("cases", "warmup", "max_failures", "cpu_threads", "quality_cases"):
        if getattr(args, name) < (0 if name in ("warmup", "quality_cases") else 1):
            p.error(f"--{name.replace('_', '-')} must be at least {0 if name in ('warmup', 'quality_cases') else 1}")
    for name in ("seconds", "total_seconds", "shrink_seconds"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.worker:
        return worker(args)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
