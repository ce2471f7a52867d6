"""Python kernels for the package's tests: the recurrence of docs/semantics.md in numpy (float64),
and copies of it with planted bugs. Direct gates, dense K-major states; SPACE is what they support."""
import numpy as np

import gdn_testbed as gt


def recurrence(problem, x, drop_decay_every=0, scale_error=1.0):
    cu = [int(c) for c in x["cu_seqlens"]]
    group = problem.group_size
    q, k, v = (np.asarray(x[n], dtype=np.float64) for n in ("q", "k", "v"))
    g, beta = np.asarray(x["g"], dtype=np.float64), np.asarray(x["beta"], dtype=np.float64)
    if problem.use_qk_l2norm:
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    o = np.zeros(problem.v_shape)
    hT = np.zeros(problem.state_shape)
    for n in range(problem.N):
        for j in range(problem.HV):
            h = j // group
            S = np.array(x["h0"][n, j], dtype=np.float64) if problem.has_h0 else np.zeros((problem.K, problem.V))
            for t in range(cu[n], cu[n + 1]):
                position = t - cu[n]
                if not (drop_decay_every and position > 0 and position % drop_decay_every == 0):
                    S = S * np.exp(g[t, j])
                S = S + np.outer(k[t, h], beta[t, j] * (v[t, j] - k[t, h] @ S))
                o[t, j] = problem.effective_scale * scale_error * (q[t, h] @ S)
            hT[n, j] = S
    return {"o": o, "hT": hT if problem.has_hT else None}


def dropped_decay(problem, x):
    """The bug of a chunked kernel that forgets the decay where a chunk of 64 starts."""
    return recurrence(problem, x, drop_decay_every=64)


def supports(problem):
    if problem.gate_mode != "direct" or problem.uses_state_cache or problem.state_layout != "k_major":
        return "direct gates and dense K-major states only"
    if problem.store_intermediate_states:
        return "no per-token states"
    return None


SPACE = gt.CaseSpace(fused_gates="off", state_cache="off", v_major="off", max_K=24, max_V=24, max_work=1.5e5)

GOOD = gt.Kernel(recurrence, name="tests.recurrence", supports=supports, space=SPACE)
BAD = gt.Kernel(dropped_decay, name="tests.dropped_decay", supports=supports, space=SPACE)
