"""Golden vectors from flash-linear-attention's pure-torch naive functions (see README).

fla.ops.gated_delta_rule.naive holds `naive_recurrent_gated_delta_rule` and
`naive_chunk_gated_delta_rule`: plain torch, no Triton. Importing the package also imports its
Triton kernels (without a GPU it warns and rolls back to CPU), but none of them is called.
These functions have no in-kernel l2norm and no GVA: l2norm cases are generated with unit keys
and the flag off (name suffix "-unit_keys"), and q/k heads are repeated by this script.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # `python -I` drops it
import cases  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import fla  # noqa: E402
from fla.ops.gated_delta_rule import naive  # noqa: E402

MODULE = "fla.ops.gated_delta_rule.naive"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    recurrent = naive.naive_recurrent_gated_delta_rule
    chunk = naive.naive_chunk_gated_delta_rule
    functions = ["%s.%s" % (MODULE, f.__name__) for f in (recurrent, chunk)]
    torch.set_num_threads(1)  # deterministic reductions, and the machine's cores are shared

    out_cases = []
    for index, c in enumerate(cases.CASES):
        if c["only"] not in (None, "fla"):
            continue
        name = c["name"] + ("-unit_keys" if c["l2norm"] else "")
        x = cases.make_inputs(index, c, False)

        def peer(key):
            t = x[key]
            if key in ("q", "k"):
                t = cases.repeat_heads(t, c["HV"])
            return torch.from_numpy(np.ascontiguousarray(t))  # float64: the function casts to fp32
        q, k, v, g, beta = (peer(n) for n in ("q", "k", "v", "g", "beta"))
        h0 = torch.from_numpy(x["h0"]) if x["h0"] is not None else None
        results = []
        # Keywords throughout: the recurrent one takes (q, k, v, beta, g), the chunk one (q, k, v, g, beta).
        runs = (
            (recurrent, functions[0], "recurrent", 0,
             lambda: recurrent(q=q, k=k, v=v, beta=beta, g=g, scale=c["scale"], initial_state=h0,
                               output_final_state=True)),
            (chunk, functions[1], "chunk", 64,
             lambda: chunk(q=q, k=k, v=v, g=g, beta=beta, chunk_size=64, scale=c["scale"],
                           initial_state=h0, output_final_state=True)),
        )
        for fn, fname, formulation, chunk_size, call_fn in runs:
            o, hT = call_fn()
            # They return o and the state in float32 whatever the input dtype.
            assert o.dtype == torch.float32 and hT.dtype == torch.float32
            o = o.detach().to(torch.float64).numpy()
            hT = hT.detach().to(torch.float64).numpy()
            call = ("%s(q=q, k=k, v=v, beta=beta, g=g, %sscale=%s, initial_state=%s, "
                    "output_final_state=True) with float64 [B,T,H,D] inputs%s" % (
                        fn.__name__, "chunk_size=64, " if chunk_size else "", c["scale"],
                        "h0" if h0 is not None else "None",
                        "; q/k heads repeated by the script" if c["HV"] != c["H"] else ""))
            results.append({
                "source": "fla-core %s %s" % (fla.__version__, fname),
                "formulation": formulation, "chunk_size": chunk_size, "call": call,
                "o": cases.tensor(cases.packed(o)), "hT": cases.tensor(hT),
            })
        c_rec = dict(c)
        out_cases.append({"name": name, "regime": c["regime"],
                          "problem": cases.problem_record(c_rec, False),
                          "inputs": cases.inputs_record(x), "results": results})
        print("%-34s done" % name, file=sys.stderr)

    note = ("normal import `from fla.ops.gated_delta_rule import naive` (pure torch) with python -I "
            "in a venv with fla-core; only the two naive functions are called")
    document = {"format": cases.FORMAT, "encoding": cases.ENCODING, "library": "fla",
                "generator": cases.generator_record(note, functions, ["torch", "fla-core", "numpy"]),
                "cases": out_cases}
    cases.write_atomic(args.out, document)


if __name__ == "__main__":
    main()
