#!/usr/bin/env python3
"""Case files for a campaign against an external kernel whose compile cost is per shape.

Why not `gdn-testbed generate`: its sampler draws H, HV, K, V, dtypes and every flag at random
for each case (fuzz/sample.cpp), and it has no option to pin them. flash-linear-attention's
Triton kernels compile (and the chunk path autotunes, 40-60 s) for every new combination of
head counts, head sizes, dtypes and flags, so a few hundred generated cases would be a few
hundred compilations. This script holds those fixed to a handful of *variants* and fuzzes what
costs the kernel nothing to vary: sequence count and lengths (0, 1, around the chunk size and
its multiples, random), gate regime, beta range, scale, and the data, from a seed.

The inputs follow fuzz::make_inputs (fuzz/inputs.cpp) distribution for distribution: q, v ~
N(0, 1) and k ~ N(0, 1) normalised to unit rows unless l2norm is on, each rounded once to the
input dtype; g by regime (no_decay 0, mild log U(0.9, 1), strong U(-5, -0.5), underflow mild
with one token in eight at -1e4); beta ~ U(0, beta_max); fused gates with A_log = log U(1, 16)
and the regime's dt_bias; h0 ~ N(0, 0.5^2) in fp32. They are not bit-identical to
make_inputs' (another random generator), so `gdn.generator` names this script as its source.
The files are format gdn-case/1 (docs/case_files.md); `gdn-testbed verify` reads them.

    python3 reports/campaign/make_cases.py --out DIR [--seed 1] [--plan fla|small|tiny]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import subprocess
import sys
from pathlib import Path

CHUNK = 64

# name: (H, HV, K, V, input dtype, problem flags, max tokens per case, share of the plan).
# One shape per head size keeps fla's compilations to a handful; the flags are Qwen3-Next's
# (l2norm in kernel, h0 and hT) unless the variant is about another one.
VARIANTS = {
    # First the problems fla's functions do not take (a state cache, fp64): they come back
    # SKIPPED at once, so even a run cut short by its time limit shows them.
    "state_cache_bf16": (2, 4, 64, 64, "bf16", {"state_slots": 6}, 512, 0.05),
    "f64_inputs": (1, 1, 16, 16, "f64", {}, 256, 0.03),
    # Then by importance: each new variant costs fla one round of compilation (and autotuning
    # for the chunk path), after which its cases run in milliseconds.
    "gva64_bf16": (2, 4, 64, 64, "bf16", {}, 2048, 0.22),
    "gva64_f32": (2, 4, 64, 64, "f32", {}, 2048, 0.16),
    "mha128_bf16": (1, 2, 128, 128, "bf16", {}, 1024, 0.16),
    "gva64_bf16_fused_gates": (2, 4, 64, 64, "bf16", {"gate_mode": "fused"}, 2048, 0.14),
    "gva64_f16_unit_keys": (2, 4, 64, 64, "f16", {"use_qk_l2norm": False, "has_h0": False}, 2048, 0.12),
    "gva64_f32_v_major": (2, 4, 64, 64, "f32", {"state_layout": "v_major"}, 2048, 0.12),
}
PLANS = {"fla": 300, "small": 60, "tiny": 16}
REGIMES = ("no_decay", "mild", "strong", "underflow")


def sequence_lengths(rng: random.Random, cap: int) -> list[int]:
    """Like fuzz/sample.cpp: lengths at and around the chunk size and its multiples, short
    ones, zero, one, and uniform ones, within the variant's token cap."""
    lengths, total = [], 0
    for _ in range(rng.randint(1, 4)):
        room = cap - total
        kind = rng.randint(0, 9)
        n = {0: 0, 1: 1, 2: CHUNK - 1, 3: CHUNK, 4: CHUNK + 1}.get(kind)
        if n is None:
            if kind in (5, 6):
                n = rng.randint(2, 12)
            elif kind == 7:
                n = rng.randint(2 * CHUNK - 2, 2 * CHUNK + 2) * rng.choice((1, 1, 4, 8))
            else:
                n = rng.randint(1, max(1, room))
        n = max(0, min(n, room))
        lengths.append(n)
        total += n
    return lengths


def make_case(variant: str, seed: int):
    import torch
    H, HV, K, V, dtype, flags, cap, _ = VARIANTS[variant]
    rng = random.Random(seed)
    lengths = sequence_lengths(rng, cap)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    T, N = cu[-1], len(lengths)
    problem = {"cu_seqlens": cu, "T": T, "H": H, "HV": HV, "K": K, "V": V,
               "scale": (0.25 + rng.random()) if rng.random() < 0.15 else None, "use_qk_l2norm": True,
               "has_h0": True, "has_hT": True, "state_layout": "k_major", "state_slots": 0,
               "store_intermediate_states": False, "input_dtype": dtype, "gate_dtype": "f32",
               "gate_mode": "direct", "allow_negative_eigenvalues": False}
    problem.update(flags)
    if problem["state_slots"]:
        problem["state_slots"] = max(problem["state_slots"], N)
        problem["has_h0"] = True
    options = {"regime": REGIMES[seed % len(REGIMES)], "beta_max": 2.0 if rng.random() < 0.25 else 1.0,
               "unit_keys": True, "state_scale": 0.5, "padding_fraction": 0.25 if problem["state_slots"] else 0.0}
    if problem["gate_mode"] == "fused":
        # beta = 2 sigmoid(b) in [0, 2) is what beta_max 2 means for fused gates.
        problem["allow_negative_eigenvalues"] = options["beta_max"] > 1

    dtypes = {"f64": torch.float64, "f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    dt = dtypes[dtype]
    g = torch.Generator().manual_seed(seed)
    normal = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    uniform = lambda *shape: torch.rand(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    q = normal(T, H, K)
    k = normal(T, H, K)
    if not problem["use_qk_l2norm"] and options["unit_keys"]:
        norms = k.norm(dim=-1, keepdim=True)
        k = torch.where(norms > 0, k / norms, k)
    v = normal(T, HV, V)
    tensors = {"cu_seqlens": torch.tensor(cu, dtype=torch.int64), "q": q.to(dt), "k": k.to(dt), "v": v.to(dt)}
    regime = options["regime"]
    if problem["gate_mode"] == "direct":
        if regime == "no_decay":
            gate = torch.zeros(T, HV, dtype=torch.float64)
        elif regime == "strong":
            gate = -0.5 - 4.5 * uniform(T, HV)
        else:
            gate = torch.log(0.9 + 0.1 * uniform(T, HV))
            if regime == "underflow":
                gate = torch.where(uniform(T, HV) < 0.125, torch.full_like(gate, -1e4), gate)
        tensors["g"] = gate.to(torch.float32).clamp(max=0.0)
        tensors["beta"] = (options["beta_max"] * uniform(T, HV)).to(torch.float32)
    else:
        bias = {"no_decay": -30.0, "strong": 1.0}.get(regime, -4.0)
        tensors["A_log"] = torch.log(1.0 + 15.0 * uniform(HV)).to(torch.float32)
        tensors["dt_bias"] = (bias + 0.5 * (uniform(HV) - 0.5)).to(torch.float32)
        a = normal(T, HV)
        if regime == "underflow":
            a = torch.where(uniform(T, HV) < 0.125, torch.full_like(a, 1e4), a)
        tensors["a"] = a.to(torch.float32)
        tensors["b"] = (2.0 * normal(T, HV)).to(torch.float32)
    if problem["has_h0"] or problem["state_slots"]:
        rows = problem["state_slots"] or N
        shape = (rows, HV, K, V) if problem["state_layout"] == "k_major" else (rows, HV, V, K)
        tensors["h0"] = (options["state_scale"] * normal(*shape)).to(torch.float32)
    if problem["state_slots"]:
        slots = list(range(problem["state_slots"]))
        rng.shuffle(slots)
        tensors["state_indices"] = torch.tensor(
            [-1 if rng.random() < options["padding_fraction"] else slots[n] for n in range(N)], dtype=torch.int32)
    generator = {"source": "reports/campaign/make_cases.py", "variant": variant, "seed": str(seed),
                 "input_options": options}
    return problem, tensors, generator


def commit() -> str:
    if os.environ.get("GDN_COMMIT"):
        return os.environ["GDN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plan", choices=sorted(PLANS), default="fla",
                        help="case count: fla 300 (the GPU campaign), small 60, tiny 16 (tests)")
    parser.add_argument("--cases", type=int, default=0, help="override the plan's case count")
    parser.add_argument("--variants", default="", help="comma-separated subset of: " + ", ".join(VARIANTS))
    args = parser.parse_args(argv)

    import torch  # noqa: F401  (fail early, before any file is written)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "adapters"))
    import case_io

    names = [n for n in args.variants.split(",") if n] or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"make_cases: unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    total = args.cases or PLANS[args.plan]
    weights = [VARIANTS[n][-1] for n in names]
    counts = [max(1, round(total * w / sum(weights))) for w in weights]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(shlex.quote(a) for a in ["python3", "reports/campaign/make_cases.py", *(argv or sys.argv[1:])])
    versions = json.dumps({"gdn-testbed": commit(), "torch": torch.__version__})
    manifest = {"format": "gdn-case-manifest/1", "command": command, "cases": []}
    index = 0
    for name, count in zip(names, counts):
        for i in range(count):
            seed = (args.seed * 1_000_003 + index) & 0xFFFFFFFF
            problem, tensors, generator = make_case(name, seed)
            file = f"case-{index:05d}.safetensors"
            metadata = {"gdn.format": "gdn-case/1", "gdn.problem": json.dumps(problem),
                        "gdn.generator": json.dumps(generator), "gdn.case_name": f"fla-campaign/{name}/{i}",
                        "gdn.versions": versions, "gdn.command": command}
            temporary = out / f".{file}.tmp"
            case_io.save(tensors, temporary, metadata)
            os.replace(temporary, out / file)
            manifest["cases"].append({"file": file, "name": metadata["gdn.case_name"], "variant": name})
            index += 1
    temporary = out / ".manifest.json.tmp"
    temporary.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(temporary, out / "manifest.json")
    print(f"make_cases: wrote {index} case files ({', '.join(f'{n} {c}' for n, c in zip(names, counts))}) to {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
