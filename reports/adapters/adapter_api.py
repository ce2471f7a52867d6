"""What the adapter driver (gdn_adapter.py) and the implementations share: the Unsupported
exception and helpers on the case file's `gdn.problem` object that mirror core/problem.hpp.

An implementation copied into another library does not need this module: the driver treats
any exception whose class is named `Unsupported` as "skip this case, with this reason".
"""
from __future__ import annotations

import math


class Unsupported(Exception):
    """Raised by an implementation's run() for a problem it does not support (the reason)."""


PROBLEM_KEYS = ("cu_seqlens", "T", "H", "HV", "K", "V", "scale", "use_qk_l2norm", "has_h0", "has_hT",
                "state_layout", "state_slots", "store_intermediate_states", "input_dtype", "gate_dtype",
                "gate_mode", "allow_negative_eigenvalues")


def num_sequences(problem: dict) -> int:
    return len(problem["cu_seqlens"]) - 1


def state_shape(problem: dict) -> list[int]:
    rows = problem["state_slots"] if problem["state_slots"] > 0 else num_sequences(problem)
    if problem["state_layout"] == "k_major":
        return [rows, problem["HV"], problem["K"], problem["V"]]
    return [rows, problem["HV"], problem["V"], problem["K"]]


def intermediate_shape(problem: dict) -> list[int]:
    if problem["state_layout"] == "k_major":
        return [problem["T"], problem["HV"], problem["K"], problem["V"]]
    return [problem["T"], problem["HV"], problem["V"], problem["K"]]


def effective_scale(problem: dict) -> float:
    return problem["scale"] if problem["scale"] is not None else 1.0 / math.sqrt(problem["K"])


def describe(problem: dict) -> str:
    """The same one-line text as gdn::Problem::describe(), so verdicts and logs read alike."""
    parts = [f"N={num_sequences(problem)}", f"T={problem['T']}", f"H={problem['H']}", f"HV={problem['HV']}",
             f"K={problem['K']}", f"V={problem['V']}", f"dtype={problem['input_dtype']}",
             f"gate={problem['gate_dtype']}"]
    if problem["gate_mode"] == "fused":
        parts.append("fused")
    for key, word in (("allow_negative_eigenvalues", "negeig"), ("use_qk_l2norm", "l2norm"),
                      ("has_h0", "h0"), ("has_hT", "hT")):
        if problem[key]:
            parts.append(word)
    if problem["state_layout"] == "v_major":
        parts.append("v_major")
    if problem["state_slots"] > 0:
        parts.append(f"slots={problem['state_slots']}")
    if problem["store_intermediate_states"]:
        parts.append("intermediate")
    if problem["scale"] is not None:
        parts.append(f"scale={problem['scale']:g}")
    return " ".join(parts)


def expected_outputs(problem: dict) -> dict[str, list[int]]:
    shapes = {"o": [problem["T"], problem["HV"], problem["V"]]}
    if problem["has_hT"]:
        shapes["hT"] = state_shape(problem)
    if problem["store_intermediate_states"]:
        shapes["intermediate"] = intermediate_shape(problem)
    return shapes
