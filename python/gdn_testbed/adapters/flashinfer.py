"""FlashInfer's GDN kernels (module `flashinfer`): the chunked prefill
(flashinfer.gdn_prefill.chunk_gated_delta_rule) and the single-token decode against a state
pool (flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose).

Conventions and how each maps:
- Packed tensors without a batch axis in prefill: q, k [T, H, D], v [T, HV, D] with one head
  size D (so K = V), cu_seqlens int64 [N+1]; GVA with HV = max(H, HV) gate heads.
- Linear-space gates in prefill: FlashInfer's `g` is the decay alpha = exp(g) itself, float32,
  and beta float32. The Problem states it (gate_space "linear"): the case holds alpha exactly
  representable in float32 and the adapter hands it over unchanged, no conversion (alpha = 0 is
  the hard reset); the references take g = log(alpha) (docs/semantics.md §3). The prefill's
  space pins gate_spaces ["linear"] and fp32 gates (gate_in_input_dtype off).
- V-major states: initial and final states [N, HV, V, K] float32 = the spec's v_major layout; the
  space pins v_major.
- Decode: q, k [B, 1, H, K], v [B, 1, HV, V] (one token per request: every sequence length 1),
  fused gates A_log (float32), a, dt_bias, b as the spec's fused mode (softplus, sigmoid), the
  state pool [pool, HV, V, K] in float32 or bfloat16 (the Problem's state_dtype: the pool is
  handed over in that dtype, and the oracle holds the stored states to one rounding of it,
  docs/budgets.md) with int32 slot indices (initial_state and initial_state_indices; -1 marks a
  padding request, which reads and writes nothing and outputs zeros, as the spec's padding). The
  pool is updated in place and returned whole as hT. Older FlashInfer versions without pool
  indices take a dense state [B, HV, V, K]; the adapter checks the signature. Decode needs
  K, V >= 128 and V % 8 == 0, bf16 or fp16 inputs.
- Not expressible here (SKIPPED by supports): direct gates in decode or fused gates in prefill,
  log-space g in prefill (state it as alpha), K != V in prefill, K-major states, per-token
  states, fp32/fp64 inputs, a non-fp32 state in prefill, an fp16 pool in decode, a cache read but
  not written (has_h0 without has_hT) or written but not read in decode.
The prefill kernels need SM90 or SM100 (head size 128 on SM100): SPACE_PREFILL pins K = V = 128
in bf16, the one shape both take.
"""
from __future__ import annotations

import inspect

from ..kernel import Kernel
from ..space import CaseSpace
from . import cuda_available, has_module, package_versions, reasons

SPACE_PREFILL = CaseSpace("chunked", input_dtypes=["bf16"], K_values=[128], V_values=[128], fused_gates="off",
                          gate_in_input_dtype="off", gate_spaces=["linear"], v_major="always", state_cache="off",
                          intermediate_states="off", min_work=2.0e5, max_work=2.0e7)
SPACE_DECODE = CaseSpace("decode", input_dtypes=["bf16"], K_values=[128], V_values=[128], fused_gates="always",
                         v_major="always", state_cache="always", initial_state="always", final_state="always",
                         intermediate_states="off", negative_eigenvalues="off", min_length=1, max_length=1,
                         length_values=[1], state_dtypes=["f32", "bf16"])


def available() -> "str | None":
    return reasons((not has_module("flashinfer"), "flashinfer is not installed"),
                   (not cuda_available(), "no CUDA device"))


def versions() -> dict:
    return package_versions("flashinfer-python", "nvidia-cutlass-dsl")


def supports_prefill(problem):
    return reasons(
        (problem.input_dtype not in ("bf16", "f16"), "FlashInfer's GDN prefill takes bf16 or fp16 q, k, v"),
        (problem.K != problem.V, "one head size: FlashInfer's prefill needs K = V"),
        (problem.gate_mode == "fused", "prefill takes the decay alpha and beta, not the raw fused-gate projections"),
        (problem.gate_space != "linear", "prefill takes linear-space alpha = exp(g): state the case with gate_space linear"),
        (problem.gate_dtype != "f32", "FlashInfer's prefill takes float32 gates"),
        (problem.state_dtype != "f32", "FlashInfer's prefill takes and returns float32 states"),
        (problem.state_layout != "v_major", "FlashInfer's states are V-major [N, HV, V, K]"),
        (problem.uses_state_cache, "prefill takes one dense initial state per sequence, not a pool"),
        (problem.store_intermediate_states, "per-token states are not an output of the prefill"),
    )


def supports_decode(problem):
    return reasons(
        (problem.input_dtype not in ("bf16", "f16"), "FlashInfer's GDN decode takes bf16 or fp16 q, k, v"),
        (any(problem.seq_len(n) != 1 for n in range(problem.N)), "decode takes exactly one token per request"),
        (problem.gate_mode != "fused", "decode takes the fused-gate projections (A_log, a, dt_bias, b)"),
        (problem.allow_negative_eigenvalues, "decode's beta is sigmoid(b), without the factor 2"),
        (problem.state_dtype not in ("f32", "bf16"), "decode's state pool is float32 or bfloat16"),
        (problem.K < 128 or problem.V < 128 or problem.V % 8, "decode needs K, V >= 128 and V % 8 == 0"),
        (problem.state_layout != "v_major", "FlashInfer's states are V-major [.., HV, V, K]"),
        (not (problem.has_h0 and problem.has_hT), "decode reads and updates the state in place: has_h0 and has_hT"),
        (problem.store_intermediate_states, "per-token states are not an output of this decode"),
    )


def prefill(device=None) -> Kernel:
    def run(problem, x):
        import torch
        from flashinfer.gdn_prefill import chunk_gated_delta_rule
        result = chunk_gated_delta_rule(
            q=x["q"].contiguous(), k=x["k"].contiguous(), v=x["v"].contiguous(), g=x["alpha"].to(torch.float32),
            beta=x["beta"].to(torch.float32), scale=problem.effective_scale,
            initial_state=x["h0"].contiguous() if problem.has_h0 else None, output_final_state=bool(problem.has_hT),
            cu_seqlens=x["cu_seqlens"].to(torch.int64), use_qk_l2norm_in_kernel=bool(problem.use_qk_l2norm))
        if problem.has_hT:
            o, state = result
            return {"o": o, "hT": state}
        return {"o": result}

    return Kernel(run, name="flashinfer.gdn_prefill.chunk_gated_delta_rule", formulation="chunked", chunk_size=64,
                  arrays="torch", device=device, supports=supports_prefill, space=SPACE_PREFILL,
                  replay="gdn_testbed.adapters.flashinfer:PREFILL")


def decode(device=None) -> Kernel:
    def run(problem, x):
        import torch
        from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose as decode_fn
        B = problem.N
        q, k, v = (x[n].unsqueeze(1).contiguous() for n in ("q", "k", "v"))       # [B, 1, heads, D]
        a, b = (x[n].unsqueeze(1).contiguous() for n in ("a", "b"))                # [B, 1, HV]
        kwargs = dict(q=q, k=k, v=v, A_log=x["A_log"], a=a, dt_bias=x["dt_bias"], b=b,
                      scale=problem.effective_scale, use_qk_l2norm=bool(problem.use_qk_l2norm))
        parameters = inspect.signature(decode_fn).parameters
        pool = x["h0"].contiguous()
        if problem.uses_state_cache:
            if "initial_state_indices" not in parameters:
                raise RuntimeError("this FlashInfer's decode takes no state pool indices (initial_state_indices)")
            indices = x["state_indices"].to(torch.int32)
            kwargs.update(state=None, initial_state=pool, initial_state_indices=indices)
        else:
            kwargs.update(state=pool)
        o, state = decode_fn(**kwargs)
        return {"o": o.reshape(B, problem.HV, problem.V), "hT": pool if problem.uses_state_cache else state}

    return Kernel(run, name="flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose", formulation="sequential",
                  arrays="torch", device=device, supports=supports_decode, space=SPACE_DECODE,
                  replay="gdn_testbed.adapters.flashinfer:DECODE")


PREFILL = prefill()
DECODE = decode()
