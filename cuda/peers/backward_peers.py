#!/usr/bin/env python3
"""Peer run of the backward: fla's chunk_gated_delta_rule (Triton backend, FLA_FLASH_QLA=0) and
FlashQLA's chunk_gated_delta_rule under autograd, at the shapes of cuda/bench/backward_bench.cpp,
with their run-to-run determinism.

bf16 q/k/v and dO, fp32 g (log-space, log U[0.9, 1]) and beta (U[0, 1)), K = V = 128,
in-kernel l2norm, fp32 initial state [N, HV, K, V], final state output with an fp32 dhT
cotangent, packed sequences with cu_seqlens (B = 1), as our benchmark. The forward runs once;
the time is that of torch.autograd.grad over (q, k, v, g, beta, h0) with the graph retained
(the library's backward kernels, including whatever forward they recompute), a
triton.testing.do_bench median. Determinism: the backward run twice more on the same graph,
and for every gradient the number of elements whose bits differ between the two runs.
Results are rewritten atomically to --out after every shape.

    python3 cuda/peers/backward_peers.py --backend fla_triton --out $OUT/peer_backward_fla.json --commit abc1234
    python3 cuda/peers/backward_peers.py --backend flash_qla --out $OUT/peer_backward_flash_qla.json
    python3 cuda/peers/backward_peers.py --backend flash_qla --warmup   # compile only
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

K = V = 128



def differing(a, b):
    """Elements of a and b whose bits differ."""
    import torch
    if a is None or b is None:
        return None
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return int((a.contiguous().view(width) != b.contiguous().view(width)).sum().item())


def main():
    import torch
    from triton.testing import do_bench
    import peer_common

    parser = peer_common.parser(__doc__.split("\n\n")[0], "peer_backward.json")
    parser.add_argument("--backend", choices=["fla_triton", "flash_qla"], required=True)
    parser.add_argument("--only", default="", help="comma-separated shape names (default: all)")
    parser.add_argument("--warmup", action="store_true", help="compile and autotune only (nothing kept)")
    args = parser.parse_args()
    if args.backend == "fla_triton":
        os.environ["FLA_FLASH_QLA"] = "0"  # fla's own switch (read at call time): its Triton kernels
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        package, peer = "fla", "flash-linear-attention chunk_gated_delta_rule backward (Triton, FLA_FLASH_QLA=0)"
    else:
        from flash_qla import chunk_gated_delta_rule
        package, peer = "flash_qla", "FlashQLA chunk_gated_delta_rule backward"
    path = "/tmp/backward_warmup.json" if args.warmup else args.out
    results = peer_common.header(peer, package, args, "triton.testing.do_bench median of torch.autograd.grad, "
                                 "warmup 25 ms, rep 200 ms", backend=args.backend,
                                 dtypes="q, k, v, dO bf16; g, beta fp32; h0, hT, dhT fp32; l2norm in kernel")
    peer_common.write(path, results)
    for name, H, HV, lengths in peer_common.SHAPES:
        if args.only and name not in args.only.split(","):
            continue
        T, N = sum(lengths), len(lengths)
        torch.manual_seed(0)
        dev = "cuda"
        q = torch.randn(1, T, H, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(1, T, H, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(1, T, HV, V, device=dev, dtype=torch.bfloat16, requires_grad=True)
        g = torch.log(0.9 + 0.1 * torch.rand(1, T, HV, device=dev, dtype=torch.float32)).requires_grad_()
        beta = torch.rand(1, T, HV, device=dev, dtype=torch.float32).requires_grad_()
        h0 = (0.5 * torch.randn(N, HV, K, V, device=dev, dtype=torch.float32)).requires_grad_()
        dO = torch.randn(1, T, HV, V, device=dev, dtype=torch.bfloat16)
        dhT = torch.randn(N, HV, K, V, device=dev, dtype=torch.float32)
        cu_list = [0]
        for length in lengths:
            cu_list.append(cu_list[-1] + length)
        cu = torch.tensor(cu_list, dtype=torch.long, device=dev)
        entry = {"name": name, "H": H, "HV": HV, "T": T, "sequences": N}
        try:
            o, hT = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                                           use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
            inputs = (q, k, v, g, beta, h0)

            def backward():
                return torch.autograd.grad((o, hT), inputs, grad_outputs=(dO, dhT), retain_graph=True,
                                           allow_unused=True)

            first = backward()
            torch.cuda.synchronize()
            if args.warmup:
                print(f"warm: {name}", flush=True)
                continue
            t = do_bench(backward, warmup=25, rep=200, return_mode="median") * 1e-3
            a, b = backward(), backward()
            torch.cuda.synchronize()
            names = ["dq", "dk", "dv", "dg", "dbeta", "dh0"]
            entry.update({"ms": t * 1e3, "tokens_per_s": T / t,
                          "finite": int(all(x is None or bool(torch.isfinite(x).all()) for x in first))})
            for n, x, y in zip(names, a, b):
                if x is not None:
                    entry[f"differing_{n}"] = differing(x, y)  # elements whose bits differ between two runs
                    entry[f"elements_{n}"] = x.numel()
            del first, a, b
        except Exception as e:  # noqa: BLE001 - recorded as this shape's error, the run goes on
            entry["error"] = f"{type(e).__name__}: {e}"
            results.setdefault("errors", []).append(entry)  # not a timing: kept out of "results"
            peer_common.write(path, results)
            print(json.dumps(entry), flush=True)
            continue
        results["results"].append(entry)
        peer_common.write(path, results)
        print(json.dumps(entry), flush=True)
        del q, k, v, g, beta, h0, dO, dhT
        torch.cuda.empty_cache()
    results["complete"] = True
    peer_common.write(path, results)


if __name__ == "__main__":
    main()
