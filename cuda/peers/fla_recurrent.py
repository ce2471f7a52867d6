#!/usr/bin/env python3
"""Peer run: flash-linear-attention's fused_recurrent_gated_delta_rule at the shapes of
cuda/bench/decode_bench.cpp and cuda/bench/recurrent_bench.cpp, with the same counters.

Decode: B requests x 1 token, H = 16, HV = 32, K = V = 128, bf16 q/k/v, fp32 g/beta, in-kernel
l2norm, fp32 initial state [B, HV, K, V] read and final state written (fla has no in-place
state-cache path in this function: it reads h0 and writes a new ht, the same bytes as ours).
Prefill: packed batches (B = 1 with cu_seqlens), dense h0/hT, same dtypes.

Times are triton.testing.do_bench medians: CUDA events around each call, after do_bench's L2
flush (a 256 MB zero fill), which keeps the GPU busy while Python enqueues, so most of the
launch cost is hidden. Decode also gets `held_ms`: the median of events around each call with
the stream held by a spin kernel (torch.cuda._sleep) until the call is enqueued, the method of
our benchmarks' held rows (cuda/bench/bench_common.hpp), no flush (the states of 64 or more
requests do not fit in L2 anyway). Results are rewritten atomically to --out (default
$OUT/peer_fla_recurrent.json, the result set's name) after every shape, so a timeout keeps what
was measured.

    python3 cuda/peers/fla_recurrent.py --out results/h200/peer_fla_recurrent.json --commit abc1234 [--only decode]
    python3 cuda/peers/fla_recurrent.py --one-decode   # five one-request calls, for a profiler
"""
import json
import os
import sys

import torch
from triton.testing import do_bench

from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402

H, HV, K, V = 16, 32, 128, 128
PATH = ""  # --out




def inputs(T, N, dev="cuda"):
    torch.manual_seed(0)
    q = torch.randn(1, T, H, K, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, T, H, K, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, T, HV, V, device=dev, dtype=torch.bfloat16)
    g = torch.log(0.9 + 0.1 * torch.rand(1, T, HV, device=dev, dtype=torch.float32))
    beta = torch.rand(1, T, HV, device=dev, dtype=torch.float32)
    h0 = 0.5 * torch.randn(N, HV, K, V, device=dev, dtype=torch.float32)
    return q, k, v, g, beta, h0


def held_median(fn, reps=100):
    """Median seconds of fn between two events, the stream held until fn is enqueued."""
    times = []
    for _ in range(reps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)  # spin long enough for fn to be enqueued behind it
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1e-3)
    times.sort()
    return times[len(times) // 2]


def record(results, kind, shape, seconds, state_bytes, T, copy_bw, held=None):
    entry = dict(shape, kind=kind, ms=seconds * 1e3, state_GBps=state_bytes / seconds * 1e-9,
                 fraction_of_copy=state_bytes / seconds / copy_bw, tokens_per_s=T / seconds,
                 state_MB=state_bytes * 1e-6)
    if held is not None:
        entry.update(held_ms=held * 1e3, held_fraction_of_copy=state_bytes / held / copy_bw)
    results["results"].append(entry)
    peer_common.write(PATH, results)
    print(json.dumps(entry), flush=True)


def one_decode():
    """--one-decode: five one-request decode calls and nothing else (for a profiler)."""
    q, k, v, g, beta, h0 = inputs(1, 1)
    q, k, v = (x.view(1, 1, *x.shape[2:]) for x in (q, k, v))
    g, beta = (x.view(1, 1, HV) for x in (g, beta))
    for _ in range(5):
        fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                                         use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()


def main():
    global PATH
    parser = peer_common.parser(__doc__.split("\n\n")[0], "peer_fla_recurrent.json")
    parser.add_argument("--only", default="", choices=["", "decode", "prefill"], help="one kind only")
    parser.add_argument("--one-decode", action="store_true", help="five one-request decode calls, nothing written")
    args = parser.parse_args()
    if args.one_decode:
        return one_decode()
    PATH = args.out
    results = peer_common.header("flash-linear-attention fused_recurrent_gated_delta_rule", "fla", args,
                                 "triton.testing.do_bench median, warmup 25 ms, rep 100 ms")
    copy_bw = peer_common.copy_bandwidth()
    results["copy_GBps"] = copy_bw * 1e-9
    peer_common.write(PATH, results)
    print(f"copy bandwidth {copy_bw * 1e-9:.1f} GB/s", flush=True)

    only = args.only
    if only in ("", "decode"):
        for batch in (1, 64, 256, 1024):
            q, k, v, g, beta, h0 = inputs(batch, batch)
            # Decode layout: [B, 1, ...] without cu_seqlens.
            q, k, v = (x.view(batch, 1, *x.shape[2:]) for x in (q, k, v))
            g, beta = (x.view(batch, 1, HV) for x in (g, beta))
            fn = lambda: fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0,
                                                          output_final_state=True,
                                                          use_qk_l2norm_in_kernel=True)
            fn()
            torch.cuda.synchronize()
            t = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3
            held = held_median(fn)
            state_bytes = 2 * batch * HV * K * V * 4
            record(results, "decode", {"batch": batch}, t, state_bytes, batch, copy_bw, held)
            del q, k, v, g, beta, h0
            torch.cuda.empty_cache()

    if only in ("", "prefill"):
        mix = [4096, 17, 1000, 0, 2048, 333, 64, 1500]
        for sequences, length in ((1, 8192), (4, 4096), (16, 1024), (64, 256), (8, 0)):
            lengths = [length] * sequences if length > 0 else [mix[n % 8] for n in range(sequences)]
            T = sum(lengths)
            cu = torch.tensor([0] + list(torch.cumsum(torch.tensor(lengths), 0).tolist()),
                              dtype=torch.long, device="cuda")
            q, k, v, g, beta, h0 = inputs(T, sequences)
            fn = lambda: fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0,
                                                          output_final_state=True,
                                                          use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
            fn()
            torch.cuda.synchronize()
            t = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3
            state_bytes = 2 * sequences * HV * K * V * 4
            record(results, "prefill", {"sequences": sequences, "length": length, "T": T}, t,
                   state_bytes, T, copy_bw)
    results["complete"] = True
    peer_common.write(PATH, results)


if __name__ == "__main__":
    main()
