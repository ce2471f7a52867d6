"""A torch stand-in for fla's two gated-delta-rule functions, with fla-core 0.6.0's calling
convention (keyword names, [B, T, H, K] with B == 1 and cu_seqlens, GVA, state_v_first,
use_gate_in_kernel / use_beta_sigmoid_in_kernel / allow_neg_eigval, fp32 final state, o in v's
dtype), computing in float64.

It exists so the conversions in impl_fla.py are tested on a machine without a GPU: the test
runs impl_fla with this stand-in and `gdn-testbed verify` judges the result against the
oracle, which knows nothing of fla's conventions. A conversion mistake (a lost batch axis,
transposed state, wrong gate argument) fails there. It checks the same argument rules fla's
Python wrappers check (B == 1 with cu_seqlens, one initial state per sequence, HV % H == 0).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _recurrence(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                state_v_first, cu_seqlens):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if k.shape != q.shape:
        raise ValueError(f"q and k must have the same shape, got {tuple(q.shape)} and {tuple(k.shape)}")
    if HV % H != 0:
        raise ValueError(f"num_v_heads (HV={HV}) must be divisible by num_heads (H={H})")
    if g.shape != (B, T, HV) or beta.shape != (B, T, HV):
        raise ValueError(f"g and beta must be [B, T, HV] = {(B, T, HV)}, got {tuple(g.shape)}, {tuple(beta.shape)}")
    if cu_seqlens is None:
        cu = [i * T for i in range(B + 1)]
        flat = lambda x: x.reshape(B * T, *x.shape[2:])  # noqa: E731
        q, k, v, g, beta = map(flat, (q, k, v, g, beta))
    else:
        if B != 1:
            raise ValueError(f"The batch size is expected to be 1 rather than {B} when using `cu_seqlens`.")
        if cu_seqlens.dtype != torch.long:
            raise TypeError(f"cu_seqlens must be a LongTensor, got {cu_seqlens.dtype}")
        cu = cu_seqlens.tolist()
        q, k, v, g, beta = (x[0] for x in (q, k, v, g, beta))
    N = len(cu) - 1
    if initial_state is not None and initial_state.shape[0] != N:
        raise ValueError(f"The number of initial states is expected to be {N} rather than {initial_state.shape[0]}.")
    expected_state = (N, HV, V, K) if state_v_first else (N, HV, K, V)
    if initial_state is not None and tuple(initial_state.shape) != expected_state:
        raise ValueError(f"initial_state must be {expected_state}, got {tuple(initial_state.shape)}")

    out_dtype = v.dtype
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    if use_gate_in_kernel:
        if A_log is None:
            raise ValueError("A_log must be provided when use_gate_in_kernel=True.")
        x = g + (dt_bias.double()[None, :] if dt_bias is not None else 0.0)
        g = -torch.exp(A_log.double())[None, :] * F.softplus(x, beta=1.0, threshold=20.0)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    if use_beta_sigmoid_in_kernel:
        beta = torch.sigmoid(beta) * (2.0 if allow_neg_eigval else 1.0)

    heads = torch.arange(HV, device=q.device) // (HV // H)
    o = torch.zeros(q.shape[0], HV, V, dtype=torch.float64, device=q.device)
    final = torch.zeros(N, HV, K, V, dtype=torch.float64, device=q.device)
    for n in range(N):
        S = torch.zeros(HV, K, V, dtype=torch.float64, device=q.device)
        if initial_state is not None:
            S = initial_state[n].double()
            if state_v_first:
                S = S.transpose(-1, -2)
        for t in range(cu[n], cu[n + 1]):
            qt, kt = q[t, heads] * scale, k[t, heads]
            S = torch.exp(g[t])[:, None, None] * S
            u = beta[t][:, None] * (v[t] - torch.einsum("jkv,jk->jv", S, kt))
            S = S + kt[:, :, None] * u[:, None, :]
            o[t] = torch.einsum("jkv,jk->jv", S, qt)
        final[n] = S
    if state_v_first:
        final = final.transpose(-1, -2)
    o = o.to(out_dtype)
    o = o.reshape(B, T, HV, V) if cu_seqlens is None else o.unsqueeze(0)
    return o, (final.to(torch.float32).contiguous() if output_final_state else None)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                           allow_neg_eigval=False, state_v_first=False, cu_seqlens=None,
                           cu_seqlens_cpu=None, chunk_indices=None, cp_context=None, **kwargs):
    if "head_first" in kwargs:
        raise DeprecationWarning("head_first has been removed.")
    if scale is None:
        scale = k.shape[-1] ** -0.5
    if cu_seqlens_cpu is not None and cu_seqlens is not None and cu_seqlens_cpu.tolist() != cu_seqlens.tolist():
        raise ValueError("cu_seqlens_cpu disagrees with cu_seqlens")
    return _recurrence(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                       kwargs.get("use_gate_in_kernel", False), kwargs.get("A_log"), kwargs.get("dt_bias"),
                       use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens)


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None,
                                     initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None,
                                     dt_bias=None, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                                     state_v_first=False, cu_seqlens=None, **kwargs):
    if gk is not None or gv is not None:
        raise NotImplementedError("the stand-in models scalar (per-head) decay only")
    if scale is None:
        scale = k.shape[-1] ** -0.5
    if beta is None:
        beta = torch.ones_like(q[..., 0])
    return _recurrence(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                       use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                       state_v_first, cu_seqlens)


def _implementations():
    from impl_fla import FlaImplementation
    return (FlaImplementation("chunk", kernel=chunk_gated_delta_rule),
            FlaImplementation("fused_recurrent", kernel=fused_recurrent_gated_delta_rule))


# impl_fla's two implementations with this stand-in in place of fla: `--impl fla_standin.py:CHUNK`.
CHUNK, FUSED_RECURRENT = _implementations()
