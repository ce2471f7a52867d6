"""flash-linear-attention (the fla-core wheel, module `fla`): chunk_gated_delta_rule and
fused_recurrent_gated_delta_rule (fla.ops.gated_delta_rule, fla 0.6).

Conventions and how they map (the knowledge of reports/adapters/impl_fla.py, the case-file
adapter of the same functions):
- Batch axis: fla takes [B, T, ...] and with cu_seqlens requires B = 1; the packed tensors get
  B = 1 and cu_seqlens (int64) is always passed; the chunk function also gets cu_seqlens_cpu.
- GVA: HV % H == 0 natively, value head j reads q/k head j // (HV / H), as docs/semantics.md.
- scale: passed always (the effective scale). l2norm: use_qk_l2norm_in_kernel (x / sqrt(sum
  x^2 + 1e-6), the spec's); the chunk path stores the normalised q, k in the input dtype.
- Gates: direct g (log space) and beta as given; fused gates map to use_gate_in_kernel=True
  with `a` as fla's g, A_log, dt_bias, and use_beta_sigmoid_in_kernel=True with `b` as beta;
  allow_negative_eigenvalues to allow_neg_eigval.
- State: initial_state / final_state [N, HV, K, V] fp32, state_v_first=True for v_major.
- Not expressible through these functions (declared in supports, so such cases are SKIPPED):
  state caches with state_indices, per-token states, fp64 inputs, K > 256 for the chunk path.

Backend of the chunk function: fla dispatches chunk_gated_delta_rule through its backend
registry, and on SM90+ sends bf16/fp16 calls with K = V = 128 and direct gates to FlashQLA
when `flash_qla` is importable, unless FLA_FLASH_QLA=0 (read at call time). `chunk(backend=)`
makes that explicit: "triton" sets FLA_FLASH_QLA=0 for the call; "flash_qla" sets it to 1 and
checks that fla's FlashQLA backend actually ran (an ERROR otherwise, never a verdict labelled
with the wrong kernel); "auto" leaves fla's choice. SPACE_CHUNK_FLASH_QLA is the space where
the FlashQLA path applies.

Precision design of the chunk function (both backends; docs/python.md, "Precision designs"):
the chunk states h, W, U and v_new are stored in the input dtype (bf16/fp16) and are the
operands of the next tensor-core products, with fp32 accumulation; with use_qk_l2norm_in_kernel
the normalised q, k are computed in a pass of their own and stored in the input dtype
(fla/modules/norm/l2norm.py, l2norm_fwd_kernel: b_y = b_x * b_rstd, stored as y's dtype, the
input's; FlashQLA: flash_qla/utils/math.py, (x * rstd).to(x.dtype)) and those stored vectors are
the operands of every q and k product. Such a kernel is judged by OPERANDS_SINGLE_QK (the chunked
form with each computed operand and the normalised q, k rounded once to the input dtype): where
q . k cancels, the stored q, k are most of o's error (the one-token FAILs of the H100 runs under
OPERANDS_SINGLE, reproduced bit for bit: reports/peers.md). Under the fp32 baseline its hT misses
by three to four orders of magnitude by design. For fp32 inputs that baseline is the plain fp32
emulation, while fla 0.6's chunk kernels take fp32 operands through TF32: the fused kkt +
solve_tril asks for 'tf32' wherever TF32 exists (chunk_fwd.py, SOLVE_TRIL_DOT_PRECISION), the
state and output kernels (common/chunk_delta_h.py, chunk_o.py) keep tl.dot's TF32 default, and
only U = A (beta v) asks for IEEE (wy_fast.py, allow_tf32=False). TF32 is not modelled, so that
gap shows as a FAIL of the fp32 cases, which the design string names. fused_recurrent keeps its state in
fp32 registers: the default budget. Its fused gates compute softplus as ln2 * lg2.approx(1 +
ex2.approx(x log2 e)) (fla/ops/utils/softplus.py), not log1p(exp(x)): for a + dt_bias well below
0 g carries an absolute error of about exp(A_log) * 1e-7, which fails fp32 cases by small margins.
That is a finding about the kernel (reports/peers.md, "What the FAILs mean"), not a design the
budget should absorb.
"""
from __future__ import annotations

import contextlib
import os

from ..kernel import Design, Kernel
from ..space import CaseSpace
from . import cuda_available, has_module, package_versions, reasons

# fla's support matrix: packed varlen batches, direct or fused gates, dense K- or V-major states,
# no cache, no per-token states, fp32/bf16/fp16.
SPACE_CHUNK = CaseSpace("chunked", input_dtypes=["f32", "bf16", "f16"], state_cache="off", intermediate_states="off",
                        max_K=256, max_V=256)
SPACE_FUSED_RECURRENT = CaseSpace("everything", input_dtypes=["f32", "bf16", "f16"], state_cache="off",
                                  intermediate_states="off", max_K=256, max_V=256)
# Where fla hands the chunk function to FlashQLA (SM90+).
SPACE_CHUNK_FLASH_QLA = SPACE_CHUNK.replace(input_dtypes=["bf16", "f16"], K_values=[128], V_values=[128],
                                            fused_gates="off", min_work=2.0e5, max_work=2.0e7,
                                            min_length=1)  # FlashQLA raises on an empty sequence


def available() -> "str | None":
    """None when fla and a CUDA device are here, else why not."""
    return reasons((not has_module("fla"), "fla (fla-core) is not installed"),
                   (not cuda_available(), "no CUDA device (fla's kernels are Triton on CUDA)"))


def versions() -> dict:
    return package_versions("fla-core", "flash-linear-attention", "triton", "flash-qla")


def _supports(variant: str, backend: str):
    def supports(problem):
        why = reasons(
            (problem.uses_state_cache, "state cache with state_indices: these fla functions take one dense state "
                                       "per sequence"),
            (problem.store_intermediate_states, "per-token states are not an output of these fla functions"),
            (problem.input_dtype == "f64", "fp64 inputs: fla's kernels are written for fp32, bf16 and fp16"),
            (variant == "chunk" and problem.K > 256, f"K = {problem.K} > 256: fla's chunk kernels assert K <= 256"),
        )
        if why is None and backend == "flash_qla":
            why = reasons((problem.input_dtype not in ("bf16", "f16"), "FlashQLA takes bf16 and fp16 only"),
                          (problem.K != 128 or problem.V != 128, "fla sends only K = V = 128 to FlashQLA"),
                          (problem.gate_mode == "fused", "fla sends only direct gates to FlashQLA"),
                          (any(problem.seq_len(n) == 0 for n in range(problem.N)),
                           "an empty sequence: FlashQLA 0.1.3 raises ValueError('invalid sequence lengths')"))
        return why
    return supports


@contextlib.contextmanager
def _flash_qla_env(value: "str | None"):
    old = os.environ.get("FLA_FLASH_QLA")
    try:
        if value is not None:
            os.environ["FLA_FLASH_QLA"] = value
        yield
    finally:
        if value is not None:
            if old is None:
                os.environ.pop("FLA_FLASH_QLA", None)
            else:
                os.environ["FLA_FLASH_QLA"] = old


# The chunk function's precision design (both backends; the module's docstring).
CHUNK_PRECISION = Design(normalized_qk="input", tf32=True)
CHUNK_DESIGN = CHUNK_PRECISION.describe()


def call(function, problem, x: dict, *, chunk: bool):
    """Calls an fla-convention function (fla's, or a stand-in with its signature) on the inputs."""
    import torch
    fused = problem.gate_mode == "fused"
    kwargs = dict(
        q=x["q"].unsqueeze(0), k=x["k"].unsqueeze(0), v=x["v"].unsqueeze(0),
        g=(x["a"] if fused else x["g"]).unsqueeze(0), beta=(x["b"] if fused else x["beta"]).unsqueeze(0),
        scale=problem.effective_scale, initial_state=x.get("h0") if problem.has_h0 else None,
        output_final_state=bool(problem.has_hT), use_qk_l2norm_in_kernel=bool(problem.use_qk_l2norm),
        state_v_first=problem.state_layout == "v_major", cu_seqlens=x["cu_seqlens"].to(torch.long))
    if fused:
        kwargs.update(use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"], use_beta_sigmoid_in_kernel=True,
                      allow_neg_eigval=bool(problem.allow_negative_eigenvalues))
    if chunk:
        kwargs["cu_seqlens_cpu"] = x["cu_seqlens"].to(device="cpu", dtype=torch.long)
    # Keyword arguments throughout: fused_recurrent's positional order is q, k, v, g, gk, gv, beta.
    o, final_state = function(**kwargs)
    out = {"o": o.squeeze(0)}
    if problem.has_hT:
        if final_state is None:
            raise RuntimeError("fla returned no final state although output_final_state=True")
        out["hT"] = final_state
    return out


def chunk(backend: str = "triton", device=None) -> Kernel:
    """fla.ops.gated_delta_rule.chunk_gated_delta_rule on the backend named: "triton",
    "flash_qla" or "auto" (fla's own dispatch)."""
    if backend not in ("triton", "flash_qla", "auto"):
        raise ValueError(f"fla.chunk: backend must be 'triton', 'flash_qla' or 'auto', got {backend!r}")

    def run(problem, x):
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        if backend != "flash_qla":
            with _flash_qla_env("0" if backend == "triton" else None):
                return call(chunk_gated_delta_rule, problem, x, chunk=True)
        from fla.ops.gated_delta_rule.backends.flash_qla import FlashQLABackend
        original = FlashQLABackend.chunk_gated_delta_rule
        ran = []

        def spy(self, *args, **kwargs):
            ran.append(True)
            return original(self, *args, **kwargs)

        FlashQLABackend.chunk_gated_delta_rule = spy
        try:
            with _flash_qla_env("1"):
                out = call(chunk_gated_delta_rule, problem, x, chunk=True)
        finally:
            FlashQLABackend.chunk_gated_delta_rule = original
        if not ran:
            raise RuntimeError("fla did not dispatch this call to FlashQLA (flash_qla missing, or the GPU or "
                               "the problem is not eligible): its outputs would be Triton's")
        return out

    return Kernel(run, name=f"fla.chunk_gated_delta_rule[{backend}]", formulation="chunked", chunk_size=64,
                  arrays="torch", device=device, supports=_supports("chunk", backend),
                  design=CHUNK_PRECISION,
                  space=SPACE_CHUNK_FLASH_QLA if backend == "flash_qla" else SPACE_CHUNK,
                  replay=f"gdn_testbed.adapters.fla:CHUNK_{backend.upper()}")


def fused_recurrent(device=None) -> Kernel:
    """fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule."""
    def run(problem, x):
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        return call(fused_recurrent_gated_delta_rule, problem, x, chunk=False)

    return Kernel(run, name="fla.fused_recurrent_gated_delta_rule", formulation="sequential", arrays="torch",
                  device=device, supports=_supports("fused_recurrent", "triton"), space=SPACE_FUSED_RECURRENT,
                  replay="gdn_testbed.adapters.fla:FUSED_RECURRENT")


# Ready-made kernels (what the replay commands name).
CHUNK_TRITON = chunk("triton")
CHUNK_FLASH_QLA = chunk("flash_qla")
CHUNK_AUTO = chunk("auto")
FUSED_RECURRENT = fused_recurrent()
