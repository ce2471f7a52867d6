"""Reading and writing safetensors files with torch, through the `safetensors` package when it
is installed and through a small built-in codec when it is not (a GPU machine may have torch
and Triton but not safetensors, and cannot reach a package index).

The built-in codec follows the format as docs/case_files.md and upstream describe it:
8-byte little-endian header length, a JSON header (tensor name -> dtype, shape, data_offsets;
optional "__metadata__" of strings) padded with spaces to a multiple of 8, then the tensors'
bytes back to back, in name order, covering the buffer exactly. Set GDN_SAFETENSORS=builtin to
force it (the tests do, to check it against the package).
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


def _package():
    if os.environ.get("GDN_SAFETENSORS") == "builtin":
        return None
    try:
        import safetensors.torch  # noqa: F401
        from safetensors import safe_open
        return safe_open
    except ImportError:
        return None


def backend() -> str:
    return "safetensors" if _package() else "builtin"


def load(path) -> tuple[dict, dict]:
    """(tensors on the CPU, metadata strings) of a safetensors file."""
    safe_open = _package()
    if safe_open is not None:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {name: f.get_tensor(name) for name in f.keys()}, dict(f.metadata() or {})
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (length,) = struct.unpack("<Q", data[:8])
    if length > len(data) - 8 or length > 100_000_000:
        raise ValueError(f"{path}: header length {length} exceeds the file")
    header = json.loads(data[8:8 + length].decode("utf-8"))
    metadata = header.pop("__metadata__", {}) or {}
    buffer = memoryview(data)[8 + length:]
    tensors = {}
    for name, entry in header.items():
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor '{name}' has dtype {entry['dtype']} the built-in codec does not read")
        begin, end = entry["data_offsets"]
        shape = [int(x) for x in entry["shape"]]
        raw = bytes(buffer[begin:end])
        if end - begin == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            tensors[name] = torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape).clone()
    return tensors, {str(k): str(v) for k, v in metadata.items()}


def _bytes_of(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8) if tensor.numel() else None
    if flat is None:
        return b""
    try:
        return flat.numpy().tobytes()
    except (RuntimeError, TypeError, ImportError):  # torch without numpy
        return bytes(flat.tolist())


def save(tensors: dict, path, metadata: dict) -> None:
    """Writes path directly (callers rename a temporary file over the target)."""
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    if _package() is not None:
        from safetensors.torch import save_file
        save_file(tensors, str(path), metadata=metadata)
        return
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype not in _NAMES:
            raise ValueError(f"tensor '{name}' has dtype {t.dtype} the built-in codec does not write")
        raw = _bytes_of(t)
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in chunks:
            f.write(raw)
