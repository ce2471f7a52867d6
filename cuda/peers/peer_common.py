"""What every peer script shares: its command line, the result file's header (device, date,
commit, command, versions), the copy bandwidth that the reports divide by, and the atomic write
(the file is rewritten after every shape, so a timeout keeps what was measured)."""
import argparse
import datetime
import json
import os
import sys

import torch
import triton
from triton.testing import do_bench


# The named shapes of cuda/bench/bench_common.cpp's peer_shapes() (the first six): name, H, HV,
# sequence lengths; bf16, K = V = 128, l2norm, h0 and hT.
SHAPES = [
    ("qwen3next_4x8192", 16, 32, [8192] * 4),
    ("qwen3next_1x32768", 16, 32, [32768]),
    ("qwen35_4x8192", 16, 64, [8192] * 4),
    ("lowpar_1x32768", 2, 8, [32768]),
    ("varlen_pack", 16, 32, [1, 17, 64, 65, 300, 1000, 4000, 8192, 2048, 513, 3000, 129]),
    ("qwen3next_8x4096", 16, 32, [4096] * 8),
]


def parser(description, default_name):
    """The options every peer takes; a script adds its own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), default_name),
                   help="the peer JSON to write (default: %(default)s)")
    p.add_argument("--commit", default="", help="gdn-testbed's commit this ran beside")
    p.add_argument("--command", default=None, help="the command to record (default: this one)")
    return p


def header(peer, package, args, timing, **extra):
    """The result file's provenance and versions."""
    props = torch.cuda.get_device_properties(0)
    return {
        "peer": peer,
        "fla_version": getattr(__import__(package), "__version__", "?"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "device": f"{props.name} ({props.multi_processor_count} SMs)",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": args.commit,
        "command": args.command or " ".join(["python3"] + sys.argv),
        "timing": timing,
        **extra,
        "results": [],
    }


def write(path, results):
    """Atomic: a reader sees the old file or the new one, never a torn one."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=2)
    os.replace(tmp, path)


def copy_bandwidth(nbytes=2 << 30):
    """Bytes read plus bytes written per second of a device-to-device copy (median)."""
    src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = do_bench(lambda: dst.copy_(src), warmup=50, rep=200, return_mode="median") * 1e-3
    return 2.0 * nbytes / t
