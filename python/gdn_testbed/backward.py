"""The backward in Python (docs/python.md, "Backward"): the exact gradient references, the fp32
emulation, the gradient judge, and a fuzz loop for backward kernels.

A backward kernel is a callable ``kernel(problem, inputs, dO, dhT) -> gradients``:

``problem``, ``inputs``  as for a forward kernel (docs/python.md, the kernel calling convention),
             numpy in the storage dtypes (``arrays="numpy"``, bf16 as float32) or torch tensors of
             exactly those dtypes (``arrays="torch"``);
``dO``       [T, HV, V], the loss's gradient with respect to o, values of the input dtype;
``dhT``      [N, HV, K, V] (the state layout) float32, or None (read as zero; only given when
             ``problem.has_hT``);
returns      a dict ``{"dq", "dk", "dv", "dg", "dbeta", "dh0"}`` (direct gates) or with
             ``"da", "db", "dA_log", "ddt_bias"`` instead of dg, dbeta (fused gates); dh0 only
             when ``problem.has_h0``. Any float dtype, numpy or torch on any device (copied to the
             CPU as float64, exact). Gradients the problem does not have must be absent or None.

The oracle is ``sequential_backward`` in double; the budget (docs/budgets.md "Gradients") is
calibrated on the fp32 emulation of the kernel's formulation, each gradient's error measured
relative to its term magnitudes. ``fuzz_backward`` draws cases from a CaseSpace restricted to
what the backward covers (dense states), shrinks a failure with the C++ shrinker, and saves it as
a case file (gdn-case/2: inputs, the cotangents in.dO / in.dhT, the kernel's gradients out.dq ...,
the formulation, chunk size and budget in the metadata; docs/case_files.md) with a replay
snippet; ``gdn-testbed verify`` judges the same file. ``replay_backward`` and
``load_backward_case`` also read the ``.npz`` files earlier versions saved.
"""
from __future__ import annotations

import json
import os
import shlex
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from . import _core
from .arrays import _NUMPY_DTYPES, as_numpy, as_numpy_inputs, numpy_inputs, torch_inputs
from .casefile import read_case_file, write_case_file
from .fuzzing import describe_failure
from .space import _space_text

GRADIENT_NAMES = ("dq", "dk", "dv", "dg", "dbeta", "da", "db", "dA_log", "ddt_bias", "dh0")
NPZ_FORMAT = "gdn-backward-case/1"  # what earlier versions saved; still read


def _backward_dict(dO, dhT) -> dict:
    return {"dO": as_numpy(dO), "dhT": None if dhT is None else as_numpy(dhT)}


# ---- references, emulation, judge ----------------------------------------------------------

def make_backward_inputs(problem, seed: int) -> dict:
    """fuzz::make_backward_inputs: seeded cotangents {"dO", "dhT"} (dO ~ N(0, 1) rounded to the
    input dtype; dhT ~ N(0, 1) in fp32 when the problem has hT, absent for one draw in four)."""
    return _core.make_backward_inputs(problem, int(seed))


def backward_tensors(problem) -> list:
    """The names of the gradients the problem has, in the order of the verdict's checks."""
    return list(_core.backward_tensors(problem))


def sequential_backward(problem, inputs: dict, dO, dhT=None, precision: str = "f64",
                        term_magnitudes: bool = False):
    """reference::sequential_backward: the exact adjoint of the recurrence (docs/backward.md).
    precision "f64" (the oracle), "f80" (long double, numpy.longdouble) or "f32". With
    term_magnitudes=True returns (gradients, magnitudes): per element the sum of the magnitudes
    of the terms that form it (what gradient errors are measured against)."""
    return _core.sequential_backward(problem, as_numpy_inputs(inputs), _backward_dict(dO, dhT), precision,
                                     bool(term_magnitudes))


def chunked_backward(problem, inputs: dict, dO, dhT=None, chunk_size: int = 64, precision: str = "f64") -> dict:
    """reference::chunked_backward: the chunked (WY) backward at any chunk size."""
    return _core.chunked_backward(problem, as_numpy_inputs(inputs), _backward_dict(dO, dhT), int(chunk_size),
                                  precision)


def emulate_backward(problem, inputs: dict, dO, dhT=None, formulation: str = "chunked", chunk_size: int = 64,
                     baseline: str = "emulation") -> dict:
    """The calibrated budget's baseline for gradients, rounded once to their storage dtypes:
    baseline "emulation" (oracle::emulate_backward), a straightforward fp32 backward of the
    formulation; "operands_single" (oracle::emulate_backward_operands, chunked only), the chunked
    backward with every product's operand rounded once to the input dtype (the design of kernels
    that store their operands in bf16 / fp16; budget OPERANDS_SINGLE judges against it)."""
    return _core.emulate_backward(problem, as_numpy_inputs(inputs), _backward_dict(dO, dhT), formulation,
                                  int(chunk_size), baseline)


def normalize_gradients(gradients) -> dict:
    """A kernel's gradients as float64 numpy arrays; None entries dropped."""
    if not isinstance(gradients, dict):
        raise ValueError(f"a backward kernel returns a dict of gradients ({', '.join(GRADIENT_NAMES)}), "
                         f"got {type(gradients).__name__}")
    return {name: as_numpy(value) for name, value in gradients.items() if value is not None}


def judge_backward(problem, inputs: dict, dO, dhT, gradients, *, formulation: str = "sequential",
                   chunk_size: int = 64, budget: str = "calibrated", oracle: str = "f64", case_name: str = "python",
                   implementation: str = "python", first=None) -> "_core.Verdict":
    """oracle::evaluate_gradients: one check per gradient tensor (docs/budgets.md "Gradients").
    budget: "calibrated" (default), "fixed" (fla's thresholds), "fixed(rel_rms=X)", "analytic",
    or "bitwise" with the first run's gradients as `first` (determinism)."""
    return _core.judge_backward(problem, as_numpy_inputs(inputs), _backward_dict(dO, dhT),
                                normalize_gradients(gradients), formulation, int(chunk_size), budget, oracle,
                                case_name, implementation, None if first is None else normalize_gradients(first))


# ---- kernels --------------------------------------------------------------------------------

class BackwardKernel:
    """A backward kernel with what the oracle needs to know about it: its formulation (the
    emulation its budget is calibrated on), chunk size, default budget, the problems it
    supports (``supports(problem) -> None | reason``), how it takes arrays."""

    def __init__(self, fn: Callable, *, name: Optional[str] = None, formulation: str = "chunked",
                 chunk_size: int = 64, budget: Optional[str] = None, supports: Optional[Callable] = None,
                 arrays: str = "numpy", device=None, deterministic: bool = True):
        if not callable(fn):
            raise TypeError("BackwardKernel: fn must be callable(problem, inputs, dO, dhT)")
        if formulation not in ("chunked", "sequential"):
            raise ValueError(f"formulation must be 'chunked' or 'sequential', got {formulation!r}")
        if arrays not in ("numpy", "torch"):
            raise ValueError(f"arrays must be 'numpy' or 'torch', got {arrays!r}")
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.fn = fn
        self.name = name or f"python:{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
        self.formulation = formulation
        self.chunk_size = int(chunk_size)
        self.budget = budget
        self.supports = supports
        self.arrays = arrays
        self.device = device
        self.deterministic = deterministic

    def reason_unsupported(self, problem) -> Optional[str]:
        if self.supports is None:
            return None
        reason = self.supports(problem)
        return None if reason is None else str(reason)

    def run(self, problem, inputs: dict, backward: dict) -> dict:
        dO, dhT = backward["dO"], backward.get("dhT")
        if self.arrays == "torch":
            import torch
            x = torch_inputs(problem, inputs, self.device)
            device = x["q"].device
            dO = torch.as_tensor(as_numpy(dO)).to(device=device, dtype=x["q"].dtype)
            dhT = None if dhT is None else torch.as_tensor(as_numpy(dhT)).to(device=device, dtype=torch.float32)
        else:
            x = numpy_inputs(problem, inputs)
            dO = np.asarray(dO, dtype=_NUMPY_DTYPES[problem.input_dtype])
            dhT = None if dhT is None else np.asarray(dhT, dtype=np.float32)
        return normalize_gradients(self.fn(problem, x, dO, dhT))


def as_backward_kernel(kernel) -> BackwardKernel:
    return kernel if isinstance(kernel, BackwardKernel) else BackwardKernel(kernel)


def autograd_kernel(forward_fn: Callable, *, name: Optional[str] = None, formulation: str = "chunked",
                    chunk_size: int = 64, budget: Optional[str] = None, supports: Optional[Callable] = None,
                    device=None) -> BackwardKernel:
    """A backward kernel from any torch forward, through torch.autograd.grad.

    ``forward_fn(problem, tensors) -> (o, hT)`` (or ``{"o", "hT"}``, or o alone) takes the inputs
    as torch tensors in their storage dtypes on `device` (q, k, v, g, beta or a, b, A_log,
    dt_bias, h0, cu_seqlens: the package's layout, ``gdn_testbed.torch_inputs``), the floating
    ones with ``requires_grad``; an adapter to another library's layout goes inside it. The
    gradients are ``torch.autograd.grad([o, hT], leaves, grad_outputs=[dO, dhT])`` with dO in
    o's dtype and dhT in hT's, returned in the inputs' dtypes (a leaf with no path to the
    outputs gets zeros)."""
    def run(problem, inputs, dO, dhT):
        import torch
        leaves = [n for n in ("q", "k", "v", "g", "beta", "a", "b", "A_log", "dt_bias", "h0") if n in inputs]
        tensors = dict(inputs)
        for n in leaves:
            tensors[n] = inputs[n].detach().clone().requires_grad_(True)
        result = forward_fn(problem, tensors)
        if isinstance(result, dict):
            o, hT = result["o"], result.get("hT")
        elif isinstance(result, (tuple, list)):
            o, hT = result[0], (result[1] if len(result) > 1 else None)
        else:
            o, hT = result, None
        outputs, cotangents = [o], [dO.to(device=o.device, dtype=o.dtype)]
        if dhT is not None:
            if hT is None:
                raise ValueError("autograd_kernel: the problem has hT and dhT is given, but forward_fn returned no hT")
            outputs.append(hT)
            cotangents.append(dhT.to(device=hT.device, dtype=hT.dtype))
        grads = torch.autograd.grad(outputs, [tensors[n] for n in leaves], grad_outputs=cotangents, allow_unused=True)
        return {"d" + n: (torch.zeros_like(tensors[n]) if g is None else g.to(tensors[n].dtype))
                for n, g in zip(leaves, grads)}

    return BackwardKernel(run, name=name or f"autograd:{getattr(forward_fn, '__qualname__', 'forward')}",
                          formulation=formulation, chunk_size=chunk_size, budget=budget, supports=supports,
                          arrays="torch", device=device)


# ---- the fuzz loop --------------------------------------------------------------------------

@dataclass
class BackwardFailure:
    implementation: str
    case_index: int
    case_seed: int
    original_problem: str
    shrunk_problem: str
    file: str             # case file: problem, inputs, cotangents, the failing gradients, settings
    replay: str           # a command that judges the stored gradients again
    verdict: "_core.Verdict"
    original_verdict: "_core.Verdict"

    def describe(self) -> str:
        return describe_failure(self)


@dataclass
class BackwardSummary:
    implementation: str
    cases: int
    passed: int
    failed: int
    errors: int
    skipped: int
    worst_margin: float
    worst_case: str
    seconds: float
    failures: list = field(default_factory=list)
    failures_total: int = 0
    out: str = ""

    @property
    def judged(self) -> int:
        return self.passed + self.failed + self.errors

    @property
    def ok(self) -> bool:
        """No failure and at least one case judged: all SKIPPED proves nothing."""
        return self.failures_total == 0 and self.judged > 0

    def describe(self) -> str:
        return (f"{self.implementation} (backward): {self.cases} cases in {self.seconds:.1f} s: {self.passed} pass, "
                f"{self.failed} fail, {self.errors} error, {self.skipped} skipped; worst margin "
                f"{self.worst_margin:.3g}")

    def __str__(self) -> str:
        return "\n".join([self.describe()] + [f.describe() for f in self.failures])

    def assert_pass(self) -> "BackwardSummary":
        """Raises AssertionError unless every judged case passed and at least one was judged."""
        if self.ok:
            return self
        if self.judged == 0:
            raise AssertionError(f"gdn_testbed.check_backward: no case was judged ({self.skipped} SKIPPED of "
                                 f"{self.cases}): nothing was verified.\n{self.describe()}")
        lines = [f"gdn_testbed.check_backward: {self.failures_total} failing case(s) for {self.implementation}",
                 self.describe()] + [f.describe() for f in self.failures[:3]]
        raise AssertionError("\n".join(lines))


def _evaluate(k: BackwardKernel, problem, inputs, backward, budget, case_name):
    """(verdict, gradients of the first run or None)."""
    dO, dhT = backward["dO"], backward.get("dhT")
    try:
        first = k.run(problem, inputs, backward)
        if budget == "bitwise":
            again = k.run(problem, inputs, backward)
            return judge_backward(problem, inputs, dO, dhT, again, formulation=k.formulation,
                                  chunk_size=k.chunk_size, budget=budget, case_name=case_name,
                                  implementation=k.name, first=first), first
        return judge_backward(problem, inputs, dO, dhT, first, formulation=k.formulation, chunk_size=k.chunk_size,
                              budget=budget, case_name=case_name, implementation=k.name), first
    except _core.ProblemError:
        raise  # the case itself is malformed: a bug of the caller, not of the kernel
    except Exception as error:  # the kernel's failure is an ERROR verdict naming it
        return _core.backward_error_verdict(problem, budget, case_name, k.name,
                                            f"threw: {type(error).__name__}: {error}"), None


def _save_case(path: str, problem, inputs: dict, backward: dict, gradients: Optional[dict], settings: dict,
               extra: Optional[dict] = None) -> None:
    """A backward case as a case file (gdn-case/2, written atomically by the C++ writer): the
    settings as gdn.implementation, gdn.formulation, gdn.chunk_size, gdn.budget. Gradients the
    format cannot hold as they are (a kernel that returned a wrong set or shape: its verdict is
    an ERROR saying so) are left out, and gdn.gradients_not_stored says why."""
    metadata = {"gdn.implementation": settings["implementation"], "gdn.formulation": settings["formulation"],
                "gdn.chunk_size": str(settings["chunk_size"]), "gdn.budget": settings["budget"],
                "gdn.versions": _core.build_versions(), "gdn.device": "python"}
    metadata.update(extra or {})
    cotangents = {"dO": backward["dO"], "dhT": backward.get("dhT")}
    if gradients is not None:
        try:
            write_case_file(path, problem, inputs, None, metadata, cotangents, gradients)
            return
        except ValueError as error:
            metadata["gdn.gradients_not_stored"] = str(error)
    write_case_file(path, problem, inputs, None, metadata, cotangents, None)


def _is_npz(path) -> bool:
    with open(os.fspath(path), "rb") as f:
        return f.read(4) == b"PK\x03\x04"  # a zip archive: what np.savez wrote


def load_backward_case(path) -> dict:
    """A saved backward case: {"problem", "inputs", "dO", "dhT", "gradients" (None when not
    stored), "settings"}, from a case file (gdn-case/2) or an .npz of earlier versions."""
    if not _is_npz(path):
        c = read_case_file(path)
        if c.backward is None:
            raise ValueError(f"{path}: holds no backward inputs (in.dO): not a backward case")
        return {"problem": c.problem, "inputs": c.inputs, "dO": c.backward["dO"], "dhT": c.backward.get("dhT"),
                "gradients": c.gradients,
                "settings": {"implementation": c.metadata.get("gdn.implementation", "(unnamed)"),
                             "formulation": c.settings["formulation"], "chunk_size": c.settings["chunk_size"],
                             "budget": c.metadata.get("gdn.budget")}}
    with np.load(os.fspath(path), allow_pickle=False) as z:
        if "format" not in z.files or str(z["format"]) != NPZ_FORMAT:
            raise ValueError(f"{path}: not a {NPZ_FORMAT} file")
        problem = _core.problem_from_dict(json.loads(str(z["problem"])))
        inputs = {n[3:]: z[n] for n in z.files if n.startswith("in.")}
        gradients = {n[4:]: z[n] for n in z.files if n.startswith("out.")}
        return {"problem": problem, "inputs": inputs, "dO": z["bwd.dO"],
                "dhT": z["bwd.dhT"] if "bwd.dhT" in z.files else None, "gradients": gradients or None,
                "settings": json.loads(str(z["settings"]))}


def replay_backward(kernel, path, budget: Optional[str] = None) -> "_core.Verdict":
    """Judges a saved backward case again: kernel=None judges the stored gradients, else reruns
    the kernel on the stored inputs and cotangents. The formulation, chunk size and budget are
    the file's (budget overrides; a kernel's own formulation wins)."""
    c = load_backward_case(path)
    s = c["settings"]
    use_budget = budget or s.get("budget") or "calibrated"
    if kernel is None:
        if c["gradients"] is None:
            raise ValueError(f"{path}: no gradients stored (the kernel failed before returning any): pass the kernel")
        return judge_backward(c["problem"], c["inputs"], c["dO"], c["dhT"], c["gradients"],
                              formulation=s["formulation"], chunk_size=s["chunk_size"], budget=use_budget,
                              case_name=os.fspath(path), implementation=s["implementation"])
    k = as_backward_kernel(kernel)
    verdict, _ = _evaluate(k, c["problem"], c["inputs"], {"dO": c["dO"], "dhT": c["dhT"]},
                           use_budget, os.fspath(path))
    return verdict


def fuzz_backward(kernel, space=None, *, cases: int = 0, seconds: float = 0, seed: int = 1,
                  out: Optional[str] = None, budget: Optional[str] = None, shrink: bool = True,
                  max_failures: int = 10, stop_at_first: bool = False, shrink_evaluations: int = 200,
                  shrink_seconds: float = 20.0, progress: bool = False) -> BackwardSummary:
    """Fuzzes a backward kernel: cases drawn from `space` (a CaseSpace; default the chunked preset)
    restricted to the backward's scope, cotangents from make_backward_inputs with the case's seed
    (the cases `fuzz` draws from the same seed), each judged by judge_backward; a failure is shrunk
    by the C++ shrinker (cli/shrink.hpp: the predicate reruns the kernel on the smaller case with
    the cotangents drawn again for its shape) and saved under `out` as a case file (as generated:
    NAME.original.safetensors, shrunk: NAME.safetensors) with a replay command.
    Stops after `cases` or `seconds` (one is required)."""
    k = as_backward_kernel(kernel)
    if not (cases and cases > 0) and not (seconds and seconds > 0):
        raise ValueError("fuzz_backward needs a limit: seconds > 0 or cases > 0")
    budget = budget or k.budget or "calibrated"
    _core.budget_describe(budget)  # a malformed budget fails here, before any work
    space_text = _core.backward_space(_space_text(space))
    out = os.fspath(out) if out is not None else "gdn-fuzz-backward-out"
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"out: {out} exists and is not a folder")
    os.makedirs(out, exist_ok=True)
    settings = {"implementation": k.name, "formulation": k.formulation, "chunk_size": k.chunk_size, "budget": budget}
    summary = BackwardSummary(k.name, 0, 0, 0, 0, 0, 0.0, "", 0.0, out=out)
    start = time.monotonic()
    index = 0
    while (not cases or index < cases) and (not seconds or time.monotonic() - start < seconds):
        case_seed = _core.case_seed(int(seed), index)
        problem, inputs, _ = _core.sample_case(case_seed, space_text)
        summary.cases += 1
        index += 1
        if k.reason_unsupported(problem) is not None:
            summary.skipped += 1
            continue
        backward = make_backward_inputs(problem, case_seed)
        name = f"case {index - 1} (seed {case_seed})"
        verdict, gradients = _evaluate(k, problem, inputs, backward, budget, name)
        if verdict.worst_margin > summary.worst_margin or not summary.worst_case:
            summary.worst_margin, summary.worst_case = verdict.worst_margin, name
        if verdict.passed:
            summary.passed += 1
            continue
        if verdict.status == "ERROR":
            summary.errors += 1
        else:
            summary.failed += 1
        summary.failures_total += 1
        if progress:
            print(f"gdn_testbed.fuzz_backward: {verdict.summary()}", flush=True)
        if len(summary.failures) < max_failures:
            small_problem, small_inputs = problem, inputs
            if shrink:
                wanted = verdict.status

                def still_fails(p, x, wanted=wanted):
                    # The same status as the case found (as the C++ fuzzer keeps it): a FAIL must
                    # not shrink into an ERROR of a shape the kernel rejects.
                    if k.reason_unsupported(p) is not None:
                        return False
                    v, _ = _evaluate(k, p, x, make_backward_inputs(p, case_seed), budget, name)
                    return v.status == wanted
                r = _core.shrink(problem, inputs, still_fails, int(shrink_evaluations), float(shrink_seconds))
                small_problem, small_inputs = r["problem"], r["inputs"]
            small_backward = make_backward_inputs(small_problem, case_seed)
            small_verdict, small_gradients = _evaluate(k, small_problem, small_inputs, small_backward, budget, name)
            stem = os.path.join(out, f"backward-{k.name.replace('/', '_').replace(':', '_')}-case{index - 1}")
            replay = ("python3 -c " + shlex.quote(
                f"import gdn_testbed as gt; print(gt.replay_backward(None, {stem + '.safetensors'!r}).details())"))
            _save_case(stem + ".original.safetensors", problem, inputs, backward, gradients, settings,
                       {"gdn.case_name": f"fuzz_backward/{seed}/{index - 1}", "gdn.verdict": verdict.to_json()})
            _save_case(stem + ".safetensors", small_problem, small_inputs, small_backward, small_gradients, settings,
                       {"gdn.case_name": f"fuzz_backward/{seed}/{index - 1}", "gdn.replay": replay,
                        "gdn.shrunk_from": stem + ".original.safetensors", "gdn.verdict": small_verdict.to_json()})
            summary.failures.append(BackwardFailure(k.name, index - 1, case_seed, problem.describe(),
                                                    small_problem.describe(), stem + ".safetensors", replay,
                                                    small_verdict, verdict))
        if stop_at_first:
            break
    summary.seconds = time.monotonic() - start
    return summary


def check_backward(kernel, space=None, *, cases: int = 100, seed: int = 1, out: Optional[str] = None,
                   budget: Optional[str] = None, **options) -> BackwardSummary:
    """fuzz_backward for a test: stops at the first failure (shrunk and saved); `.assert_pass()`
    raises with the shrunk case, the worst check and its margin. out defaults to a new
    temporary folder (named in the report)."""
    if out is None:
        out = tempfile.mkdtemp(prefix="gdn-check-backward-")
    options.setdefault("stop_at_first", True)
    options.setdefault("max_failures", 1)
    return fuzz_backward(kernel, space, cases=cases, seed=seed, out=out, budget=budget, **options)
