"""numpy and torch at the boundary.

The C++ core takes and returns numpy float64 (long double for the f80 references). Torch
tensors on any device are accepted wherever arrays are: they are copied to the CPU and widened
to float64 (``.detach().to("cpu", torch.float64).numpy()``), which is exact for every float
dtype. Towards a kernel, ``torch_inputs`` makes tensors in the storage dtypes on the device
asked for (copies from numpy; no DLPack sharing: the oracle keeps its own copy, so a kernel
that writes into its inputs cannot change what it is judged against). torch is imported only
when a torch tensor or device is involved.
"""
from __future__ import annotations

import sys

import numpy as np

# Storage dtype of each input tensor given the problem (docs/case_files.md).
# "alpha" is the direct decay of a problem with linear gates (gate_space "linear"), in place of "g".
_INPUT_DTYPE_KEYS = {"q": "input", "k": "input", "v": "input", "g": "gate", "alpha": "gate", "beta": "gate",
                     "a": "gate", "b": "gate", "A_log": "f32", "dt_bias": "f32", "h0": "state"}

_TORCH_DTYPES = {"f64": "float64", "f32": "float32", "bf16": "bfloat16", "f16": "float16"}
# numpy has no bfloat16: bf16 values are handed over as float32 (exactly representable).
_NUMPY_DTYPES = {"f64": np.float64, "f32": np.float32, "bf16": np.float32, "f16": np.float16}


def is_torch_tensor(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def as_numpy(x, dtype=np.float64) -> np.ndarray:
    """A numpy array (float64 by default) from numpy, a Python sequence or a torch tensor on any
    device (copied to the CPU)."""
    if is_torch_tensor(x):
        import torch
        target = torch.float64 if dtype == np.float64 else None
        t = x.detach()
        if target is not None and t.is_floating_point():
            t = t.to(device="cpu", dtype=target)
        else:
            t = t.to(device="cpu")
            if t.dtype == torch.bfloat16:
                t = t.to(torch.float32)
        return np.ascontiguousarray(t.numpy(), dtype=dtype)
    return np.ascontiguousarray(np.asarray(x), dtype=dtype)


def from_torch(x) -> np.ndarray:
    """A torch tensor (any device, any float dtype) as a float64 numpy array."""
    return as_numpy(x)


def as_numpy_inputs(inputs: dict) -> dict:
    out = {}
    for name, value in inputs.items():
        if value is None:
            continue
        if name in ("cu_seqlens", "state_indices"):
            out[name] = as_numpy(value, np.int64)
        else:
            out[name] = as_numpy(value)
    return out


def as_numpy_outputs(outputs: dict) -> dict:
    return {name: (None if value is None else as_numpy(value)) for name, value in outputs.items()}


def storage_dtype(problem, name: str) -> str:
    """The dtype an input is stored in: q, k, v input_dtype; g / alpha, beta, a, b gate_dtype; h0
    state_dtype; A_log, dt_bias f32."""
    kind = _INPUT_DTYPE_KEYS[name]
    if kind == "input":
        return problem.input_dtype
    if kind == "gate":
        return problem.gate_dtype
    if kind == "state":
        return problem.state_dtype
    return "f32"


def numpy_inputs(problem, inputs: dict) -> dict:
    """The inputs in their storage dtypes as numpy (bf16 as float32; cu_seqlens int64,
    state_indices int32)."""
    out = {}
    for name, value in inputs.items():
        if name == "cu_seqlens":
            out[name] = np.asarray(value, dtype=np.int64)
        elif name == "state_indices":
            out[name] = np.asarray(value, dtype=np.int32)
        else:
            out[name] = np.asarray(value, dtype=_NUMPY_DTYPES[storage_dtype(problem, name)])
    return out


def torch_inputs(problem, inputs: dict, device=None) -> dict:
    """The inputs as torch tensors in their storage dtypes (q, k, v in input_dtype; gates in
    gate_dtype; h0 in state_dtype; A_log, dt_bias float32; cu_seqlens int64; state_indices int32) on `device`
    (default: cuda when available, else cpu). Copies."""
    import torch
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    out = {}
    for name, value in inputs.items():
        if value is None:
            continue
        if name == "cu_seqlens":
            out[name] = torch.as_tensor(np.asarray(value, dtype=np.int64)).to(device)
        elif name == "state_indices":
            out[name] = torch.as_tensor(np.asarray(value, dtype=np.int32)).to(device)
        else:
            dtype = getattr(torch, _TORCH_DTYPES[storage_dtype(problem, name)])
            out[name] = torch.as_tensor(as_numpy(value)).to(device=device, dtype=dtype)
    return out


def to_torch(array, dtype: str = "f64", device="cpu"):
    """A numpy array as a torch tensor of the named dtype (f64, f32, bf16, f16) on `device`."""
    import torch
    return torch.as_tensor(as_numpy(array)).to(device=device, dtype=getattr(torch, _TORCH_DTYPES[dtype]))
