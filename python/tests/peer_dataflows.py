"""numpy copies of other libraries' chunked dataflows, operand by operand, for the tests of the
precision designs (docs/python.md, "Precision designs"; the evidence in reports/peers.md).

flash_qla_hopper: FlashQLA 0.1.3's forward on SM90 (flash_qla/ops/gated_delta_rule/chunk/
__init__.py, hopper/kkt_solve.py, hopper/fused_fwd.py), every rounding to the input dtype where
that kernel stores a value in it, fp32 arithmetic elsewhere. Its sums run in numpy's order, not
the tensor cores', so it predicts the kernel's error, not always its bits (on the one-token cases
of the H100 runs, where every sum is short, it gives the kernel's o bit for bit).
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


def fla_triton(problem, x):
    """fla 0.6's Triton chunk forward for bf16/fp16 inputs (fla/ops/gated_delta_rule/chunk.py,
    chunk_fwd.py, wy_fast.py, fla/ops/common/chunk_delta_h.py, chunk_o.py): the normalised q, k
    stored (modules/norm/l2norm.py); A = (I + StrictLower(diag(beta) G K K^T))^-1 in fp32, stored;
    the WY factors u = A (beta v) and w = A (beta exp(g) k) with their operands and results
    stored; per chunk the state stored (h), v_new = u - w h stored, the decayed v_new rounded for
    the state update, o = scale (exp(g) Q h + (G Q K^T) v_new) with G Q K^T rounded. The solve's
    TF32 products are not copied (below the bf16 rounding of A)."""
    dtype = problem.input_dtype
    r = (lambda a: _round(dtype, a)) if dtype in ("bf16", "f16") else (lambda a: np.asarray(a, dtype=F))
    q, k, v = (np.asarray(x[n], dtype=F) for n in ("q", "k", "v"))
    g, beta = np.asarray(x["g"], dtype=F), np.asarray(x["beta"], dtype=F)
    if problem.use_qk_l2norm:
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
                gam = np.cumsum(g[start:end, j], dtype=F)
                b = beta[start:end, j]
                c = end - start
                G = np.tril(np.exp(gam[:, None] - gam[None, :]).astype(F))
                A = r(np.linalg.inv(np.eye(c, dtype=F) + np.tril(b[:, None] * G * (K @ K.T), -1)).astype(F))
                u = r(A @ r(V * b[:, None]))
                w = r(A @ r(K * (b * np.exp(gam))[:, None]))
                S_in = r(S)
                v_new = r(u - w @ S_in)
                Vd = r(np.exp(gam[-1] - gam)[:, None] * v_new)
                P = r(G * (Q @ K.T))
                o[start:end, j] = scale * (np.exp(gam)[:, None] * (Q @ S_in)) + scale * (P @ v_new)
                S = (np.exp(gam[-1]) * S + K.T @ Vd).astype(F)
            hT[n, j] = S
    out = {"o": r(o)}
    if problem.has_hT:
        out["hT"] = hT
    return out
