"""The gated delta rule written out in torch, float64, token by token: the example to copy when
adapting another library (see gdn_adapter.py for the interface), and the implementation that
tests the adapter's plumbing on a machine without a GPU.

It follows docs/semantics.md literally and supports every problem a case file can hold
(GVA, l2norm, h0/hT, both state layouts, fused gates, state caches with -1 padding,
intermediate states). Being slow (a Python loop over tokens), it suits small cases only.
Outputs are rounded to what a kernel stores: o in the input dtype, states in fp32.
"""
from __future__ import annotations

import math

import torch

NAME = "naive.torch_f64"
FORMULATION = "sequential"
CHUNK_SIZE = 64

DTYPES = {"f64": torch.float64, "f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def versions() -> dict[str, str]:
    return {"torch": torch.__version__}


def _gates(problem: dict, tensors: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) as [T, HV] float64: given directly, or through the fused gates of spec section 3."""
    if problem["gate_mode"] == "direct":
        return tensors["g"].double(), tensors["beta"].double()
    a, b = tensors["a"].double(), tensors["b"].double()
    A_log, dt_bias = tensors["A_log"].double(), tensors["dt_bias"].double()
    # torch's softplus returns x itself above its threshold, the spec's "= x for x > 20".
    g = -torch.exp(A_log)[None, :] * torch.nn.functional.softplus(a + dt_bias[None, :], beta=1.0, threshold=20.0)
    beta = torch.sigmoid(b) * (2.0 if problem["allow_negative_eigenvalues"] else 1.0)
    return g, beta


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def run(problem: dict, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    T, H, HV, K, V = problem["T"], problem["H"], problem["HV"], problem["K"], problem["V"]
    device = tensors["q"].device
    cu = [int(x) for x in problem["cu_seqlens"]]
    N = len(cu) - 1
    v_major = problem["state_layout"] == "v_major"
    scale = problem["scale"] if problem["scale"] is not None else 1.0 / math.sqrt(K)

    q, k, v = tensors["q"].double(), tensors["k"].double(), tensors["v"].double()
    if problem["use_qk_l2norm"]:
        q, k = _l2norm(q), _l2norm(k)
    g, beta = _gates(problem, tensors)
    group = HV // H

    def to_k_major(state: torch.Tensor) -> torch.Tensor:  # [..., K, V]
        return state.transpose(-1, -2) if v_major else state

    cache = problem["state_slots"] > 0
    rows = problem["state_slots"] if cache else N
    if "h0" in tensors:
        states = to_k_major(tensors["h0"].double()).clone()  # [rows, HV, K, V]
    else:
        states = torch.zeros(rows, HV, K, V, dtype=torch.float64, device=device)
    indices = tensors["state_indices"].tolist() if cache else list(range(N))

    o = torch.zeros(T, HV, V, dtype=torch.float64, device=device)
    intermediate = (torch.zeros(T, HV, K, V, dtype=torch.float64, device=device)
                    if problem["store_intermediate_states"] else None)
    heads = torch.arange(HV, device=device) // group  # value head j reads q/k head j // (HV/H)
    for n in range(N):
        row = indices[n]
        if row < 0:  # padding sequence: reads and writes nothing, outputs stay zero
            continue
        S = states[row].clone()  # [HV, K, V]
        for t in range(cu[n], cu[n + 1]):
            qt, kt = q[t, heads] * scale, k[t, heads]           # [HV, K]
            S = torch.exp(g[t])[:, None, None] * S               # 1. decay first
            u = beta[t][:, None] * (v[t] - torch.einsum("jkv,jk->jv", S, kt))  # 2. delta
            S = S + kt[:, :, None] * u[:, None, :]               # 3. rank-one write
            o[t] = torch.einsum("jkv,jk->jv", S, qt)             # 4. read after the write
            if intermediate is not None:
                intermediate[t] = S
        states[row] = S

    outputs = {"o": o.to(DTYPES[problem["input_dtype"]])}
    if problem["has_hT"]:
        hT = states if cache else states[:N]
        outputs["hT"] = (hT.transpose(-1, -2) if v_major else hT).to(torch.float32).contiguous()
    if intermediate is not None:
        outputs["intermediate"] = (intermediate.transpose(-1, -2) if v_major else intermediate).to(
            torch.float32).contiguous()
    return outputs
