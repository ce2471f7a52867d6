#!/usr/bin/env python3
"""Runs an external implementation of the gated delta rule on gdn-testbed case files.

`gdn-testbed generate` writes case files (safetensors, format gdn-case/1, docs/case_files.md).
This driver reads each one, hands its problem and input tensors to an implementation, and
writes the implementation's outputs back as the `out.*` tensors, with `gdn.implementation`,
`gdn.formulation`, `gdn.chunk_size`, `gdn.versions` and `gdn.device`, keeping every other tensor
and metadata entry as it was. `gdn-testbed verify` then judges those outputs with the same
oracle and budgets as gdn-testbed's own kernels.

The interface an implementation provides (copy impl_naive_torch.py for another library)
----------------------------------------------------------------------------------------
An implementation is any Python object (a module or an instance) with:

    NAME: str         written to gdn.implementation, e.g. "fla.chunk_gated_delta_rule"
    FORMULATION: str  "chunked" or "sequential": which precision emulation calibrates the
                      budget (a chunked kernel is judged against the chunked fp32 emulation)
    CHUNK_SIZE: int   for "chunked" (64 unless the kernel uses another)
    def versions() -> dict[str, str]        library versions, merged into gdn.versions
    def run(problem: dict, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]

`run` receives
  problem  the case file's `gdn.problem` object exactly as docs/case_files.md defines it (keys
           cu_seqlens, T, H, HV, K, V, scale, use_qk_l2norm, has_h0, has_hT, state_layout,
           state_slots, store_intermediate_states, input_dtype, gate_dtype, gate_mode,
           allow_negative_eigenvalues);
  tensors  every input tensor of the file by its case-file name (cu_seqlens, q, k, v, g, beta
           or a, b, A_log, dt_bias, h0, state_indices: whichever the problem uses), in the
           file's dtypes, already on the device the driver was given, in gdn-testbed's
           conventions (docs/semantics.md section 1: packed [T, ...] without a batch
           axis, state [N, HV, K, V] K-major or [N, HV, V, K] when state_layout is v_major).
and returns {"o": [T, HV, V]} plus "hT" (problem.state_shape) when has_hT, plus
"intermediate" ([T, HV, K, V] in the state layout) when store_intermediate_states. Outputs may
be any float dtype on any device; the driver checks their shapes and writes them as they are
(normally o in the input dtype and states in fp32, what a kernel stores).

For a problem it cannot run, `run` raises Unsupported("reason") (adapter_api.Unsupported, or
any exception class of that name): the case is recorded as
SKIPPED with that reason, not as a failure. Any other exception is recorded as ERROR.

Usage
-----
    python3 reports/adapters/gdn_adapter.py --impl fla.chunk --device cuda \
        --out-dir runs/fla_chunk --log runs/fla_chunk.jsonl runs/cases/
    python3 reports/adapters/gdn_adapter.py --impl path/to/my_impl.py[:OBJECT] ...

Built-in implementations: naive (impl_naive_torch: the recurrence in torch, float64, any
device), fla.chunk and fla.fused_recurrent (impl_fla), flash_qla.chunk (impl_flash_qla). Case arguments are files or folders
(every *.safetensors inside, sorted). Without --out-dir the files are updated in place.
The log gets one JSON line per case, flushed as it goes (schema in reports/README.md).
Exit status: 0 when no case errored, 1 when some did, 3 when a device error (illegal address,
device-side assert) poisoned the CUDA context: rerun with --resume, which skips the cases the
log already holds.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import case_io  # noqa: E402
from adapter_api import PROBLEM_KEYS, describe, expected_outputs  # noqa: E402


# Errors after which a CUDA context cannot be trusted (sticky errors): the driver stops, exit 3.
FATAL_DEVICE_ERROR = re.compile(r"illegal memory access|illegal instruction|misaligned address|device-side assert|"
                                r"unspecified launch failure|CUDA error: an illegal|cudaErrorLaunchFailure", re.I)

BUILTIN = {
    "naive": ("impl_naive_torch", None),
    "fla.chunk": ("impl_fla", "CHUNK"),
    "fla.chunk_gated_delta_rule": ("impl_fla", "CHUNK"),
    "fla.fused_recurrent": ("impl_fla", "FUSED_RECURRENT"),
    "fla.fused_recurrent_gated_delta_rule": ("impl_fla", "FUSED_RECURRENT"),
    "flash_qla.chunk": ("impl_flash_qla", "CHUNK"),
    "flash_qla.chunk_gated_delta_rule": ("impl_flash_qla", "CHUNK"),
}

def load_implementation(spec: str):
    """A built-in name, or `path/to/file.py[:OBJECT]`, or `package.module[:OBJECT]`."""
    if spec in BUILTIN:
        module_name, attr = BUILTIN[spec]
        module = importlib.import_module(module_name)
        return getattr(module, attr) if attr else module
    target, _, attr = spec.partition(":")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise SystemExit(f"gdn_adapter: --impl: no such file '{target}'")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.path.insert(0, str(path.parent))
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as error:
            raise SystemExit(f"gdn_adapter: --impl: '{spec}' is not a built-in ({', '.join(BUILTIN)}), "
                             f"a .py file or an importable module: {error}")
    implementation = getattr(module, attr) if attr else module
    for required in ("NAME", "FORMULATION", "run"):
        if not hasattr(implementation, required):
            raise SystemExit(f"gdn_adapter: --impl '{spec}' has no '{required}' (see this file's docstring)")
    if implementation.FORMULATION not in ("chunked", "sequential"):
        raise SystemExit(f"gdn_adapter: --impl '{spec}': FORMULATION must be 'chunked' or 'sequential', "
                         f"got '{implementation.FORMULATION}'")
    return implementation


# --- case files ------------------------------------------------------------------------------

def read_case(path: Path):
    """(tensors on the CPU, metadata, problem) of a case file; torch, as numpy has no bf16."""
    tensors, metadata = case_io.load(path)
    if metadata.get("gdn.format") != "gdn-case/1":
        raise ValueError(f"{path}: not a gdn-testbed case file (gdn.format is "
                         f"{metadata.get('gdn.format')!r}, expected 'gdn-case/1')")
    if "gdn.problem" not in metadata:
        raise ValueError(f"{path}: metadata has no gdn.problem")
    problem = json.loads(metadata["gdn.problem"])
    missing = [key for key in PROBLEM_KEYS if key not in problem]
    if missing:
        raise ValueError(f"{path}: gdn.problem lacks {', '.join(missing)}")
    return tensors, metadata, problem


def write_atomically(path: Path, tensors: dict, metadata: dict) -> None:
    """safetensors file at path via a temporary file in the same folder and a rename, so a
    reader never sees half a file and an interrupted run leaves the old file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        case_io.save(tensors, temporary, metadata)
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


def device_name(device: str) -> str:
    import torch
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return device


def collect_cases(arguments: list[str]) -> list[Path]:
    cases: list[Path] = []
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            cases.extend(sorted(path.rglob("*.safetensors")))
        elif path.is_file():
            cases.append(path)
        else:
            raise SystemExit(f"gdn_adapter: no such case file or folder '{argument}'")
    return cases


def run_case(implementation, path: Path, out_path: Path, device: str, device_text: str,
             versions: dict, command: str) -> dict:
    """Runs one case; returns its log record. Writes out_path only when the run succeeded."""
    import torch
    record = {"file": str(path), "output": None, "implementation": implementation.NAME,
              "formulation": implementation.FORMULATION, "device": device_text,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "command": command, "versions": versions}
    tensors, metadata, problem = read_case(path)
    record.update({"case": metadata.get("gdn.case_name", path.stem), "problem": describe(problem),
                   "problem_json": problem})
    if "gdn.generator" in metadata:
        try:
            record["generator"] = json.loads(metadata["gdn.generator"])
        except json.JSONDecodeError:
            record["generator"] = metadata["gdn.generator"]
    inputs = {name: t.to(device) for name, t in tensors.items() if not name.startswith("out.")}
    started = time.perf_counter()
    try:
        outputs = implementation.run(problem, inputs)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    except Exception as error:
        # Matched by class name, so a copied implementation may define its own Unsupported.
        if type(error).__name__ == "Unsupported":
            record.update(status="SKIPPED", message=str(error), seconds=time.perf_counter() - started)
            return record
        # Any other failure of the implementation is a finding: record it and go on.
        record.update(status="ERROR", message=f"{type(error).__name__}: {error}",
                      seconds=time.perf_counter() - started)
        return record
    record["seconds"] = time.perf_counter() - started

    expected = expected_outputs(problem)
    problems = []
    for name, shape in expected.items():
        if name not in outputs or outputs[name] is None:
            problems.append(f"no '{name}' returned")
        elif list(outputs[name].shape) != shape:
            problems.append(f"'{name}' has shape {list(outputs[name].shape)}, expected {shape}")
        elif not outputs[name].is_floating_point():
            problems.append(f"'{name}' has dtype {outputs[name].dtype}, expected a float dtype")
    if problems:
        record.update(status="ERROR", message="; ".join(problems))
        return record

    written = {name: t for name, t in tensors.items() if not name.startswith("out.")}
    for name in expected:
        written["out." + name] = outputs[name].detach().to("cpu")
    metadata = dict(metadata)
    metadata["gdn.implementation"] = implementation.NAME
    metadata["gdn.formulation"] = implementation.FORMULATION
    if implementation.FORMULATION == "chunked":
        metadata["gdn.chunk_size"] = str(getattr(implementation, "CHUNK_SIZE", 64))
    else:
        metadata.pop("gdn.chunk_size", None)
    merged_versions = {}
    if "gdn.versions" in metadata:
        try:
            merged_versions = dict(json.loads(metadata["gdn.versions"]))
        except (json.JSONDecodeError, TypeError, ValueError):
            merged_versions = {"previous": metadata["gdn.versions"]}
    merged_versions.update(versions)
    metadata["gdn.versions"] = json.dumps(merged_versions, sort_keys=True)
    metadata["gdn.device"] = device_text
    metadata["gdn.output_command"] = command
    write_atomically(out_path, written, metadata)
    record.update(status="RAN", message="", output=str(out_path))
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="+", help="case files or folders of them")
    parser.add_argument("--impl", required=True,
                        help=f"built-in ({', '.join(BUILTIN)}) or path/to/file.py[:OBJECT] or module[:OBJECT]")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--out-dir", default=None,
                        help="write results here (same relative names) instead of updating the inputs")
    parser.add_argument("--log", default=None, help="JSON-lines log, one record per case (appended)")
    parser.add_argument("--limit", type=int, default=0, help="stop after this many cases (0: all)")
    parser.add_argument("--resume", action="store_true",
                        help="skip the cases the --log already records (after a run that stopped)")
    args = parser.parse_args(argv)

    import torch
    implementation = load_implementation(args.impl)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device_text = device_name(device)
    versions = {"torch": torch.__version__, "python": sys.version.split()[0], "safetensors io": case_io.backend()}
    if hasattr(implementation, "versions"):
        try:
            versions.update(implementation.versions())
        except ImportError as error:
            raise SystemExit(f"gdn_adapter: {implementation.NAME} cannot be loaded here: {error}")
    command = " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]) if argv is None else \
        " ".join(shlex.quote(a) for a in ["gdn_adapter.py", *argv])

    cases = collect_cases(args.cases)
    if args.resume and args.log and os.path.exists(args.log):
        with open(args.log, encoding="utf-8") as previous:
            done = {json.loads(line).get("file") for line in previous if line.strip()}
        cases = [c for c in cases if str(c) not in done]
    if args.limit:
        cases = cases[: args.limit]
    log = open(args.log, "a", encoding="utf-8") if args.log else None
    counts = {"RAN": 0, "SKIPPED": 0, "ERROR": 0}
    started = time.monotonic()
    roots = [Path(a) for a in args.cases]
    try:
        for index, path in enumerate(cases, 1):
            if args.out_dir:
                root = next((r for r in roots if r.is_dir() and r in path.parents), None)
                relative = path.relative_to(root) if root else Path(path.name)
                out_path = Path(args.out_dir) / relative
            else:
                out_path = path
            try:
                record = run_case(implementation, path, out_path, device, device_text, versions, command)
            except Exception as error:  # unreadable case file: the generator's or the disk's fault
                record = {"file": str(path), "case": path.stem, "implementation": implementation.NAME,
                          "status": "ERROR", "message": f"reading the case: {type(error).__name__}: {error}"}
            counts[record["status"]] += 1
            fatal = record["status"] == "ERROR" and FATAL_DEVICE_ERROR.search(record.get("message", ""))
            if log:
                log.write(json.dumps(record, sort_keys=True) + "\n")
                log.flush()
            elapsed = time.monotonic() - started
            rate = index / elapsed if elapsed > 0 else 0.0
            remaining = (len(cases) - index) / rate if rate > 0 else 0.0
            note = f" ({record['message'][:120]})" if record["status"] != "RAN" else ""
            print(f"[{index}/{len(cases)}] {record['status']:7s} {record.get('case', path.stem)}: "
                  f"{record.get('problem', '')} {record.get('seconds', 0.0):.2f}s{note} | "
                  f"ran {counts['RAN']} skipped {counts['SKIPPED']} errors {counts['ERROR']} | "
                  f"{rate:.2f} cases/s, ~{remaining:.0f}s left", file=sys.stderr, flush=True)
            if fatal:
                # The CUDA context is lost: every later result in this process would be garbage.
                print(f"gdn_adapter: stopping after a device error in {path}; rerun with --resume to go on "
                      f"in a fresh process", file=sys.stderr, flush=True)
                return 3
    finally:
        if log:
            log.close()
    print(f"gdn_adapter: {implementation.NAME}: {len(cases)} cases, ran {counts['RAN']}, "
          f"skipped {counts['SKIPPED']}, errors {counts['ERROR']}", flush=True)
    return 1 if counts["ERROR"] else 0


if __name__ == "__main__":
    sys.exit(main())
