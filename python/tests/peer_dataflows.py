"""numpy copies of other libraries' chunked dataflows, operand by operand, for the tests of the
precision designs (docs/python.md, "Precision designs"; the evidence in reports/peers.md).

flash_qla_hopper: FlashQLA 0.1.3's forward on SM90 (flash_qla/ops/gated_delta_rule/chunk/
__init__.py, hopper/kkt_solve.py, hopper/fused_fwd.py), every rounding to the input dtype where
that kernel stores a value in it, fp32 arithmetic elsewhere. Its sums run in numpy's order, not
the tensor cores', so it predicts the kernel's error, not always its bits (on the one-token cases
of the H100 runs, where every sum is short, it gives the kernel's o bit for bit).

fla_triton: fla 0.6's Triton chunk forward (fla/ops/gated_delta_rule/chunk.py and the kernels it
calls), with the same roundings to the input dtype and, beyond them, fla's cumulative gate: fp32
sums in Triton's scan order, rescaled to log2 units in fp32 (fla_gate_cumsum).
"""
import numpy as np

import gdn_testbed as gt

C = 64
F = np.float32


def _round(dtype, x):
    return gt.round_to(dtype, np.asarray(x, dtype=F)).astype(F)


def flash_qla_hopper(problem, x):
    dtype = problem.input_dtype
    r = (lambda a: _round(dtype, a)) if dtype in ("bf16", "f16") else (lambda a: np.asarray(a, dtype=F))
    q, k, v = (np.asarray(x[n], dtype=F) for n in ("q", "k", "v"))
    g, beta = np.asarray(x["g"], dtype=F), np.asarray(x["beta"], dtype=F)
    if problem.use_qk_l2norm:   # utils/math.py l2norm_fwd: rstd in fp32, (x * rstd).to(x.dtype)
        q = r(q / np.sqrt((q * q).sum(-1, keepdims=True, dtype=F) + F(1e-6)))
        k = r(k / np.sqrt((k * k).sum(-1, keepdims=True, dtype=F) + F(1e-6)))
    scale = F(problem.effective_scale)
    cu = [int(c) for c in x["cu_seqlens"]]
    o = np.zeros(problem.v_shape, dtype=F)
    hT = np.zeros(problem.state_shape, dtype=F)
    for n in range(problem.N):
        for j in range(problem.HV):
            h = j // problem.group_size
            S = np.array(x["h0"][n, j], dtype=F) if problem.has_h0 else np.zeros((problem.K, problem.V), F)
            for start in range(cu[n], cu[n + 1], C):
                end = min(start + C, cu[n + 1])
                Q, K, V = q[start:end, h], k[start:end, h], v[start:end, j]
                gam = np.cumsum(g[start:end, j], dtype=F)          # chunk_local_cumsum, fp32
                b = beta[start:end, j]
                c = end - start
                # kkt_solve: (I + diag(b) StrictLower(K K^T))^-1 without gates, stored in the input dtype.
                A = np.tril(K @ K.T, -1) * b[:, None]
                Tr = r(np.linalg.inv(np.eye(c, dtype=F) + A).astype(F))
                G = np.tril(np.exp(gam[:, None] - gam[None, :]).astype(F))
                Ag = r(Tr * G * b[None, :])                            # a_shared: G * A * beta
                S_in = r(S)                                            # h_shared
                W = r(V - np.exp(gam)[:, None] * (K @ S_in))           # v_shared: V - g K S
                Vd = (Ag @ W).astype(F)
                Vd_in = r(Vd)                                          # vd_shared
                Vn = r(np.exp(gam[-1] - gam)[:, None] * Vd)            # vn_shared
                Pg = r(scale * G * (Q @ K.T))                          # p_shared
                O = (scale * np.exp(gam))[:, None] * (Q @ S_in) + Pg @ Vd_in
                o[start:end, j] = O
                S = (np.exp(gam[-1]) * S + K.T @ Vn).astype(F)
            hT[n, j] = S
    out = {"o": r(o)}
    if problem.has_hT:
        out["hT"] = hT
    return out


def supports_flash_qla(problem):
    if problem.gate_mode != "direct" or problem.uses_state_cache or problem.state_layout != "k_major":
        return "direct gates and dense K-major states only"
    if problem.store_intermediate_states:
        return "no per-token states"
    return None


RCP_LN2 = F(1.4426950216)   # fla/ops/utils/constant.py, as the fp32 scalar the kernel receives


def _exp2(x):
    """ex2 of an fp32 argument, correctly rounded (the PTX approximation is within 2 ulp)."""
    with np.errstate(over="ignore"):
        return np.exp2(np.asarray(x, dtype=np.float64)).astype(F)


def _triton_cumsum(x, lanes=32):
    """tl.cumsum of fp32 values as Triton lowers it for a 64-long chunk (ScanOpToLLVM): a
    Hillis-Steele scan across the 32 lanes of a warp (at step d, lane l adds lane l - d's value,
    d = 1, 2, 4, 8, 16; each sum rounded to fp32), then each later group of 32 adds the total of
    the groups before it. With this order fla_triton gives the kernel's hT of the pinned fla FAIL
    to one fp32 ulp; a sequential sum, or the same scan over 16 or 64 lanes, leaves most of its
    error unexplained (test_peer_findings.py)."""
    x = np.asarray(x, dtype=F)
    out = np.empty_like(x)
    carry = None
    for s in range(0, len(x), lanes):
        v = x[s:s + lanes].copy()
        d = 1
        while d < len(v):
            v[d:] = (v[d:] + v[:-d]).astype(F)   # the right side is evaluated before the store
            d *= 2
        out[s:s + lanes] = v if carry is None else (v + carry).astype(F)
        carry = out[s + len(v) - 1]
    return out


def fla_gate_cumsum(g, gates="fla"):
    """The chunk-local cumulative gate, in log2 units, that fla's kernels take exp2 of.
    "fla": chunk_local_cumsum_scalar_kernel (fla/ops/utils/cumsum.py; chunk.py passes
    scale=RCP_LN2) sums the fp32 gates from the chunk's start in fp32, in Triton's scan order,
    with no reset at a gate that zeroes the state, and multiplies each sum by RCP_LN2, stored in
    fp32. The absolute error of such a sum grows with its magnitude: gates of -1e4 take the sums to
    ~1e5 (~1.4e5 in log2 units), where fp32 resolves 2^-7 (2^-6), so every decay exp2(g_i - g_j)
    carries a relative error of up to a few 1e-3 per rounding.
    "fla_unscaled": the same scan, converted to log2 units exactly (no RCP_LN2 rounding).
    "sequential": the fp32 sum in order, then RCP_LN2 as fla does.
    "exact": the sum in double, converted exactly; the operand model's gamma (reference/
    operand_model.cpp: double, reset at each zeroing gate) gives the same decays."""
    g = np.asarray(g, dtype=F)
    if gates == "exact":
        return np.cumsum(g, dtype=np.float64) / np.log(2.0)
    s = np.cumsum(g, dtype=F) if gates == "sequential" else _triton_cumsum(g)
    if gates == "fla_unscaled":
        return s.astype(np.float64) / np.log(2.0)
    return (s * RCP_LN2).astype(F)


def fla_triton(problem, x, gates="fla"):
    """fla 0.6's Triton chunk forward for bf16/fp16 inputs with fp32 gates, operand for operand:
    - q, k normalised as x * (1 / sqrt(sum x^2 + 1e-6)) in fp32 and stored (modules/norm/l2norm.py,
      l2norm_fwd_kernel);
    - the cumulative gate in fp32 log2 units (fla_gate_cumsum), every decay an exp2 of an fp32
      difference;
    - A = (I + StrictLower(diag(beta) exp2(g_i - g_j) K K^T))^-1 in fp32, stored in the input dtype
      (gated_delta_rule/chunk_fwd.py, chunk_gated_delta_rule_fwd_kkt_solve_kernel; its TF32 block
      merges are not copied: below the rounding of A to bf16);
    - u = A (beta v) and w = A (beta exp2(g) k), both operands and results stored (wy_fast.py,
      recompute_w_u_fwd_kernel; beta fp32, so each operand is rounded once);
    - per chunk (common/chunk_delta_h.py, chunk_gated_delta_rule_fwd_kernel_h_blockdim64): the
      fp32 state stored as h and read back as the product operand, v_new = u - w h in fp32,
      stored for o; the state update's operand is that fp32 v_new times exp2(g_last - g),
      rounded once (not the stored v_new decayed); h = exp2(g_last) h + K^T that, fp32;
    - o = scale (exp2(g) Q h) + scale (round(exp2(g_i - g_j) Q K^T masked) v_new), stored
      (common/chunk_o.py, chunk_fwd_kernel_o).
    The tensor cores' summation order is numpy's here, so in general this predicts the kernel's
    error, not its bits. gates= (fla_gate_cumsum) swaps only the cumulative gate, to measure what
    each of its roundings contributes."""
    dtype = problem.input_dtype
    r = (lambda a: _round(dtype, a)) if dtype in ("bf16", "f16") else (lambda a: np.asarray(a, dtype=F))
    q, k, v = (np.asarray(x[n], dtype=F) for n in ("q", "k", "v"))
    g, beta = np.asarray(x["g"], dtype=F), np.asarray(x["beta"], dtype=F)
    if problem.use_qk_l2norm:
        q = r(q * (F(1) / np.sqrt((q * q).sum(-1, keepdims=True, dtype=F) + F(1e-6))))
        k = r(k * (F(1) / np.sqrt((k * k).sum(-1, keepdims=True, dtype=F) + F(1e-6))))
    scale = F(problem.effective_scale)
    cu = [int(c) for c in x["cu_seqlens"]]
    o = np.zeros(problem.v_shape, dtype=F)
    hT = np.zeros(problem.state_shape, dtype=F)
    for n in range(problem.N):
        for j in range(problem.HV):
            h = j // problem.group_size
            S = np.array(x["h0"][n, j], dtype=F) if problem.has_h0 else np.zeros((problem.K, problem.V), F)
            for start in range(cu[n], cu[n + 1], C):
                end = min(start + C, cu[n + 1])
                Q, K, V = q[start:end, h], k[start:end, h], v[start:end, j]
                gam = fla_gate_cumsum(g[start:end, j], gates)
                b = beta[start:end, j]
                c = end - start
                lower = np.tril(np.ones((c, c), dtype=bool))
                D = _exp2(np.where(lower, gam[:, None] - gam[None, :], 0)) * lower   # exp2(g_i - g_j), i >= j
                KK = (K @ K.T).astype(F)
                A = r(np.linalg.inv(np.eye(c, dtype=F) + np.tril(KK * D, -1) * b[:, None]).astype(F))
                u = r(A @ r(V * b[:, None]))
                w = r(A @ r(K * b[:, None] * _exp2(gam)[:, None]))
                S_in = r(S)
                vn = (u - w @ S_in).astype(F)
                v_new = r(vn)
                Vd = r(vn * _exp2(gam[-1] - gam)[:, None])
                P = r((Q @ K.T).astype(F) * D)
                O = (Q @ S_in).astype(F) * _exp2(gam)[:, None]
                o[start:end, j] = O * scale + (P @ v_new).astype(F) * scale
                S = (S * _exp2(gam[-1]) + K.T @ Vd).astype(F)
            hT[n, j] = S
    out = {"o": r(o)}
    if problem.has_hT:
        out["hT"] = hT
    return out
