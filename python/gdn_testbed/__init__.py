"""gdn_testbed: gdn-testbed's oracle, generators and fuzz loop for Python kernels (docs/python.md).

Everything here calls the C++ core (the extension module ``gdn_testbed._core``): the Problem and
its validation, the case generator and case spaces, the exact references (double and long
double, sequential and chunked), the fp32 emulations, the oracle's metrics, budgets and
verdicts, case files, and the fuzz campaign with its shrinker. Arrays go in and out as numpy;
torch tensors on any device are accepted and returned where a kernel works in torch
(``gdn_testbed.arrays``: copies through the CPU).

    import gdn_testbed as gt
    space = gt.CaseSpace(input_dtypes=["bf16"], K_values=[128], V_values=[128])
    gt.check(my_kernel, space, cases=200).assert_pass()
"""
from __future__ import annotations

from . import _core
from ._core import ProblemError, Verdict
from .arrays import as_numpy, from_torch, to_torch, torch_inputs
from .kernel import OPERANDS_SINGLE, OPERANDS_SINGLE_QK, QUALITY_BUDGET, Design, Kernel, Unsupported, kernel
from .oracle import (budget_describe, chunked, compare, emulate, emulate_operands, implementations, judge,
                     run_implementation, sequential, verdicts_json, write_verdicts)
from .problem import Problem, default_input_options, make_inputs, problem_from_dict, round_to, validate_inputs
from .space import CaseSpace, draw_case, sample_case
from .casefile import CaseFile, judge_case_file, read_case_file, write_case_file
from .fuzzing import CheckResult, FuzzSummary, check, fuzz, replay
from .backward import (BackwardKernel, autograd_kernel, backward_tensors, check_backward, chunked_backward,
                       emulate_backward, fuzz_backward, judge_backward, load_backward_case, make_backward_inputs,
                       replay_backward, sequential_backward)

__version__ = "0.1.0"

__all__ = [
    "BackwardKernel", "autograd_kernel", "backward_tensors", "check_backward", "chunked_backward",
    "emulate_backward", "fuzz_backward", "judge_backward", "load_backward_case", "make_backward_inputs",
    "replay_backward", "sequential_backward",
    "OPERANDS_SINGLE", "OPERANDS_SINGLE_QK", "QUALITY_BUDGET", "Design",
    "CaseFile", "CaseSpace", "CheckResult", "FuzzSummary", "Kernel", "Problem", "ProblemError", "Unsupported",
    "Verdict", "as_numpy", "budget_describe", "check", "chunked", "compare", "default_input_options", "draw_case",
    "emulate", "emulate_operands", "from_torch", "fuzz", "implementations", "judge", "judge_case_file", "kernel",
    "make_inputs", "problem_from_dict", "read_case_file", "replay", "round_to", "run_implementation", "sample_case",
    "sequential", "to_torch", "torch_inputs", "validate_inputs", "verdicts_json", "write_case_file",
    "write_verdicts",
]
