"""Case files (oracle/case_file.hpp, docs/case_files.md): one problem, its inputs, optionally an
implementation's outputs, and metadata, in a safetensors container, read and written by the C++
code (the same checks as gdn-testbed's). gdn-case/2 files also hold the backward's inputs
(``in.dO``, ``in.dhT``) and the gradients of a backward under test (``out.dq`` ... ``out.dh0``)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from . import _core
from .arrays import as_numpy, as_numpy_inputs, as_numpy_outputs


@dataclass
class CaseFile:
    problem: "_core.Problem"
    inputs: dict
    outputs: Optional[dict] = None
    metadata: dict = field(default_factory=dict)
    # How the file says it is judged: formulation, chunk_size, budget (None: the default).
    settings: dict = field(default_factory=dict)
    # The backward's inputs {"dO", "dhT" (None when absent: zero)}, or None (gdn-case/1 files).
    backward: Optional[dict] = None
    # The gradients a backward wrote {"dq", "dk", ...: exactly those the problem has}, or None.
    gradients: Optional[dict] = None


def read_case_file(path, max_bytes: int = 0, max_work: int = 0) -> CaseFile:
    """Reads and checks a case file (ValueError naming the file and the rule). max_bytes and
    max_work raise the size limits (0: the defaults, docs/case_files.md)."""
    d = _core.read_case_file(os.fspath(path), int(max_bytes), int(max_work))
    return CaseFile(d["problem"], d["inputs"], d["outputs"], dict(d["metadata"]), dict(d["settings"]),
                    d["backward"], d["gradients"])


def _arrays(d: Optional[dict]) -> Optional[dict]:
    return None if d is None else {str(k): (None if v is None else as_numpy(v)) for k, v in d.items()}


def write_case_file(path, problem, inputs: dict, outputs: Optional[dict] = None,
                    metadata: Optional[dict] = None, backward: Optional[dict] = None,
                    gradients: Optional[dict] = None) -> None:
    """Writes a case file atomically; inputs must be exactly representable in their dtypes,
    outputs are stored losslessly. metadata: str -> str (gdn.format and gdn.problem are set).
    backward: {"dO", "dhT" (optional)}, dO exactly representable in the input dtype, dhT in
    float32; gradients: {"dq", "dk", ...} (every gradient the problem has, stored losslessly),
    only with backward. With either the file is gdn-case/2; the reader's rules apply (dhT only
    when the problem has hT; no state cache or per-token states)."""
    _core.write_case_file(os.fspath(path), problem, as_numpy_inputs(inputs),
                          None if outputs is None else as_numpy_outputs(outputs),
                          {str(k): str(v) for k, v in (metadata or {}).items()},
                          _arrays(backward), _arrays(gradients))


def judge_case_file(path, budget: Optional[str] = None) -> "_core.Verdict":
    """What `gdn-testbed verify FILE` does for one file: judges the outputs and the gradients it
    holds, one verdict (never raises: an unreadable file is an ERROR verdict)."""
    return _core.judge_case_file(os.fspath(path), budget or "")
