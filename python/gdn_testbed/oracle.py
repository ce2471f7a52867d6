"""The exact references, the precision emulations and the oracle (reference/, oracle/).

Inputs and outputs are dicts of arrays (numpy float64, or torch tensors, copied through the
CPU); outputs come back as {"o", "hT", "intermediate"} numpy arrays (None where the problem does
not ask for them), float64, or numpy.longdouble (80-bit on x86-64) for precision "f80".
"""
from __future__ import annotations

import json
from typing import Optional

from . import _core
from .arrays import as_numpy, as_numpy_inputs, as_numpy_outputs


def sequential(problem, inputs: dict, precision: str = "f64") -> dict:
    """reference::sequential: the recurrence (the definition, docs/semantics.md section 2).
    precision "f64" (the oracle of fuzzing), "f80" (long double, certifies the double one) or
    "f32" (float accumulation)."""
    return _core.sequential(problem, as_numpy_inputs(inputs), precision)


def chunked(problem, inputs: dict, chunk_size: int = 64, precision: str = "f64", trace: bool = False):
    """reference::chunked: the chunked (WY) form at any chunk size. With trace=True returns
    (outputs, records): one dict per (sequence, value head, chunk) with sequence, head, chunk,
    begin, length and the intermediates gamma [c], A, T [c, c], W [c, K], U, Vnew [c, V],
    S0, S_end [K, V] (memory grows with T)."""
    return _core.chunked(problem, as_numpy_inputs(inputs), int(chunk_size), precision, bool(trace))


def emulate(problem, inputs: dict, formulation: str = "chunked", chunk_size: int = 64) -> dict:
    """reference::emulate: what a straightforward fp32 kernel computes on these inputs (the
    calibrated budget's baseline)."""
    return _core.emulate(problem, as_numpy_inputs(inputs), formulation, int(chunk_size))


def emulate_operands(problem, inputs: dict, rounding: str = "single") -> dict:
    """reference::emulate_operands: the chunked form in fp32 with tensor-core operands rounded to
    the input dtype (split, single, split_state, split_state_pv, s0_once, single_qk, split_all:
    the chunked kernel's design; split_all_p_once: that with bf16's P rounded once, the design before)."""
    return _core.emulate_operands(problem, as_numpy_inputs(inputs), rounding)


def judge(problem, inputs: dict, outputs, *, formulation: str = "sequential", chunk_size: int = 64,
          budget: str = "calibrated", oracle: str = "f64", case_name: str = "python",
          implementation: str = "python") -> "_core.Verdict":
    """Judges outputs against the oracle (oracle::evaluate_outputs): the exact reference in
    double ("f64") or long double ("f80"), the budget (docs/budgets.md: "calibrated",
    "calibrated(factor=3)", "fixed(rel_rms=1e-3)", "bitwise", "analytic", ...) calibrated on
    the formulation's emulation. outputs: a dict, a tuple (o, hT, intermediate) or o alone,
    numpy or torch. Returns a Verdict (verdict.to_json() is the CLI's JSON)."""
    from .kernel import normalize_outputs
    return _core.judge(problem, as_numpy_inputs(inputs), normalize_outputs(problem, outputs), formulation,
                       int(chunk_size), budget, oracle, case_name, implementation)


def judge_against(problem, inputs: dict, reference: dict, actual: dict, baseline: Optional[dict] = None, *,
                  formulation: str = "sequential", budget: str = "calibrated", chunk_size: int = 0):
    """oracle::judge with the reference (and, for a calibrated budget, the baseline) given."""
    return _core.judge_against(problem, as_numpy_inputs(inputs), as_numpy_outputs(reference),
                               as_numpy_outputs(actual), None if baseline is None else as_numpy_outputs(baseline),
                               formulation, budget, int(chunk_size))


def compare(problem, inputs: dict, tensor: str, reference, actual) -> dict:
    """oracle::compare: the metrics of one output tensor (rel_rms, max_abs_error, max_ulp,
    worst location, ...) as a dict."""
    return json.loads(_core.compare(problem, as_numpy_inputs(inputs), tensor, as_numpy(reference),
                                    as_numpy(actual)))


def budget_describe(budget: str) -> str:
    """The budget's canonical text; ValueError for a malformed one."""
    return _core.budget_describe(budget)


def implementations() -> list:
    """The registered C++ implementations (references, planted faults): name, description,
    default budget. Any of these names can be fuzzed or run in-process."""
    return _core.implementations()


def run_implementation(name: str, problem, inputs: dict) -> dict:
    """Runs a registered C++ implementation (e.g. "reference.chunked.f64", "fault.dropped_decay")."""
    return _core.run_implementation(name, problem, as_numpy_inputs(inputs))


def verdicts_json(verdicts, command: str = "gdn_testbed") -> dict:
    """The gdn-verdicts/1 object the CLI's --json writes."""
    return json.loads(_core.verdicts_json(command, list(verdicts)))


def write_verdicts(verdicts, json_path: Optional[str] = None, junit_path: Optional[str] = None,
                   command: str = "gdn_testbed", suite: str = "gdn_testbed") -> None:
    """--json and --junit files, as the CLI writes them (atomically)."""
    verdicts = list(verdicts)
    if json_path:
        _core.write_text_file(str(json_path), _core.verdicts_json(command, verdicts) + "\n")
    if junit_path:
        _core.write_text_file(str(junit_path), _core.junit_xml(suite, verdicts))
