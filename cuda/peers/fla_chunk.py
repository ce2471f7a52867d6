#!/usr/bin/env python3
"""Peer run: flash-linear-attention's chunk_gated_delta_rule at the shapes of
cuda/bench/chunked_bench.cpp, with the same counters.

bf16 q/k/v, fp32 g (log-space, log U[0.9, 1]) and beta (U[0, 1)), K = V = 128, in-kernel
l2norm, fp32 initial state [N, HV, K, V] read and final state written, packed sequences with
cu_seqlens (B = 1). Counters as ours: tokens/s, TFLOP/s at the same FLOP count
(4 C (K + V) + 6 K V per token per value head, C = 64), minimal bytes over time as a fraction
of the device-to-device copy bandwidth measured here.

Times are triton.testing.do_bench medians (CUDA events around each call, Python launch cost
included, as in our launch-per-iteration benchmark). --breakdown also records each shape's
device time per kernel (torch.profiler, mean of 20 calls) under "breakdown". Results are
rewritten atomically to --out (default $OUT/peer_fla_chunk.json, the result set's name) after
every shape, so a timeout keeps what was measured.

    python3 cuda/peers/fla_chunk.py --out results/h100/peer_fla_chunk.json --commit abc1234 [--only a,b]
    python3 cuda/peers/fla_chunk.py --warmup     # compile and autotune only, writes nothing kept
"""
import json
import os
import sys

import torch
from triton.testing import do_bench

from fla.ops.gated_delta_rule import chunk_gated_delta_rule

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402

K = V = 128
C = 64
PATH = ""  # --out (the warm-up writes a scratch file)





def breakdown(fn, name, results, calls=20):
    """Device time per kernel of one call (mean over `calls` profiled calls), with torch.profiler:
    where fla's time goes, stage by stage (--breakdown)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = e.cuda_time_total
        if us > 0:
            kernels[e.key] = kernels.get(e.key, 0.0) + us / calls
    total = sum(kernels.values())
    entry = {"name": name, "calls": calls, "total_kernel_us": total,
             "kernels_us": dict(sorted(kernels.items(), key=lambda kv: -kv[1]))}
    results.setdefault("breakdown", []).append(entry)
    peer_common.write(PATH, results)
    print(json.dumps(entry), flush=True)


def main():
    global PATH
    parser = peer_common.parser(__doc__.split("\n\n")[0], "peer_fla_chunk.json")
    parser.add_argument("--only", default="", help="comma-separated shape names (default: all)")
    parser.add_argument("--breakdown", action="store_true", help="also record the device time per kernel")
    parser.add_argument("--warmup", action="store_true", help="compile and autotune only (nothing kept)")
    args = parser.parse_args()
    PATH = "/tmp/fla_chunk_warmup.json" if args.warmup else args.out
    results = peer_common.header("flash-linear-attention chunk_gated_delta_rule", "fla", args,
                                 "triton.testing.do_bench median, warmup 25 ms, rep 200 ms",
                                 dtypes="q, k, v bf16; g, beta fp32; h0, hT fp32; l2norm in kernel")
    copy_bw = 1.0 if args.warmup else peer_common.copy_bandwidth()
    results["copy_GBps"] = copy_bw * 1e-9
    peer_common.write(PATH, results)
    print(f"copy bandwidth {copy_bw * 1e-9:.1f} GB/s", flush=True)
    only = args.only
    for name, H, HV, lengths in peer_common.SHAPES:
        if only and name not in only.split(","):
            continue
        T, N = sum(lengths), len(lengths)
        torch.manual_seed(0)
        dev = "cuda"
        q = torch.randn(1, T, H, K, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, T, H, K, device=dev, dtype=torch.bfloat16)
        v = torch.randn(1, T, HV, V, device=dev, dtype=torch.bfloat16)
        g = torch.log(0.9 + 0.1 * torch.rand(1, T, HV, device=dev, dtype=torch.float32))
        beta = torch.rand(1, T, HV, device=dev, dtype=torch.float32)
        h0 = 0.5 * torch.randn(N, HV, K, V, device=dev, dtype=torch.float32)
        cu_list = [0]
        for length in lengths:
            cu_list.append(cu_list[-1] + length)
        cu = torch.tensor(cu_list, dtype=torch.long, device=dev)
        cu_cpu = cu.cpu()

        def fn():
            return chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                                          use_qk_l2norm_in_kernel=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)

        if args.warmup:
            # Compile and autotune only (Triton caches the binaries on disk): run while the
            # GPU does other work, so that the timed run later measures no compilation.
            try:
                fn()
            except TypeError:
                chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                                       use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
            torch.cuda.synchronize()
            print(f"warm: {name}", flush=True)
            continue
        try:
            fn()
            torch.cuda.synchronize()
            t = do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e-3
        except TypeError:  # an fla without cu_seqlens_cpu
            def fn():
                return chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                                              use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
            fn()
            torch.cuda.synchronize()
            t = do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e-3
        if args.breakdown:
            breakdown(fn, name, results)
        flops = T * HV * (4.0 * C * (K + V) + 6.0 * K * V)
        min_bytes = T * (2 * H * K + 2 * HV * V) * 2 + T * HV * 2 * 4 + 2 * N * HV * K * V * 4
        entry = {"name": name, "H": H, "HV": HV, "T": T, "sequences": N, "ms": t * 1e3,
                 "tokens_per_s": T / t, "TFLOPs": flops / t * 1e-12, "GBps": min_bytes / t * 1e-9,
                 "fraction_of_copy": min_bytes / t / copy_bw}
        results["results"].append(entry)
        peer_common.write(PATH, results)
        print(json.dumps(entry), flush=True)
        del q, k, v, g, beta, h0
        torch.cuda.empty_cache()
    results["complete"] = True
    peer_common.write(PATH, results)


if __name__ == "__main__":
    main()
