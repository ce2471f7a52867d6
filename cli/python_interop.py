"""Reads gdn-testbed case files with Python's safetensors package and writes outputs back.

    python3 python_interop.py FOLDER

For every case file in FOLDER: checks that safetensors reads it, that the metadata holds the
problem (docs/case_files.md), that every tensor has the shape the problem implies, decodes BF16 by
hand (numpy has no bfloat16), and writes out.o / out.hT filled with zeros through
safetensors.numpy.save_file (what an external implementation would do, with wrong outputs),
keeping every input tensor and metadata entry.
"""
import json
import os
import struct
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file


def raw_header(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        return header, 8 + length


def read_tensor(path, name, header, base):
    entry = header[name]
    begin, end = entry["data_offsets"]
    with open(path, "rb") as f:
        f.seek(base + begin)
        data = f.read(end - begin)
    if entry["dtype"] == "BF16":
        bits = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(entry["shape"])
    return None


def state_shape(p):
    rows = p["state_slots"] if p["state_slots"] > 0 else len(p["cu_seqlens"]) - 1
    tail = [p["K"], p["V"]] if p["state_layout"] == "k_major" else [p["V"], p["K"]]
    return [rows, p["HV"]] + tail


def main(folder):
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    assert files, "no case files"
    for name in files:
        path = os.path.join(folder, name)
        header, base = raw_header(path)
        tensors = {}
        with safe_open(path, framework="np") as f:
            meta = f.metadata()
            assert meta["gdn.format"] == "gdn-case/1", meta.get("gdn.format")
            p = json.loads(meta["gdn.problem"])
            for key in f.keys():
                if header[key]["dtype"] == "BF16":
                    tensors[key] = read_tensor(path, key, header, base)
                    continue
                tensors[key] = f.get_tensor(key)
        T, H, HV, K, V = p["T"], p["H"], p["HV"], p["K"], p["V"]
        assert list(tensors["q"].shape) == [T, H, K], (name, tensors["q"].shape)
        assert list(tensors["v"].shape) == [T, HV, V]
        assert tensors["cu_seqlens"].tolist() == p["cu_seqlens"]
        assert np.isfinite(tensors["q"]).all()
        if p["has_h0"] or p["state_slots"] > 0:
            assert list(tensors["h0"].shape) == state_shape(p)
        # Write outputs back, keeping the inputs byte for byte (BF16 re-read raw).
        out = {}
        with safe_open(path, framework="np") as f:
            for key in f.keys():
                if header[key]["dtype"] == "BF16":
                    continue
                out[key] = f.get_tensor(key)
        bf16 = [k for k in header if k != "__metadata__" and header[k]["dtype"] == "BF16"]
        if bf16:
            # numpy cannot hold bfloat16: carry the bits as float32 would change the dtype, so
            # such files are written with torch when it is there, else skipped for writing.
            try:
                import torch
                from safetensors.torch import save_file as save_torch
            except ImportError:
                pass  # written as an F32 problem below
            else:
                with safe_open(path, framework="pt") as f:
                    pt = {k: f.get_tensor(k) for k in f.keys()}
                pt["out.o"] = torch.zeros([T, HV, V], dtype=torch.float32)
                if p["has_hT"]:
                    pt["out.hT"] = torch.zeros(state_shape(p), dtype=torch.float32)
                if p["store_intermediate_states"]:
                    pt["out.intermediate"] = torch.zeros([T, HV] + state_shape(p)[2:], dtype=torch.float32)
                meta = dict(meta, **{"gdn.implementation": "python.zeros"})
                save_torch(pt, path + ".tmp", metadata=meta)
                os.replace(path + ".tmp", path)
                continue
            # Without torch: replace the BF16 file by an equivalent F32 problem (bf16 values are
            # exact in f32), so the C++ reader still sees a Python-written file.
            for key in bf16:
                out[key] = read_tensor(path, key, header, base)
            p["input_dtype"] = "f32"
            if p["gate_dtype"] == "bf16":
                p["gate_dtype"] = "f32"
            meta = dict(meta)
            meta["gdn.problem"] = json.dumps(p)
        out["out.o"] = np.zeros([T, HV, V], dtype=np.float32)
        if p["has_hT"]:
            out["out.hT"] = np.zeros(state_shape(p), dtype=np.float32)
        if p["store_intermediate_states"]:
            out["out.intermediate"] = np.zeros([T, HV] + state_shape(p)[2:], dtype=np.float32)
        meta = dict(meta, **{"gdn.implementation": "python.zeros"})
        save_file(out, path + ".tmp", metadata=meta)
        os.replace(path + ".tmp", path)
    print(f"python_interop: {len(files)} case files read and rewritten")


if __name__ == "__main__":
    main(sys.argv[1])
