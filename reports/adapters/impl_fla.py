"""flash-linear-attention (the `fla-core` wheel, module `fla`) under gdn-testbed's oracle.

Two implementations, objects of the interface in gdn_adapter.py:
  CHUNK            fla.ops.gated_delta_rule.chunk_gated_delta_rule            (FORMULATION chunked, C = 64)
  FUSED_RECURRENT  fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule  (FORMULATION sequential)

Conventions, read from fla-core 0.6.0's source, and how this adapter converts
-----------------------------------------------------------------------------
- Batch axis: fla takes q, k [B, T, H, K], v [B, T, HV, V], g, beta [B, T, HV] and, with
  cu_seqlens (LongTensor [N+1], FlashAttention's convention), requires B == 1. gdn-testbed's
  tensors are packed without a batch axis: the adapter adds B = 1 (unsqueeze(0)) and always
  passes cu_seqlens (int64, on the device), also for N = 1. The chunk function also gets
  cu_seqlens_cpu, so fla does not copy the boundaries back from the device.
- GVA: fla supports HV % H == 0 natively and maps value head j to q/k head j // (HV / H)
  (fused_recurrent kernel: i_h = i_hv // (HV // H)), the same as spec section 1: no repeat.
- scale: fla's default is K ** -0.5, the same; the adapter passes the effective scale always.
- l2norm: use_qk_l2norm_in_kernel=True computes x / sqrt(sum x^2 + 1e-6), the spec's formula
  and epsilon. Difference: the chunk path normalises q and k in a separate kernel whose output
  has the input dtype, so for bf16/fp16 inputs the normalised q^, k^ are rounded to bf16/fp16
  before the chunk kernels (the recurrent kernel keeps them in fp32 registers).
- Gates: g is log-space decay, beta the write strength, as here (direct gate mode). Fused gate
  mode maps to use_gate_in_kernel=True with the raw `a` passed as fla's `g` argument, A_log,
  dt_bias, and use_beta_sigmoid_in_kernel=True with the raw `b` as `beta`;
  allow_negative_eigenvalues maps to allow_neg_eigval (2 * sigmoid). fla's in-kernel softplus
  switches to x above 20, as the spec does, computed with approximate ex2/lg2 instructions.
  Direct gates with beta in [0, 2) need no flag: fla applies beta as given.
- State: fla's initial_state / final_state are [N, HV, K, V] fp32 (K-major), the spec's
  layout; state_v_first=True gives [N, HV, V, K], the spec's v_major. The final state is
  always fp32 (output_final_state = has_hT). fla loads h0 in any dtype and widens to fp32.
- Outputs: o has v's dtype (fused_recurrent: empty_like(v); chunk: o.to(q.dtype); q, k, v share
  a dtype in every case file), o includes token t (read after the write), as the spec.
- Chunk internals worth knowing when reading its verdicts: the per-chunk states h that the
  output kernel reads are stored in k's dtype (bf16 for bf16 inputs; fp32 carry inside the
  state kernel), and so are W, U and v_new: the chunked fp32 emulation does not round these,
  so a bf16 chunk case may exceed the calibrated budget for reasons of design, not of a bug.
- Dispatch: chunk_gated_delta_rule goes through fla's backend registry; when the optional
  `flash_qla` package is importable, SM90+ bf16/fp16 calls with K = V = 128 and no fused gates
  go to FlashQLA's TileLang kernel instead of Triton. versions() records which one applies:
  "fla.chunk_backend" is "triton" unless flash_qla is importable and FLA_FLASH_QLA is not 0.
- head_first layouts were removed from fla (it raises on head_first): nothing to convert.

Skipped (Unsupported, with the reason): state caches with state_indices (these two functions
take one dense state per sequence; fla's decode kernels are a different API), intermediate
states (not an output of these functions), fp64 inputs (fla's kernels are written for fp32,
bf16 and fp16), and for the chunk function K > 256 (fla asserts K <= 256).
"""
from __future__ import annotations

import importlib.util
import math
import os

from adapter_api import Unsupported


def _fla_function(name: str):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    return {"chunk": chunk_gated_delta_rule, "fused_recurrent": fused_recurrent_gated_delta_rule}[name]


class FlaImplementation:
    """One of fla's two gated-delta-rule functions. `kernel` replaces the fla function (tests
    pass a torch stand-in with fla's signature, fla_standin.py, to check the conversions on a
    machine without a GPU)."""

    def __init__(self, variant: str, kernel=None):
        if variant not in ("chunk", "fused_recurrent"):
            raise ValueError(f"impl_fla: variant must be 'chunk' or 'fused_recurrent', got '{variant}'")
        self.variant = variant
        self.kernel = kernel
        # A stand-in's outputs must never be mistaken for fla's in a verdict.
        self.NAME = f"fla.{variant}_gated_delta_rule" + ("" if kernel is None else "[torch stand-in]")
        self.FORMULATION = "chunked" if variant == "chunk" else "sequential"
        self.CHUNK_SIZE = 64

    def versions(self) -> dict[str, str]:
        out = {}
        if self.kernel is not None:
            out["fla"] = f"stand-in {getattr(self.kernel, '__module__', '?')}.{getattr(self.kernel, '__name__', '?')}"
            return out
        _fla_function(self.variant)  # fails here, once, with ImportError when fla is not installed
        from importlib.metadata import PackageNotFoundError, version
        for package in ("fla-core", "flash-linear-attention", "triton", "flash_qla"):
            try:
                out[package] = version(package)
            except PackageNotFoundError:
                pass
        if self.variant == "chunk":
            qla = importlib.util.find_spec("flash_qla") is not None and os.environ.get("FLA_FLASH_QLA", "1") != "0"
            out["fla.chunk_backend"] = "flash_qla when eligible, else triton" if qla else "triton"
        return out

    def supports(self, problem: dict) -> str | None:
        """The reason this problem is skipped, or None."""
        if problem["state_slots"] > 0:
            return ("state cache with state_indices: fla's chunk/fused_recurrent functions take one dense "
                    "initial_state per sequence")
        if problem["store_intermediate_states"]:
            return "intermediate states: not an output of fla's chunk/fused_recurrent functions"
        if problem["input_dtype"] == "f64":
            return "fp64 inputs: fla's kernels are written for fp32, bf16 and fp16"
        if self.variant == "chunk" and problem["K"] > 256:
            return f"K = {problem['K']} > 256: fla's chunk kernels assert K <= 256"
        return None

    def run(self, problem: dict, tensors: dict) -> dict:
        import torch
        reason = self.supports(problem)
        if reason:
            raise Unsupported(reason)
        kernel = self.kernel or _fla_function(self.variant)
        device = tensors["q"].device
        fused = problem["gate_mode"] == "fused"
        kwargs = dict(
            q=tensors["q"].unsqueeze(0),
            k=tensors["k"].unsqueeze(0),
            v=tensors["v"].unsqueeze(0),
            g=(tensors["a"] if fused else tensors["g"]).unsqueeze(0),
            beta=(tensors["b"] if fused else tensors["beta"]).unsqueeze(0),
            scale=problem["scale"] if problem["scale"] is not None else 1.0 / math.sqrt(problem["K"]),
            initial_state=tensors["h0"] if problem["has_h0"] else None,
            output_final_state=bool(problem["has_hT"]),
            use_qk_l2norm_in_kernel=bool(problem["use_qk_l2norm"]),
            state_v_first=problem["state_layout"] == "v_major",
            cu_seqlens=tensors["cu_seqlens"].to(device=device, dtype=torch.long),
        )
        if fused:
            kwargs.update(use_gate_in_kernel=True, A_log=tensors["A_log"], dt_bias=tensors["dt_bias"],
                          use_beta_sigmoid_in_kernel=True,
                          allow_neg_eigval=bool(problem["allow_negative_eigenvalues"]))
        if self.variant == "chunk":
            kwargs["cu_seqlens_cpu"] = tensors["cu_seqlens"].to(device="cpu", dtype=torch.long)
        # Keyword arguments throughout: fused_recurrent's positional order is q, k, v, g, gk, gv, beta.
        o, final_state = kernel(**kwargs)
        outputs = {"o": o.squeeze(0)}
        if problem["has_hT"]:
            if final_state is None:
                raise RuntimeError("fla returned no final state although output_final_state=True")
            outputs["hT"] = final_state
        return outputs


CHUNK = FlaImplementation("chunk")
FUSED_RECURRENT = FlaImplementation("fused_recurrent")
