"""FlashQLA (the `flash-qla` wheel, module `flash_qla`) under gdn-testbed's oracle, for the case-file
driver (gdn_adapter.py --impl flash_qla.chunk). The in-process adapter, with the precision design
this library is judged by, is python/gdn_testbed/adapters/flash_qla.py; this file is the same call
behind the driver's interface (NAME, FORMULATION, CHUNK_SIZE, versions, run).

Conventions (flash_qla 0.1.3, read from its source): fla's, q, k [B, T, H, K], v [B, T, HV, V],
g (log space) and beta [B, T, HV], B = 1 with cu_seqlens (int64), GVA HV % H == 0, states [N, HV,
K, V] fp32 (state_v_first=True: [N, HV, V, K]). bf16 / fp16 q, k, v and K = V = 128 only, direct
gates only, one dense state per sequence, no per-token states, no empty sequence (its context-
parallel planner raises): everything else is Unsupported, with the reason.
"""
from __future__ import annotations

import math

from adapter_api import Unsupported


class FlashQlaChunk:
    NAME = "flash_qla.chunk_gated_delta_rule"
    FORMULATION = "chunked"
    CHUNK_SIZE = 64

    def versions(self) -> dict[str, str]:
        from importlib.metadata import PackageNotFoundError, version
        out = {}
        for package in ("flash-qla", "tilelang"):
            try:
                out[package] = version(package)
            except PackageNotFoundError:
                pass
        return out

    def supports(self, problem: dict) -> str | None:
        lengths = [b - a for a, b in zip(problem["cu_seqlens"], problem["cu_seqlens"][1:])]
        if problem["input_dtype"] not in ("bf16", "f16"):
            return "FlashQLA takes bf16 and fp16 q, k, v only"
        if problem["K"] != 128 or problem["V"] != 128:
            return "FlashQLA's kernels are built for K = V = 128"
        if any(n == 0 for n in lengths):
            return "an empty sequence: FlashQLA 0.1.3 raises on one"
        if problem["gate_mode"] == "fused":
            return "no fused gates: FlashQLA takes g in log space and beta"
        if problem["state_slots"] > 0:
            return "state cache with state_indices: one dense state per sequence"
        if problem["store_intermediate_states"]:
            return "intermediate states: not an output of FlashQLA"
        return None

    def run(self, problem: dict, tensors: dict) -> dict:
        import torch
        reason = self.supports(problem)
        if reason:
            raise Unsupported(reason)
        from flash_qla import chunk_gated_delta_rule
        device = tensors["q"].device
        o, final_state = chunk_gated_delta_rule(
            q=tensors["q"].unsqueeze(0), k=tensors["k"].unsqueeze(0), v=tensors["v"].unsqueeze(0),
            g=tensors["g"].unsqueeze(0), beta=tensors["beta"].unsqueeze(0),
            scale=problem["scale"] if problem["scale"] is not None else 1.0 / math.sqrt(problem["K"]),
            initial_state=tensors["h0"] if problem["has_h0"] else None, output_final_state=bool(problem["has_hT"]),
            use_qk_l2norm_in_kernel=bool(problem["use_qk_l2norm"]),
            cu_seqlens=tensors["cu_seqlens"].to(device=device, dtype=torch.long),
            state_v_first=problem["state_layout"] == "v_major")
        outputs = {"o": o.squeeze(0)}
        if problem["has_hT"]:
            outputs["hT"] = final_state
        return outputs


CHUNK = FlashQlaChunk()
