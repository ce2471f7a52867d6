"""A kernel under test and its calling convention (docs/python.md, "The kernel calling convention").

A kernel is a callable ``fn(problem, inputs) -> outputs``:

``problem``  a ``gdn_testbed.Problem`` (shapes, options, dtypes; docs/semantics.md).
``inputs``   a dict by case-file name, in the problem's storage dtypes: q, k [T, H, K] and
             v [T, HV, V] in ``problem.input_dtype``; g, beta (gate_mode "direct") or a, b
             ("fused") [T, HV] in ``problem.gate_dtype``; A_log, dt_bias [HV] float32 (fused);
             h0 (``problem.state_shape``: [N, HV, K, V], or [N, HV, V, K] when v_major, or the
             cache [state_slots, ...]) float32 when has_h0 or a state cache is used;
             state_indices [N] int32 (cache; -1 marks a padding sequence); cu_seqlens [N+1]
             int64. With ``arrays="numpy"`` these are numpy arrays (bf16 values as float32,
             since numpy has no bfloat16); with ``arrays="torch"`` torch tensors of exactly those
             dtypes on ``device``. They are fresh copies: the kernel may write into them.
returns      ``{"o": ..., "hT": ..., "intermediate": ...}`` (hT when ``problem.has_hT``: the
             final states, or the whole cache after the in-place update; intermediate when
             ``problem.store_intermediate_states``: [T, HV, K, V] in the state layout), or a
             tuple ``(o,)``, ``(o, hT)``, ``(o, hT, intermediate)``, or ``o`` alone. Any float
             dtype, numpy or torch on any device: they are copied to the CPU as float64, which
             is exact. Outputs the problem does not ask for are ignored.

A problem the kernel cannot run is declared by ``supports(problem) -> None | str`` (the reason):
the case is SKIPPED with it, never judged. ``Unsupported`` raised from the kernel itself is an
ERROR that says to declare it in ``supports``, since a skip decided after running would hide a
crash behind a skip.
"""
from __future__ import annotations

import inspect
import os
import sys
from typing import Callable, Optional

from .arrays import as_numpy, numpy_inputs, torch_inputs


class Unsupported(Exception):
    """A problem the kernel does not support (raise it from ``supports``, or return the reason)."""


def _default_name(fn) -> str:
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"python:{module}.{qualname}"


def _replay_spec(fn, kernel=None) -> Optional[str]:
    """How `python3 -m gdn_testbed --kernel SPEC` finds the kernel again: FILE.py:NAME or
    module:NAME, NAME being the module-level name of the Kernel itself when it has one (its
    settings travel with it), else of fn; None when neither is reachable by name (a lambda, a
    local function)."""
    module_name = getattr(fn, "__module__", None)
    module = sys.modules.get(module_name) if module_name else None
    if module is None:
        return None
    qualname = next((name for name, value in vars(module).items() if kernel is not None and value is kernel), None)
    if qualname is None:
        qualname = getattr(fn, "__qualname__", None)
        if not qualname or "<" in qualname:
            return None
        target = module
        for part in qualname.split("."):
            target = getattr(target, part, None)
            if target is None:
                return None
    path = getattr(module, "__file__", None)
    if module_name == "__main__" or (path and not module_name.startswith("gdn_testbed")):
        if not path:
            return None
        return f"{os.path.abspath(path)}:{qualname}"
    return f"{module_name}:{qualname}"


# The budget of a kernel whose chunk states and computed tensor-core operands (W, U, v_new, the
# states fed back into the next chunk) are rounded once to the input dtype by design, with fp32
# accumulation: the calibrated rule over that design's own emulation (docs/budgets.md,
# "baseline=operands_single"), the state floor in units of the input dtype. Chunked at C = 64.
OPERANDS_SINGLE = "calibrated(state_unit=input,baseline=operands_single)"
# OPERANDS_SINGLE with the l2-normalised q and k stored in the input dtype and used as the
# operands of every q and k product (reference::OperandRounding::single_qk): what fla's chunk
# kernels (both backends) and FlashQLA do, normalising q and k in a pass of their own before the
# chunk kernels. Without use_qk_l2norm it is OPERANDS_SINGLE.
OPERANDS_SINGLE_QK = "calibrated(state_unit=input,baseline=operands_single_qk)"
# The default budget: the calibrated rule over the fp32 emulation. For a kernel with a declared
# design this is the quality figure (how far the design is from what fp32 can achieve).
QUALITY_BUDGET = "calibrated"


class Design:
    """A chunked kernel's precision design: which intermediates it stores in which dtype, and so
    which emulation is its calibrated baseline (docs/python.md, "Precision designs").

    operands       "input": the chunk states fed back into the next chunk and the computed
                   tensor-core operands (W or the WY factors, U, v_new, the decayed v_new, P) are
                   rounded once to the input dtype, accumulation in fp32. (The hi + lo split
                   designs of our own kernel are C++ registry models, not offered here.)
    normalized_qk  with use_qk_l2norm: "input", the normalised q and k are stored in the input
                   dtype and are the operands (fla, FlashQLA: x * rstd in fp32, then cast);
                   "scale", the raw q and k are the operands and the norms fp32 scales (our
                   chunked kernel)
    tf32           fp32 inputs go through TF32 tensor-core products. Not modelled: the design's
                   budget for fp32 inputs is the fp32 one, so the TF32 loss shows as a FAIL; the
                   description says so
    chunk_size     the chunk length the model is built for (64 only)
    notes          what else the kernel does that the model does not distinguish (recorded)
    """

    def __init__(self, *, operands: str = "input", normalized_qk: str = "scale", tf32: bool = False,
                 chunk_size: int = 64, notes: str = ""):
        if operands != "input":
            raise ValueError(f"Design: operands must be 'input' (computed operands rounded once to the input dtype); "
                             f"got {operands!r}. A kernel with fp32 intermediates declares no design")
        if normalized_qk not in ("input", "scale"):
            raise ValueError(f"Design: normalized_qk must be 'input' or 'scale', got {normalized_qk!r}")
        if chunk_size != 64:
            raise ValueError(f"Design: the operand model is built for chunks of 64 tokens, got chunk_size={chunk_size!r}")
        if not isinstance(notes, str) or not isinstance(tf32, bool):
            raise TypeError(f"Design: notes must be a str and tf32 a bool, got {type(notes).__name__} and "
                            f"{type(tf32).__name__}")
        self.operands, self.normalized_qk, self.tf32 = operands, normalized_qk, bool(tf32)
        self.chunk_size, self.notes = chunk_size, notes

    @property
    def budget(self) -> str:
        return OPERANDS_SINGLE_QK if self.normalized_qk == "input" else OPERANDS_SINGLE

    def describe(self) -> str:
        text = ("chunk states h and the computed tensor-core operands (W, U, v_new) stored in the input dtype "
                "(bf16/fp16), fp32 accumulation")
        if self.normalized_qk == "input":
            text += "; the l2-normalised q, k stored in the input dtype and used as the operands"
        if self.tf32:
            text += ("; for fp32 inputs TF32 tensor-core dots (not modelled by the budget: an fp32 FAIL may be that "
                     "design)")
        if self.notes:
            text += "; " + self.notes
        return text

    def __repr__(self) -> str:
        return (f"Design(operands={self.operands!r}, normalized_qk={self.normalized_qk!r}, tf32={self.tf32}, "
                f"chunk_size={self.chunk_size})")


class Kernel:
    """A kernel and how it is judged.

    fn            the callable (see the module's docstring for the convention)
    name          recorded in verdicts and case files (default python:MODULE.QUALNAME)
    formulation   "chunked" or "sequential": which fp32 emulation calibrates its budget
    chunk_size    for "chunked" (64)
    arrays        "numpy" or "torch": what fn receives
    device        torch device for arrays="torch" (default cuda when available, else cpu)
    supports      problem -> None or the reason it is not supported (SKIPPED)
    deterministic whether equal inputs give equal bits (judged under budget "bitwise" only)
    space         the kernel's support matrix (a CaseSpace): fuzz and check use it when no
                  space is given
    budget        the budget it is judged by unless the caller names another
    design        the kernel's precision design: a ``Design`` (its budget is the default
                  budget, and its description is recorded), or the design in words declared
                  with the budget that models it. A kernel that keeps chunk states or
                  tensor-core operands in the input dtype by design is judged by
                  ``OPERANDS_SINGLE`` or ``OPERANDS_SINGLE_QK`` (the chunked form with every
                  computed operand rounded once to the input dtype as its baseline; the second
                  with the normalised q, k stored too), so that a FAIL is a bug, not the design;
                  its accuracy against the fp32 baseline (``QUALITY_BUDGET``) is a quality
                  figure (docs/python.md, "Precision designs"). None: fp32 intermediates, the
                  default calibrated budget. ``kernel.design`` is the description (a str),
                  ``kernel.precision`` the ``Design`` when one was given
    replay        how `python3 -m gdn_testbed --kernel SPEC` loads it (FILE.py:NAME or
                  module:NAME); found from fn when it is reachable by name
    """

    def __init__(self, fn: Callable, *, name: Optional[str] = None, formulation: str = "sequential",
                 chunk_size: int = 64, arrays: str = "numpy", device=None,
                 supports: Optional[Callable] = None, deterministic: bool = True, space=None,
                 budget: Optional[str] = None, design: Optional[str] = None, replay: Optional[str] = None):
        if not callable(fn):
            raise TypeError(f"Kernel: fn must be callable, got {type(fn).__name__}")
        if formulation not in ("chunked", "sequential"):
            raise ValueError(f"Kernel: formulation must be 'chunked' or 'sequential', got {formulation!r}")
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"Kernel: chunk_size must be an integer >= 1, got {chunk_size!r}")
        if arrays not in ("numpy", "torch"):
            raise ValueError(f"Kernel: arrays must be 'numpy' or 'torch', got {arrays!r}")
        precision = design if isinstance(design, Design) else None
        if precision is not None:
            if formulation != "chunked" or chunk_size != precision.chunk_size:
                raise ValueError(f"Kernel: {precision!r} models the chunked form at C = {precision.chunk_size}; this "
                                 f"kernel is {formulation}" + (f" at C = {chunk_size}" if formulation == "chunked" else ""))
            budget = precision.budget if budget is None else budget
            design = precision.describe()
        if design is not None and (not isinstance(design, str) or not design.strip()):
            raise ValueError(f"Kernel: design must be a non-empty description, got {design!r}")
        if design is not None and budget is None:
            raise ValueError("Kernel: a declared design needs the budget that models it (budget=, for example "
                             "gdn_testbed.OPERANDS_SINGLE); without it the design would be judged by the fp32 baseline")
        if budget is not None:
            from . import _core
            budget = _core.budget_describe(budget)
            if "baseline=operands_single" in budget and (formulation != "chunked" or chunk_size != 64):
                raise ValueError(f"Kernel: budget {budget} models the chunked form at C = 64; this kernel is "
                                 f"{formulation}" + (f" at C = {chunk_size}" if formulation == "chunked" else ""))
        self.fn = fn
        self.name = name or _default_name(fn)
        self.formulation = formulation
        self.chunk_size = chunk_size
        self.arrays = arrays
        self.device = device
        self.supports = supports
        self.deterministic = bool(deterministic)
        self.space = space
        self.budget = budget
        self.design = design
        self.precision = precision
        self._replay = replay

    @property
    def replay(self) -> Optional[str]:
        # Looked up when asked: a decorated function is bound to its name only after this
        # object is made.
        return self._replay if self._replay is not None else _replay_spec(self.fn, self)

    def __repr__(self) -> str:
        return f"Kernel({self.name}, {self.formulation}, arrays={self.arrays})"

    def __call__(self, problem, inputs):
        return self.fn(problem, inputs)

    # ---- what the C++ campaign calls (bindings.cpp, PythonImplementation) ----

    def _gdn_supports(self, problem) -> Optional[str]:
        if self.supports is None:
            return None
        try:
            reason = self.supports(problem)
        except Unsupported as error:
            return str(error) or "unsupported"
        if reason is None or reason is True:
            return None
        if reason is False:
            return "not supported (supports() returned False)"
        return str(reason)

    def kernel_inputs(self, problem, inputs: dict) -> dict:
        """inputs (float64 numpy, as the generator makes them) in the form fn receives."""
        if self.arrays == "torch":
            return torch_inputs(problem, inputs, self.device)
        return numpy_inputs(problem, inputs)

    def _gdn_run(self, problem, inputs: dict) -> dict:
        try:
            result = self.fn(problem, self.kernel_inputs(problem, inputs))
        except Unsupported as error:
            raise RuntimeError(f"the kernel raised Unsupported({error}) while running: declare what it does not "
                               f"support in supports= so that such cases are SKIPPED before it runs") from error
        return normalize_outputs(problem, result)


def normalize_outputs(problem, result) -> dict:
    """The kernel's return value as {"o", "hT", "intermediate"} float64 numpy arrays, checked
    against the problem (missing or misshapen outputs raise ValueError naming them)."""
    if isinstance(result, dict):
        unknown = set(result) - {"o", "hT", "intermediate"}
        if unknown:
            raise ValueError(f"the kernel returned unknown outputs {sorted(unknown)} (expected o, hT, intermediate)")
        outputs = dict(result)
    elif isinstance(result, (tuple, list)):
        if not 1 <= len(result) <= 3:
            raise ValueError(f"the kernel returned a tuple of {len(result)}; expected (o,), (o, hT) or "
                             f"(o, hT, intermediate)")
        outputs = dict(zip(("o", "hT", "intermediate"), result))
    else:
        outputs = {"o": result}
    expected = {"o": list(problem.v_shape)}
    if problem.has_hT:
        expected["hT"] = list(problem.state_shape)
    if problem.store_intermediate_states:
        expected["intermediate"] = list(problem.intermediate_shape)
    converted = {}
    for name, shape in expected.items():
        value = outputs.get(name)
        if value is None:
            raise ValueError(f"the kernel returned no '{name}', which this problem asks for "
                             f"({problem.describe()}; expected shape {shape})")
        array = as_numpy(value)
        if list(array.shape) != shape:
            raise ValueError(f"the kernel's '{name}' has shape {list(array.shape)}, expected {shape}")
        converted[name] = array
    return converted


def kernel(fn: Optional[Callable] = None, **settings):
    """Decorator: ``@gdn_testbed.kernel(formulation="chunked", arrays="torch")`` makes a Kernel."""
    if fn is not None:
        return Kernel(fn, **settings)
    return lambda f: Kernel(f, **settings)


def as_kernel(k) -> "Kernel | str":
    """A Kernel, the name of a registered C++ implementation (str), or a plain callable (wrapped
    with the defaults)."""
    if isinstance(k, (Kernel, str)):
        return k
    if inspect.isclass(k):
        raise TypeError(f"kernel: got the class {k.__name__}; pass an instance or a function")
    if callable(k):
        return Kernel(k)
    raise TypeError(f"kernel: expected a gdn_testbed.Kernel, a callable or a registered name, got {type(k).__name__}")
