"""Adapters: other libraries' gated-delta-rule kernels as gdn_testbed Kernels, each with its
support matrix (a CaseSpace) declared beside it (docs/python.md, "Adapters").

    from gdn_testbed.adapters import fla
    gdn_testbed.check(fla.chunk(backend="triton"), cases=200).assert_pass()   # fla.SPACE_CHUNK

Each module imports its library only when a kernel runs (or versions() is asked), so importing
an adapter never fails; `available()` says whether the library (and a GPU, where needed) is here.
Modules: fla, flash_qla, flashinfer, transformers, vllm.
"""
from __future__ import annotations

import importlib.util


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def cuda_available() -> bool:
    if not has_module("torch"):
        return False
    import torch
    return torch.cuda.is_available()


def package_versions(*names: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for name in ("torch", *names):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def reasons(*checks) -> "str | None":
    """The first reason of (condition, reason) pairs whose condition holds, else None."""
    for condition, reason in checks:
        if condition:
            return reason
    return None
