"""vLLM's GDN ops (vllm.model_executor.layers.fla.ops, vLLM's copy of fla's kernels):
chunk_gated_delta_rule (prefill) and fused_recurrent_gated_delta_rule (decode against the
state pool, with slot indices).

Signatures read from vLLM's source: chunk_gated_delta_rule(q, k, v, g, beta, scale,
initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel) with fla's conventions
([1, T, ...] with cu_seqlens, states [N, HV, K, V] fp32); fused_recurrent_gated_delta_rule(q, k,
v, g, beta, scale, initial_state, inplace_final_state=True, cu_seqlens, ssm_state_indices,
num_accepted_tokens, use_qk_l2norm_in_kernel), where initial_state is the whole state pool
[slots, HV, K, V], updated in place at ssm_state_indices (one slot per sequence).

How the conventions map: direct gates only (vLLM computes g and beta from the fused
projections in a separate kernel); K-major states; the pool is the spec's state cache and is
returned whole as hT. Padding slots (-1) are left out of the space: vLLM leaves their output
rows unwritten (its callers ignore them), where the spec defines zeros. Speculative-decode
acceptance counts (num_accepted_tokens) have no counterpart in the Problem yet: not exercised.
Everything else is SKIPPED by supports.

Precision design: the chunk function is fla's chunk kernels, so it declares fla's design
(fla.CHUNK_DESIGN, budget OPERANDS_SINGLE: docs/python.md, "Precision designs"); the recurrent
function keeps its state in fp32 and is judged by the default budget.
"""
from __future__ import annotations

from ..kernel import OPERANDS_SINGLE, Kernel
from ..space import CaseSpace
from . import cuda_available, has_module, package_versions, reasons
from .fla import CHUNK_DESIGN

SPACE_CHUNK = CaseSpace("chunked", input_dtypes=["bf16", "f16"], fused_gates="off", v_major="off", state_cache="off",
                        intermediate_states="off", max_K=256, max_V=256)
SPACE_RECURRENT = CaseSpace("decode", input_dtypes=["bf16", "f16"], fused_gates="off", v_major="off",
                            state_cache="always", padding="off", initial_state="always", final_state="always",
                            intermediate_states="off", max_K=256, max_V=256)


def available() -> "str | None":
    return reasons((not has_module("vllm"), "vllm is not installed"), (not cuda_available(), "no CUDA device"))


def versions() -> dict:
    return package_versions("vllm", "triton")


def _common(problem):
    return reasons(
        (problem.input_dtype not in ("bf16", "f16", "f32"), "vLLM's kernels take fp32, bf16 and fp16"),
        (problem.gate_mode == "fused", "vLLM's GDN ops take g and beta (the gating runs in its own kernel)"),
        (problem.state_layout != "k_major", "vLLM's fla states are K-major"),
        (problem.store_intermediate_states, "per-token states are not an output of these ops"),
    )


def supports_chunk(problem):
    return _common(problem) or reasons((problem.uses_state_cache, "the chunk op takes dense per-sequence states"))


def supports_recurrent(problem):
    return _common(problem) or reasons(
        (not problem.uses_state_cache, "the recurrent op updates a state pool at slot indices"),
        (not (problem.has_h0 and problem.has_hT), "the pool is read and updated in place: has_h0 and has_hT"))


def chunk(device=None) -> Kernel:
    def run(problem, x):
        import torch
        from vllm.model_executor.layers.fla.ops import chunk_gated_delta_rule
        o, final_state = chunk_gated_delta_rule(
            q=x["q"].unsqueeze(0), k=x["k"].unsqueeze(0), v=x["v"].unsqueeze(0), g=x["g"].unsqueeze(0),
            beta=x["beta"].unsqueeze(0), scale=problem.effective_scale,
            initial_state=x.get("h0") if problem.has_h0 else None, output_final_state=bool(problem.has_hT),
            cu_seqlens=x["cu_seqlens"].to(torch.long), use_qk_l2norm_in_kernel=bool(problem.use_qk_l2norm))
        out = {"o": o.squeeze(0)}
        if problem.has_hT:
            out["hT"] = final_state
        return out

    return Kernel(run, name="vllm.fla.chunk_gated_delta_rule", formulation="chunked", chunk_size=64, arrays="torch",
                  device=device, supports=supports_chunk, space=SPACE_CHUNK, budget=OPERANDS_SINGLE,
                  design=CHUNK_DESIGN, replay="gdn_testbed.adapters.vllm:CHUNK")


def recurrent(device=None) -> Kernel:
    def run(problem, x):
        import torch
        from vllm.model_executor.layers.fla.ops import fused_recurrent_gated_delta_rule
        pool = x["h0"].contiguous()
        o, _ = fused_recurrent_gated_delta_rule(
            q=x["q"].unsqueeze(0), k=x["k"].unsqueeze(0), v=x["v"].unsqueeze(0), g=x["g"].unsqueeze(0),
            beta=x["beta"].unsqueeze(0), scale=problem.effective_scale, initial_state=pool, inplace_final_state=True,
            cu_seqlens=x["cu_seqlens"].to(torch.long), ssm_state_indices=x["state_indices"].to(torch.int32),
            use_qk_l2norm_in_kernel=bool(problem.use_qk_l2norm))
        return {"o": o.squeeze(0), "hT": pool}

    return Kernel(run, name="vllm.fla.fused_recurrent_gated_delta_rule", formulation="sequential", arrays="torch",
                  device=device, supports=supports_recurrent, space=SPACE_RECURRENT,
                  replay="gdn_testbed.adapters.vllm:RECURRENT")


CHUNK = chunk()
RECURRENT = recurrent()
