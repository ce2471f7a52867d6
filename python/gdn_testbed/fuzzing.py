"""Fuzzing a kernel in-process: the C++ campaign (cli/campaign.hpp) with the kernel called back.

``fuzz`` runs gdn-testbed's own fuzz loop: cases drawn from the CaseSpace by the C++ generator,
the kernel run on each (through a gdn::Implementation whose run() calls the Python kernel), each
judged by the oracle, every failure shrunk by the C++ shrinker and saved as a case file (as
generated and shrunk, with the failing outputs) with its replay command, a results file
(gdn-fuzz-results/1) written at the end, progress on stderr. Ctrl-C finishes the case in hand,
keeps the failures saved so far and returns the summary; a second Ctrl-C exits at once.
``check`` is fuzz for a test suite: it stops at the first failure and ``assert_pass`` raises
with the shrunk case, the worst check, its margin and the replay command.
"""
from __future__ import annotations

import os
import shlex
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Optional

from . import _core
from .kernel import Kernel, as_kernel
from .space import CaseSpace, _space_text


@dataclass
class Failure:
    implementation: str
    case_index: int
    case_seed: int
    original_problem: str
    shrunk_problem: str
    file: str            # the shrunk case file (inputs and the failing outputs)
    original_file: str   # the case as generated
    replay: str          # the command that reruns it
    verdict: "_core.Verdict"           # on the shrunk case
    original_verdict: "_core.Verdict"  # on the case as generated
    shrink_steps: list = field(default_factory=list)

    def describe(self) -> str:
        return describe_failure(self)


def _number(x) -> str:
    """3 significant digits; a non-finite value as the verdict JSON writes it (text) stays text."""
    return f"{x:.3g}" if isinstance(x, (int, float)) else str(x)


def describe_failure(f) -> str:
    """A saved failure of fuzz or fuzz_backward, as check() and check_backward() print it."""
    lines = [f"{f.verdict.status} {f.implementation} on case {f.case_index} (seed {f.case_seed})",
             f"  shrunk case:  {f.shrunk_problem}",
             f"  as generated: {f.original_problem}"]
    worst = f.verdict.worst_check
    if worst is not None:
        lines.append(f"  worst check:  {worst['tensor']} {worst['metric']} = {_number(worst['error'])}, budget "
                     f"{_number(worst['budget'])}, margin {_number(worst['margin'])} ({worst['basis']})")
    if f.verdict.message:
        lines.append(f"  message:      {f.verdict.message.strip()[:2000]}")
    lines.append(f"  case file:    {f.file}")
    lines.append(f"  replay:       {f.replay}")
    return "\n".join(lines)


@dataclass
class FuzzSummary:
    implementation: str
    cases: int
    passed: int
    failed: int
    errors: int
    skipped: int
    worst_margin: float
    worst_case: str
    seconds: float
    stop_reason: str
    interrupted: bool
    failures: list
    failures_total: int
    out: str
    results_file: str
    results: dict  # the gdn-fuzz-results/1 object

    @property
    def judged(self) -> int:
        return self.passed + self.failed + self.errors

    @property
    def ok(self) -> bool:
        """No failure and at least one case judged: all SKIPPED proves nothing."""
        return self.failures_total == 0 and self.judged > 0

    def describe(self) -> str:
        text = (f"{self.implementation}: {self.cases} cases in {self.seconds:.1f} s ({self.stop_reason}): "
                f"{self.passed} pass, {self.failed} fail, {self.errors} error, {self.skipped} skipped; "
                f"worst margin {self.worst_margin:.3g}")
        return text

    def __str__(self) -> str:
        parts = [self.describe()]
        parts += [f.describe() for f in self.failures]
        parts.append(f"results: {self.results_file}")
        return "\n".join(parts)


class CheckResult(FuzzSummary):
    def assert_pass(self) -> "CheckResult":
        """Raises AssertionError unless every judged case passed and at least one was judged."""
        if self.ok:
            return self
        if self.judged == 0:
            raise AssertionError(
                f"gdn_testbed.check: no case was judged ({self.skipped} SKIPPED of {self.cases}): the space and the "
                f"kernel's supports() do not overlap, so nothing was verified.\n{self.describe()}")
        lines = [f"gdn_testbed.check: {self.failures_total} failing case(s) for {self.implementation}",
                 self.describe()]
        lines += [f.describe() for f in self.failures[:3]]
        if self.failures_total > len(self.failures):
            lines.append(f"({self.failures_total - len(self.failures)} more not saved)")
        lines.append(f"results: {self.results_file}")
        raise AssertionError("\n".join(lines))


def _command_line() -> str:
    return " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable), *sys.argv])


def _replay_binary(k) -> str:
    """The command before ` replay FILE` in the saved replay commands."""
    python = "python3"
    if isinstance(k, str):
        return f"{python} -m gdn_testbed --kernel {shlex.quote(k)}"
    if k.replay:
        text = f"{python} -m gdn_testbed --kernel {shlex.quote(k.replay)}"
        if k.arrays == "torch":
            text += " --arrays torch"
        return text
    # Not importable by name (a lambda, a local function): replay judges the stored outputs.
    return f"{python} -m gdn_testbed"


def fuzz(kernel, space: Optional[CaseSpace] = None, *, seconds: float = 0, cases: int = 0, seed: int = 1,
         out: Optional[str] = None, budget: Optional[str] = None, shrink: bool = True, max_failures: int = 10,
         stop_at_first: bool = False, progress: bool = True, shrink_evaluations: int = 400,
         shrink_seconds: float = 20.0, _summary_class=FuzzSummary) -> FuzzSummary:
    """Fuzzes `kernel` (a Kernel, a callable, or a registered C++ implementation's name) on cases
    from `space` (default: the kernel's declared space, else CaseSpace()) until `seconds` or
    `cases` (at least one is required). Failures are shrunk and saved under `out` (default
    gdn-fuzz-out) as case files; `out`/results.json holds the summary. budget: the oracle's
    budget text (default: the kernel's, else "calibrated")."""
    k = as_kernel(kernel)
    if not (seconds and seconds > 0) and not (cases and cases > 0):
        raise ValueError("fuzz needs a limit: seconds > 0 or cases > 0")
    if space is None and isinstance(k, Kernel) and k.space is not None:
        space = k.space
    if budget is None and isinstance(k, Kernel):
        budget = k.budget
    out = os.fspath(out) if out is not None else "gdn-fuzz-out"
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"out: {out} exists and is not a folder")
    if os.path.realpath(out) == "/":
        raise ValueError("out: refusing the root folder '/'")
    os.makedirs(out, exist_ok=True)
    results_file = os.path.join(out, "results.json")
    options = {
        "seed": int(seed), "seconds": float(seconds or 0), "cases": int(cases or 0), "out": out,
        "budget": budget or "", "shrink": bool(shrink), "max_failures": int(max_failures),
        "stop_at_first": bool(stop_at_first), "progress": bool(progress), "space": _space_text(space),
        "command": _command_line(), "binary": _replay_binary(k), "shrink_evaluations": int(shrink_evaluations),
        "shrink_seconds": float(shrink_seconds), "results": results_file,
    }
    raw = _core.run_fuzz(k, options)
    results = raw["json"]
    failures = []
    for f, verdict, original in zip(results["failures"], raw["verdicts"], raw["original_verdicts"]):
        failures.append(Failure(f["implementation"], f["case_index"], int(f["case_seed"]), f["original_problem"],
                                f["shrunk_problem"], f["file"], f["original_file"], f["replay"], verdict, original,
                                list(f["shrink_steps"])))
    name = k if isinstance(k, str) else k.name
    tally = results["tallies"].get(name, {"pass": 0, "fail": 0, "error": 0, "skipped": 0, "worst_margin": 0.0,
                                          "worst_case": ""})
    margin = tally["worst_margin"]
    return _summary_class(
        implementation=name, cases=results["cases"], passed=tally["pass"], failed=tally["fail"],
        errors=tally["error"], skipped=tally["skipped"],
        worst_margin=float(margin),
        worst_case=tally["worst_case"], seconds=results["seconds"], stop_reason=results["stop_reason"],
        interrupted=results["interrupted"], failures=failures, failures_total=results["failures_total"], out=out,
        results_file=results_file, results=results)


def check(kernel, space: Optional[CaseSpace] = None, *, cases: int = 200, seconds: float = 0, seed: int = 1,
          out: Optional[str] = None, budget: Optional[str] = None, progress: bool = False,
          **options) -> CheckResult:
    """fuzz for a test: stops at the first failure (shrunk and saved); `.assert_pass()` raises
    with a readable report. out defaults to a new temporary folder (named in the report)."""
    if out is None:
        out = tempfile.mkdtemp(prefix="gdn-check-")
    options.setdefault("stop_at_first", True)
    options.setdefault("max_failures", 1)
    return fuzz(kernel, space, seconds=seconds, cases=cases, seed=seed, out=out, budget=budget, progress=progress,
                _summary_class=CheckResult, **options)


def replay(kernel, path, budget: Optional[str] = None) -> "_core.Verdict":
    """Reruns `kernel` on a case file's inputs and judges it with the formulation, chunk size and
    budget the file records (budget overrides). kernel=None judges the outputs stored in the file."""
    from .casefile import read_case_file
    from .oracle import judge
    if kernel is None:
        from .casefile import judge_case_file
        return judge_case_file(path, budget)
    c = read_case_file(path)
    k = as_kernel(kernel)
    if isinstance(k, str):
        from .oracle import run_implementation
        outputs = run_implementation(k, c.problem, c.inputs)
        name, formulation, chunk_size = k, c.settings.get("formulation", "chunked"), c.settings.get("chunk_size", 64)
    else:
        reason = k._gdn_supports(c.problem)
        if reason is not None:
            raise ValueError(f"{path}: {k.name} does not support this problem: {reason}")
        outputs = k._gdn_run(c.problem, c.inputs)
        name, formulation, chunk_size = k.name, k.formulation, k.chunk_size
    return judge(c.problem, c.inputs, outputs, formulation=formulation, chunk_size=chunk_size,
                 budget=budget or c.settings.get("budget") or (None if isinstance(k, str) else k.budget)
                 or "calibrated", case_name=os.fspath(path), implementation=name)
