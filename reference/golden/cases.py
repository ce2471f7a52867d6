"""Golden-vector cases shared by the per-library generators (numpy only: no torch here).

Each case is a fixed-length batch [B, T0, ...], the only form the peers' torch functions take.
Inputs are drawn in float64 from a per-case seed and rounded once to float32, so the peers (which
cast to float32 inside) and our references (which read the stored doubles) see identical numbers.
The file stores the problem in OUR packed form: q, k [B*T0, H, K], v [B*T0, HV, V], g, beta
[B*T0, HV], h0 / hT [B, HV, K, V] (K-major), GVA un-repeated (the generators repeat q/k heads for
the peers). See README.md beside this file for the conventions of each library.
"""

import datetime
import json
import math
import os
import platform
import sys
import tempfile
from importlib import metadata

import numpy as np

FORMAT = "gdn-golden/1"
BASE_SEED = 20260211  # per-case seed = BASE_SEED + index in CASES


def case(name, B, T0, H, HV, K, V, l2norm, h0, regime, beta_max=1.0, scale=None, only=None):
    return dict(name=name, B=B, T0=T0, H=H, HV=HV, K=K, V=V, l2norm=l2norm, h0=h0,
                regime=regime, beta_max=beta_max, scale=scale, only=only)


# T0 values are chosen around the peers' chunk size 64 (1, 40, 50, 64, 65, 66, 67, 70, 75, 90, 130, 256) so
# the chunk functions run with padding (T0 % 64 != 0), without it, and over several chunks.
# With l2norm off, keys are drawn with unit norm so the recurrence is a contraction (docs/semantics.md §2).
CASES = [
    case("mha_unit_keys", 1, 64, 2, 2, 12, 12, False, False, "mild"),
    case("odd_sizes_l2norm_h0", 1, 70, 1, 1, 17, 33, True, True, "mild"),
    case("gva_l2norm_h0", 1, 67, 2, 4, 12, 8, True, True, "mild"),
    # transformers' own GVA (repeat_interleave inside the function), given the un-repeated heads.
    case("gva_transformers_internal", 1, 50, 1, 3, 12, 10, True, True, "mild", only="transformers"),
    case("strong_decay_gva", 1, 130, 1, 2, 24, 8, True, True, "strong"),
    case("no_decay_beta2_unit_keys", 1, 90, 1, 1, 16, 12, False, True, "no_decay", beta_max=2.0),
    case("batch3_h0", 3, 66, 2, 2, 8, 8, True, True, "mild"),
    case("underflow_resets_batch2", 2, 75, 1, 1, 12, 8, True, True, "underflow"),
    case("single_token_batch4", 4, 1, 1, 2, 8, 8, True, True, "mild"),
    case("long_sequence", 1, 256, 1, 1, 24, 8, True, True, "mild"),
    case("no_h0_gva_odd_strong", 2, 65, 1, 3, 9, 7, True, False, "strong"),
    # transformers has no scale argument (always K^-1/2); 0.375 is exact in float32.
    case("custom_scale_unit_keys", 1, 40, 1, 1, 20, 10, False, True, "mild", scale=0.375, only="fla"),
]


def f32(x):
    """Round float64 values to the nearest float32 and widen back (exact)."""
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float64)


def make_inputs(index, c, l2norm):
    """Inputs in the peers' layout [B, T0, heads, D], float64 holding float32 values.

    l2norm is the in-kernel flag the library will be given; with it off, keys have unit norm.
    """
    rng = np.random.default_rng(BASE_SEED + index)
    B, T0, H, HV, K, V = c["B"], c["T0"], c["H"], c["HV"], c["K"], c["V"]
    q = f32(rng.standard_normal((B, T0, H, K)))
    k = rng.standard_normal((B, T0, H, K))
    if not l2norm:
        k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    k = f32(k)
    v = f32(rng.standard_normal((B, T0, HV, V)))
    u = rng.random((B, T0, HV))
    if c["regime"] == "no_decay":
        g = np.zeros((B, T0, HV))
    elif c["regime"] == "mild":
        g = np.log(0.9 + 0.1 * u)
    elif c["regime"] == "strong":
        g = -0.5 - 4.5 * u
    elif c["regime"] == "underflow":
        # about one token in eight is a hard reset: exp(-1e4) is exactly 0 in float32
        g = np.where(rng.random((B, T0, HV)) < 0.125, -1e4, np.log(0.9 + 0.1 * u))
    else:
        raise ValueError("unknown regime " + c["regime"])
    g = np.minimum(0.0, f32(g))
    beta = f32(c["beta_max"] * rng.random((B, T0, HV)))
    h0 = f32(0.5 * rng.standard_normal((B, HV, K, V))) if c["h0"] else None
    return dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0)


def repeat_heads(x, HV):
    """GVA for peers without it: value head j reads query/key head j // (HV / H) (docs/semantics.md §1)."""
    H = x.shape[2]
    return np.repeat(x, HV // H, axis=2)


def packed(x):
    """[B, T0, heads, ...] -> [B*T0, heads, ...]: the fixed-length batch as a packed one."""
    return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


class Float32Array:
    """A tensor's data, every value a float32, written as JSON numbers in float32-shortest form."""

    def __init__(self, values):
        self.text = []
        for v in values:
            s = str(np.float32(v))  # shortest decimal that reads back as this float32
            # The C++ loader reads a double (strtod) and rounds it to float: check that this path
            # recovers the value too (it could differ from a direct read only on a tie).
            if np.float32(float(s)) != np.float32(v) or float(np.float32(v)) != float(v):
                raise ValueError("value %r does not round-trip as float32" % float(v))
            self.text.append(s)


def tensor(x):
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("non-finite value in a golden tensor")
    if not np.array_equal(f32(x), x):
        raise ValueError("a golden tensor holds a value that is not a float32")
    return {"shape": list(x.shape), "data": Float32Array(x.reshape(-1))}


def to_json(value):
    if isinstance(value, Float32Array):
        return "[" + ",".join(value.text) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k) + ":" + to_json(v) for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    return json.dumps(value, allow_nan=False)


def problem_record(c, l2norm):
    B, T0 = c["B"], c["T0"]
    return {
        "cu_seqlens": [b * T0 for b in range(B + 1)],
        "T": B * T0, "H": c["H"], "HV": c["HV"], "K": c["K"], "V": c["V"],
        "scale": c["scale"], "use_qk_l2norm": l2norm,
        "has_h0": c["h0"], "has_hT": True,
    }


def inputs_record(x):
    rec = {"q": tensor(packed(x["q"])), "k": tensor(packed(x["k"])), "v": tensor(packed(x["v"])),
           "g": tensor(packed(x["g"])), "beta": tensor(packed(x["beta"]))}
    if x["h0"] is not None:
        rec["h0"] = tensor(x["h0"])
    return rec


# Every number in a tensor's data is a float32 (inputs by construction, outputs because the peers
# compute and return float32), written in the shortest decimal form that reads back as that
# float32: about half the size of 17-digit doubles. Readers parse a double and round it to float.
ENCODING = "float32-shortest"


def generator_record(library_note, functions, distributions):
    versions = {"python": platform.python_version()}
    for d in distributions:
        versions[d] = metadata.version(d)
    if "torch" in sys.modules:  # the build tag (+cpu, +cu132) and where it ran
        torch = sys.modules["torch"]
        versions["torch.__version__"] = torch.__version__
        versions["torch_device"] = "cpu, %d thread" % torch.get_num_threads()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        # orig_argv keeps the interpreter's flags (-I matters: see README).
        "command": " ".join([os.path.basename(sys.orig_argv[0])] + sys.orig_argv[1:]),
        "seed": BASE_SEED,
        "seed_rule": "per-case numpy.random.default_rng(seed + case index in cases.py CASES)",
        "versions": versions,
        "functions": functions,
        "how_loaded": library_note,
    }


def write_atomic(path, document):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".golden-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(to_json(document))
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
