"""The Problem (core/problem.hpp) and the inputs of a case.

``Problem`` is the C++ type itself: its fields read and write as in C++ (dtypes, layouts and
gate modes as the case files spell them: "bf16", "v_major", "fused"), ``validate()`` is the one
check (``ProblemError`` with ``argument`` and ``rule``), and ``to_dict`` / ``from_dict`` are the
case file's ``gdn.problem`` object (docs/case_files.md), read strictly.

Inputs are a dict of numpy float64 arrays by case-file name (q, k, v, g, beta or a, b, A_log,
dt_bias, h0, state_indices; cu_seqlens alongside), every value exactly representable in its
storage dtype (q, k, v: input_dtype; g, beta, a, b: gate_dtype; h0: state_dtype; A_log,
dt_bias: f32). With linear gates (``gate_space="linear"``) the decay is ``alpha`` = exp(g) in
place of ``g`` (``problem.decay_name``).
"""
from __future__ import annotations

import json
from typing import Optional, Sequence

import numpy as np

from . import _core

Problem = _core.Problem


def _to_dict(self) -> dict:
    """The case file's gdn.problem object."""
    return json.loads(self.to_json())


def problem_from_dict(d: dict) -> Problem:
    """Strict: every key of gdn.problem, types checked, then validate(); ValueError naming the key."""
    return _core.problem_from_dict(d)


def _packed(lengths: Sequence[int], H: int = 1, HV: Optional[int] = None, K: int = 16, V: int = 16,
            **options) -> Problem:
    """A packed batch from sequence lengths, plus any field of Problem (input_dtype="bf16", has_h0=True,
    scale=0.5, ...); validated."""
    lengths = [int(x) for x in lengths]
    if any(x < 0 for x in lengths):
        raise _core.ProblemError(f"gdn: invalid argument 'lengths': must be >= 0, got {lengths}")
    p = Problem()
    cu = [0]
    for x in lengths:
        cu.append(cu[-1] + x)
    p.cu_seqlens = cu
    p.T = cu[-1]
    p.H, p.HV, p.K, p.V = int(H), int(HV if HV is not None else H), int(K), int(V)
    for key, value in options.items():
        if not hasattr(p, key) or key in ("N", "group_size", "effective_scale", "uses_state_cache"):
            raise TypeError(f"Problem.packed: unknown field '{key}'")
        setattr(p, key, value)
    p.validate()
    return p


Problem.to_dict = _to_dict
Problem.from_dict = staticmethod(problem_from_dict)
Problem.packed = staticmethod(_packed)
Problem.__reduce__ = lambda self: (problem_from_dict, (_to_dict(self),))


def default_input_options() -> dict:
    """fuzz::InputOptions{} as a dict: regime, beta_max, unit_keys, state_scale, padding_fraction,
    small_norms, zero_key_tail (the last N tokens of every sequence get zero keys)."""
    return json.loads(_core.default_input_options())


def make_inputs(problem: Problem, seed: int = 0, **options) -> dict:
    """fuzz::make_inputs: seeded inputs for the problem (deterministic in problem, options, seed).
    options override default_input_options() (e.g. regime="underflow", beta_max=2.0)."""
    merged = default_input_options()
    for key, value in options.items():
        if key not in merged:
            raise TypeError(f"make_inputs: unknown option '{key}' (known: {', '.join(merged)})")
        merged[key] = value
    return _core.make_inputs(problem, json.dumps(merged), int(seed))


def validate_inputs(problem: Problem, inputs: dict) -> dict:
    """gdn::validate plus the representability rule; returns the inputs as float64 numpy arrays.
    Accepts numpy arrays or torch tensors (copied through the CPU)."""
    from .arrays import as_numpy_inputs
    return _core.validate_inputs(problem, as_numpy_inputs(inputs))


def round_to(dtype: str, array) -> np.ndarray:
    """Rounds to the dtype (round to nearest even; bf16 and f16 through f32, as the generator does)
    and returns float64: how to make data exactly representable before handing it to the oracle."""
    from .arrays import as_numpy
    return _core.round_to(dtype, as_numpy(array))
