"""transformers' torch reference functions of Qwen3-Next
(transformers.models.qwen3_next.modeling_qwen3_next): torch_chunk_gated_delta_rule (the chunked
form Megatron-Core copies for its deterministic mode) and torch_recurrent_gated_delta_rule.

Signatures: torch_chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64,
initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False) and
torch_recurrent_gated_delta_rule(query, key, value, g, beta, initial_state, output_final_state,
use_qk_l2norm_in_kernel=False); tensors [B, T, heads, D], everything cast to fp32 inside, o
returned in the query's dtype, the final state [B, heads, K, V] fp32.

How the conventions map:
- No cu_seqlens: each sequence is one call with B = 1 (what the model does per request).
- One head count: the model repeats q and k to the value heads (repeat_interleave over the
  head axis, value head j reads q/k head j // (HV / H): the spec's GVA); the adapter does the same.
- scale is fixed at 1/sqrt(K) inside: the space pins the default scale (explicit_scale off).
- l2norm: use_qk_l2norm_in_kernel, x * rsqrt(sum x^2 + 1e-6), the spec's formula.
- Gates: g in log space and beta, direct; the fused projections live in the module, not here.
- States K-major; an empty sequence is never passed (the chunk function cannot reshape it).
Not expressible (SKIPPED by supports): fused gates, explicit scales, V-major states, state
caches, per-token states, empty sequences.
"""
from __future__ import annotations

from ..kernel import Kernel
from ..space import CaseSpace
from . import has_module, package_versions, reasons

SPACE_CHUNK = CaseSpace("chunked", fused_gates="off", explicit_scale="off", v_major="off", state_cache="off",
                        intermediate_states="off", min_length=1, max_work=1.0e6)
SPACE_RECURRENT = SPACE_CHUNK.replace(max_work=3.0e5)


def available() -> "str | None":
    return reasons((not has_module("transformers"), "transformers is not installed"),
                   (not has_module("torch"), "torch is not installed"))


def versions() -> dict:
    return package_versions("transformers")


def supports(problem):
    return reasons(
        (problem.gate_mode == "fused", "fused gates are computed by the module, not by these functions"),
        (problem.scale is not None, "the scale is fixed at 1/sqrt(K) inside these functions"),
        (problem.state_layout != "k_major", "states are K-major [B, heads, K, V]"),
        (problem.uses_state_cache, "no state cache: one dense state per call"),
        (problem.store_intermediate_states, "per-token states are not an output"),
        (any(problem.seq_len(n) == 0 for n in range(problem.N)), "an empty sequence is never passed to them"),
    )


def _run(function_name: str, problem, x, chunk_size: int):
    import torch
    from transformers.models.qwen3_next import modeling_qwen3_next as modeling
    function = getattr(modeling, function_name)
    group = problem.group_size
    cu = x["cu_seqlens"].tolist()
    outputs, states = [], []
    for n in range(problem.N):
        s, e = cu[n], cu[n + 1]
        q, k = (x[name][s:e].repeat_interleave(group, dim=1).unsqueeze(0) for name in ("q", "k"))
        v, g, beta = (x[name][s:e].unsqueeze(0) for name in ("v", "g", "beta"))
        h0 = x["h0"][n:n + 1] if problem.has_h0 else None
        kwargs = dict(initial_state=h0, output_final_state=bool(problem.has_hT),
                      use_qk_l2norm_in_kernel=bool(problem.use_qk_l2norm))
        if function_name == "torch_chunk_gated_delta_rule":
            kwargs["chunk_size"] = chunk_size
        o, state = function(q, k, v, g, beta, **kwargs)
        outputs.append(o.squeeze(0))
        states.append(state)
    o = torch.cat(outputs, 0) if outputs else x["v"].new_zeros(0, problem.HV, problem.V)
    out = {"o": o}
    if problem.has_hT:
        out["hT"] = torch.cat(states, 0)
    return out


def chunk(chunk_size: int = 64, device="cpu") -> Kernel:
    return Kernel(lambda p, x: _run("torch_chunk_gated_delta_rule", p, x, chunk_size),
                  name="transformers.qwen3_next.torch_chunk_gated_delta_rule", formulation="chunked",
                  chunk_size=chunk_size, arrays="torch", device=device, supports=supports, space=SPACE_CHUNK,
                  replay="gdn_testbed.adapters.transformers:CHUNK" if chunk_size == 64 else None)


def recurrent(device="cpu") -> Kernel:
    return Kernel(lambda p, x: _run("torch_recurrent_gated_delta_rule", p, x, 0),
                  name="transformers.qwen3_next.torch_recurrent_gated_delta_rule", formulation="sequential",
                  arrays="torch", device=device, supports=supports, space=SPACE_RECURRENT,
                  replay="gdn_testbed.adapters.transformers:RECURRENT")


CHUNK = chunk()
RECURRENT = recurrent()
