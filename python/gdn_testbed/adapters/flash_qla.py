"""FlashQLA (module `flash_qla`, Qwen's TileLang kernels): flash_qla.chunk_gated_delta_rule.

Signature (flash_qla/ops/gated_delta_rule/chunk): chunk_gated_delta_rule(q, k, v, g, beta,
scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
cu_seqlens=None, head_first=False, state_v_first=False, auto_cp=True, enable_fwd_cp_cache=True)
with fla's conventions: q, k [B, T, H, K], v [B, T, HV, V], g (log space) and beta [B, T, HV],
B = 1 with cu_seqlens, GVA HV % H == 0, states [N, HV, K, V] (state_v_first: [N, HV, V, K]),
o [B, T, HV, V] in q's dtype. It asserts bf16 or fp16 q, k, v; the chunk size is 64 on SM90
and SM100 (32 on SM120). Gates are direct only (no in-kernel softplus); no state cache, no
per-token states. auto_cp (intra-card context parallelism, on by default) is an argument here.

Precision design (docs/python.md, "Precision designs"), read from flash_qla 0.1.3's Hopper path
(ops/gated_delta_rule/chunk/__init__.py, hopper/kkt_solve.py, hopper/fused_fwd.py): with
use_qk_l2norm_in_kernel, q and k are normalised first (utils/math.py l2norm_fwd: rstd in fp32,
(x * rstd).to(x.dtype)) and the stored bf16/fp16 vectors are the operands of every product; the
gates' chunk-local cumsum is in g's dtype (fp32 here); kkt_solve stores (I + diag(beta)
StrictLower(K K^T))^-1, without gates, in the input dtype; the fused kernel keeps the state in
fp32 registers and feeds it to the products as a copy in the input dtype (h_shared), rounds
W = V - exp(g) K S, the operand G * A * beta (the gates and beta applied to the stored inverse),
Vd = (G A beta) W, the decayed v_new and the scaled, gated Q K^T to the input dtype, accumulates
in fp32 and stores o in the input dtype and the final state in fp32. So it is judged by
OPERANDS_SINGLE_QK (the chunked form at C = 64 with every computed operand and the normalised q, k
rounded once to the input dtype); it differs from that model only in where beta is applied
(inside the A operand, rounded twice, rather than in X) and in the order of its fp32 sums. Its
accuracy against the fp32 baseline is a quality figure. (On SM120 FlashQLA chunks by 32, which
that model does not cover.)
"""
from __future__ import annotations

from ..kernel import Design, Kernel
from ..space import CaseSpace
from . import cuda_available, has_module, package_versions, reasons

SPACE = CaseSpace("chunked", input_dtypes=["bf16", "f16"], K_values=[128], V_values=[128], fused_gates="off",
                  state_cache="off", intermediate_states="off", min_work=2.0e5, max_work=2.0e7,
                  min_length=1)  # FlashQLA 0.1.3 raises on an empty sequence (supports says so)


def available() -> "str | None":
    return reasons((not has_module("flash_qla"), "flash_qla is not installed"),
                   (not cuda_available(), "no CUDA device (FlashQLA needs SM90, SM100 or SM120)"))


def versions() -> dict:
    return package_versions("flash-qla", "tilelang")


def supports(problem):
    return reasons(
        (problem.input_dtype not in ("bf16", "f16"), "FlashQLA takes bf16 and fp16 q, k, v only"),
        (problem.K != 128 or problem.V != 128, "FlashQLA's kernels are built for K = V = 128"),
        (any(problem.seq_len(n) == 0 for n in range(problem.N)),
         "an empty sequence: FlashQLA 0.1.3 raises ValueError('invalid sequence lengths') on one (its context-"
         "parallel planner), a stated limitation rather than a wrong result"),
        (problem.gate_mode == "fused", "no fused gates: FlashQLA takes g in log space and beta"),
        (problem.uses_state_cache, "no state cache: one dense state per sequence"),
        (problem.store_intermediate_states, "per-token states are not an output"),
    )


PRECISION = Design(normalized_qk="input", notes="beta applied inside the stored inverse (G * A * beta), not modelled "
                                                 "separately")
DESIGN = PRECISION.describe()


def chunk(auto_cp: bool = True, device=None) -> Kernel:
    def run(problem, x):
        import torch
        from flash_qla import chunk_gated_delta_rule
        o, final_state = chunk_gated_delta_rule(
            q=x["q"].unsqueeze(0), k=x["k"].unsqueeze(0), v=x["v"].unsqueeze(0), g=x["g"].unsqueeze(0),
            beta=x["beta"].unsqueeze(0), scale=problem.effective_scale,
            initial_state=x.get("h0") if problem.has_h0 else None, output_final_state=bool(problem.has_hT),
            use_qk_l2norm_in_kernel=bool(problem.use_qk_l2norm), cu_seqlens=x["cu_seqlens"].to(torch.long),
            state_v_first=problem.state_layout == "v_major", auto_cp=auto_cp)
        out = {"o": o.squeeze(0)}
        if problem.has_hT:
            out["hT"] = final_state
        return out

    return Kernel(run, name="flash_qla.chunk_gated_delta_rule" + ("" if auto_cp else "[auto_cp=False]"),
                  formulation="chunked", chunk_size=64, arrays="torch", device=device, supports=supports, space=SPACE,
                  design=PRECISION,
                  replay="gdn_testbed.adapters.flash_qla:CHUNK" + ("" if auto_cp else "_NO_CP"))


CHUNK = chunk()
CHUNK_NO_CP = chunk(auto_cp=False)
