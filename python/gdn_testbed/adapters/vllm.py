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
returned whole as hT, in float32 or bfloat16 (vLLM's mamba_ssm_cache_dtype; the Problem's
state_dtype: the pool is handed over in it, and the kernel stores b_h.to(pool dtype)). Padding
slots (-1) are left out of the space: vLLM leaves their output rows unwritten (its callers
ignore them), where the spec defines zeros. Everything else is SKIPPED by supports.

Speculative decoding (SPEC_DECODE): with a 2-D ssm_state_indices [N, Ts] and
num_accepted_tokens [N], sequence n starts from pool slot ssm_state_indices[n, a_n - 1] (a_n =
num_accepted_tokens[n]: the state after the last token accepted in the previous step) and writes
its state after token t to slot ssm_state_indices[n, t], for every t (vLLM's kernel,
IS_SPEC_DECODING with INPLACE_FINAL_STATE). That is the existing Problem, no new field: a state
cache read at state_indices[n] (has_h0, no write-back: has_hT off) with per-token states
(store_intermediate_states), the slot table being where the kernel scatters them. The adapter
builds the table: column a_n - 1 is the case's read slot state_indices[n], every other column a
scratch slot of its own appended to the pool and filled with NaN (a kernel reading the wrong
column outputs NaN and fails), and a_n = 1 + (3 n + 1) mod Ts, deterministic so a saved case
replays with the same table; it returns pool[table[n, t]] as the per-token states. The
acceptance count only selects where the start state lies: the operator is the same for every
a_n (docs/python.md, "How each library's convention maps").

Precision design: the chunk function is fla's chunk kernels, so it declares fla's design
(fla.CHUNK_PRECISION, budget OPERANDS_SINGLE_QK: vLLM's copy normalises q, k with its copy of
fla's l2norm_fwd, stored in the input dtype; docs/python.md, "Precision designs"); the recurrent
function keeps its running state in fp32 and is judged by the default budget (the state dtype's
storage rounding is part of the oracle's model, docs/budgets.md).
"""
from __future__ import annotations

from ..kernel import Kernel
from ..space import CaseSpace
from . import cuda_available, has_module, package_versions, reasons
from .fla import CHUNK_PRECISION

SPACE_CHUNK = CaseSpace("chunked", input_dtypes=["bf16", "f16"], fused_gates="off", v_major="off", state_cache="off",
                        intermediate_states="off", max_K=256, max_V=256)
SPACE_RECURRENT = CaseSpace("decode", input_dtypes=["bf16", "f16"], fused_gates="off", v_major="off",
                            state_cache="always", padding="off", initial_state="always", final_state="always",
                            intermediate_states="off", max_K=256, max_V=256, state_dtypes=["f32", "bf16"])
SPACE_SPEC_DECODE = CaseSpace("decode", input_dtypes=["bf16", "f16"], fused_gates="off", v_major="off",
                              state_cache="always", padding="off", initial_state="always", final_state="off",
                              intermediate_states="always", max_K=256, max_V=256, state_dtypes=["f32", "bf16"])


def available() -> "str | None":
    return reasons((not has_module("vllm"), "vllm is not installed"), (not cuda_available(), "no CUDA device"))


def versions() -> dict:
    return package_versions("vllm", "triton")


def _gates_and_layout(problem):
    return reasons(
        (problem.input_dtype not in ("bf16", "f16", "f32"), "vLLM's kernels take fp32, bf16 and fp16"),
        (problem.gate_mode == "fused", "vLLM's GDN ops take g and beta (the gating runs in its own kernel)"),
        (problem.gate_space != "log", "vLLM's GDN ops take log-space g"),
        (problem.state_layout != "k_major", "vLLM's fla states are K-major"),
    )


def _common(problem):
    return _gates_and_layout(problem) or reasons(
        (problem.store_intermediate_states, "per-token states are an output of the speculative-decode call only "
                                            "(SPEC_DECODE)"))


def supports_chunk(problem):
    return _common(problem) or reasons(
        (problem.uses_state_cache, "the chunk op takes dense per-sequence states"),
        (problem.state_dtype != "f32", "the chunk op's states are float32"))


def supports_recurrent(problem):
    return _common(problem) or reasons(
        (not problem.uses_state_cache, "the recurrent op updates a state pool at slot indices"),
        (problem.state_dtype not in ("f32", "bf16"), "vLLM's state pools are float32 or bfloat16"),
        (not (problem.has_h0 and problem.has_hT), "the pool is read and updated in place: has_h0 and has_hT"))


def supports_spec_decode(problem):
    lengths = {problem.seq_len(n) for n in range(problem.N)}
    return _gates_and_layout(problem) or reasons(
        (not problem.uses_state_cache, "speculative decoding reads a state pool at slot indices"),
        (problem.state_dtype not in ("f32", "bf16"), "vLLM's state pools are float32 or bfloat16"),
        (not problem.has_h0 or problem.has_hT,
         "a speculative step reads its slot (has_h0) and writes per-token states, not a final state (has_hT off)"),
        (not problem.store_intermediate_states, "a speculative step writes every token's state"),
        (len(lengths) != 1 or 0 in lengths, "one draft length Ts >= 1 for every request (a [N, Ts] slot table)"),
    )


def accepted_tokens(problem):
    """num_accepted_tokens of each request, 1..Ts: deterministic in the problem (a replay builds
    the same slot table)."""
    Ts = problem.seq_len(0) if problem.N else 1
    return [1 + (3 * n + 1) % Ts for n in range(problem.N)]


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
                  device=device, supports=supports_chunk, space=SPACE_CHUNK,
                  design=CHUNK_PRECISION, replay="gdn_testbed.adapters.vllm:CHUNK")


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


def spec_decode(device=None) -> Kernel:
    def run(problem, x):
        import torch
        from vllm.model_executor.layers.fla.ops import fused_recurrent_gated_delta_rule
        N, Ts = problem.N, problem.seq_len(0)
        cache = x["h0"]
        slots = cache.shape[0]
        read = x["state_indices"].to(torch.int64).cpu().tolist()
        if any(r < 0 for r in read):
            raise RuntimeError("padding rows are outside SPEC_DECODE's space")
        accepted = accepted_tokens(problem)
        # The case's pool plus one NaN-filled scratch slot per (request, draft position).
        scratch = torch.full((N * Ts, *cache.shape[1:]), float("nan"), dtype=cache.dtype, device=cache.device)
        pool = torch.cat([cache, scratch]).contiguous()
        table = torch.empty((N, Ts), dtype=torch.int32)
        for n in range(N):
            for t in range(Ts):
                table[n, t] = read[n] if t == accepted[n] - 1 else slots + n * Ts + t
        table = table.to(cache.device)
        o, _ = fused_recurrent_gated_delta_rule(
            q=x["q"].unsqueeze(0), k=x["k"].unsqueeze(0), v=x["v"].unsqueeze(0), g=x["g"].unsqueeze(0),
            beta=x["beta"].unsqueeze(0), scale=problem.effective_scale, initial_state=pool, inplace_final_state=True,
            cu_seqlens=x["cu_seqlens"].to(torch.long), ssm_state_indices=table,
            num_accepted_tokens=torch.tensor(accepted, dtype=torch.int32, device=cache.device),
            use_qk_l2norm_in_kernel=bool(problem.use_qk_l2norm))
        intermediate = pool[table.to(torch.long).reshape(-1)]  # [N * Ts = T, HV, K, V], token order
        return {"o": o.squeeze(0), "intermediate": intermediate}

    return Kernel(run, name="vllm.fla.fused_recurrent_gated_delta_rule.spec", formulation="sequential",
                  arrays="torch", device=device, supports=supports_spec_decode, space=SPACE_SPEC_DECODE,
                  replay="gdn_testbed.adapters.vllm:SPEC_DECODE")


CHUNK = chunk()
RECURRENT = recurrent()
SPEC_DECODE = spec_decode()
