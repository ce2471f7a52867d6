"""Golden vectors from transformers' Qwen3-Next torch functions (run with `python -I`, see README).

Must run in an environment where flash-linear-attention is NOT importable: transformers'
`use_kernel_func_from_hub_with_fallback` decorator replaces these functions by fla's kernels
at import time when `import fla` succeeds, and then they are no longer an independent
implementation. The script refuses to run unless the torch fallback is what it calls.
"""

import argparse
import importlib.util
import inspect
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # `python -I` drops it
import cases  # noqa: E402

import numpy as np  # noqa: E402

if importlib.util.find_spec("fla") is not None:
    sys.exit("gen_transformers.py: 'fla' is importable here (%s); run in an environment without "
             "flash-linear-attention, with `python -I`" % importlib.util.find_spec("fla").origin)

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.utils import is_flash_linear_attention_available, is_kernels_available  # noqa: E402
from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next  # noqa: E402

MODULE = "transformers.models.qwen3_next.modeling_qwen3_next"


def torch_path_check(fn):
    """The decorated function must dispatch to its own torch body, not to fla or a hub kernel."""
    closure = inspect.getclosurevars(fn).nonlocals
    if closure.get("is_new_implementation") is not False or closure.get("implementation") is not fn.__wrapped__:
        sys.exit("gen_transformers.py: %s does not dispatch to its torch fallback" % fn.__name__)
    if fn.__wrapped__.__module__ != MODULE:
        sys.exit("gen_transformers.py: %s comes from %s" % (fn.__name__, fn.__wrapped__.__module__))
    return "%s.%s" % (MODULE, fn.__name__)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    if is_flash_linear_attention_available() or is_kernels_available():
        sys.exit("gen_transformers.py: fla or the kernels hub is available; refusing")
    recurrent = qwen3_next.torch_recurrent_gated_delta_rule
    chunk = qwen3_next.torch_chunk_gated_delta_rule
    functions = [torch_path_check(recurrent), torch_path_check(chunk)]
    torch.set_num_threads(1)  # deterministic reductions, and the machine's cores are shared

    out_cases = []
    for index, c in enumerate(cases.CASES):
        if c["only"] not in (None, "transformers"):
            continue
        assert c["scale"] is None, "transformers' functions have no scale argument"
        x = cases.make_inputs(index, c, c["l2norm"])
        internal_gva = c["only"] == "transformers"
        def peer(name):
            t = x[name]
            if name in ("q", "k") and not internal_gva:
                t = cases.repeat_heads(t, c["HV"])
            return torch.from_numpy(np.ascontiguousarray(t))  # float64: the function casts to fp32
        q, k, v, g, beta = (peer(n) for n in ("q", "k", "v", "g", "beta"))
        h0 = torch.from_numpy(x["h0"]) if x["h0"] is not None else None
        results = []
        for fn, name, formulation, extra in ((recurrent, functions[0], "recurrent", {}),
                                             (chunk, functions[1], "chunk", {"chunk_size": 64})):
            o, hT = fn(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                       use_qk_l2norm_in_kernel=c["l2norm"], **extra)
            # They compute in float32 and cast o back to the input dtype; the final state stays
            # float32. Both must therefore hold float32 values exactly.
            o = o.detach().numpy().astype(np.float64)
            hT = hT.detach().to(torch.float64).numpy()
            assert np.array_equal(cases.f32(o), o) and np.array_equal(cases.f32(hT), hT)
            call = ("%s(q, k, v, g=g, beta=beta, initial_state=%s, output_final_state=True, "
                    "use_qk_l2norm_in_kernel=%s%s) with float64 [B,T,H,D] inputs%s" % (
                        name.rsplit(".", 1)[1], "h0" if h0 is not None else "None", c["l2norm"],
                        ", chunk_size=64" if extra else "",
                        "; un-repeated q/k heads (its own GVA)" if internal_gva
                        else ("; q/k heads repeated by the script" if c["HV"] != c["H"] else "")))
            results.append({
                "source": "transformers %s %s" % (transformers.__version__, name),
                "formulation": formulation, "chunk_size": 64 if extra else 0, "call": call,
                "o": cases.tensor(cases.packed(o)), "hT": cases.tensor(hT),
            })
        out_cases.append({"name": c["name"], "regime": c["regime"],
                          "problem": cases.problem_record(c, c["l2norm"]),
                          "inputs": cases.inputs_record(x), "results": results})
        print("%-28s done" % c["name"], file=sys.stderr)

    note = ("normal import of %s with python -I in a venv without fla-core; checked: "
            "importlib.util.find_spec('fla') is None, is_flash_linear_attention_available() and "
            "is_kernels_available() False, and the decorator closure has is_new_implementation=False "
            "(so the torch bodies run)" % MODULE)
    document = {"format": cases.FORMAT, "encoding": cases.ENCODING, "library": "transformers",
                "generator": cases.generator_record(note, functions,
                                                    ["torch", "transformers", "numpy"]),
                "cases": out_cases}
    cases.write_atomic(args.out, document)


if __name__ == "__main__":
    main()
