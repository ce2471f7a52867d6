"""python3 -m gdn_testbed: replay a saved failure with its Python kernel, or write a case space.

    python3 -m gdn_testbed --kernel tests/test_mine.py:my_kernel replay gdn-fuzz-out/NAME.safetensors
    python3 -m gdn_testbed replay FILE                   # judges the outputs stored in the file
    python3 -m gdn_testbed space chunked_prefill --out space.json

--kernel takes FILE.py:NAME, module:NAME, or the name of a registered C++ implementation; NAME
may be a Kernel or a plain callable (then wrapped with --arrays and the file's formulation and
chunk size). Exit status: 0 when every verdict passes (or matches --expect), 1 otherwise, 2 for
usage errors.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys


def load_kernel(spec: str, arrays: str, settings: dict):
    from . import _core
    from .kernel import Kernel
    if ":" not in spec:
        if any(e["name"] == spec for e in _core.implementations()):
            return spec
        raise SystemExit(f"gdn_testbed: --kernel {spec!r}: expected FILE.py:NAME, module:NAME or a registered "
                         f"implementation")
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        if not os.path.isfile(target):
            raise SystemExit(f"gdn_testbed: --kernel: no such file {target!r}")
        module_spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(target))[0], target)
        module = importlib.util.module_from_spec(module_spec)
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, Kernel):
        return obj
    return Kernel(obj, arrays=arrays, formulation=settings.get("formulation", "sequential"),
                  chunk_size=settings.get("chunk_size", 64))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m gdn_testbed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", help="FILE.py:NAME, module:NAME or a registered implementation")
    parser.add_argument("--arrays", choices=("numpy", "torch"), default="numpy",
                        help="what a plain callable receives (a Kernel says itself)")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("replay", help="rerun the kernel on case files and judge it")
    r.add_argument("files", nargs="+")
    r.add_argument("--budget", default=None, help="override the file's budget (docs/budgets.md)")
    r.add_argument("--expect", choices=("pass", "fail"), default=None)
    r.add_argument("--json", default=None, help="write the verdicts (gdn-verdicts/1)")
    s = sub.add_parser("space", help="print or write a case space (gdn-case-space/1)")
    s.add_argument("preset", nargs="?", default="chunked")
    s.add_argument("--set", default="{}", help="JSON object of fields to set, e.g. '{\"K_values\": [128]}'")
    s.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from . import fuzzing, read_case_file, write_verdicts
    from .space import CaseSpace
    if args.command == "space":
        space = CaseSpace(args.preset, **json.loads(args.set))
        if args.out:
            space.save(args.out)
        else:
            print(json.dumps(space.to_json(), indent=2))
        return 0
    verdicts = []
    for path in args.files:
        if args.kernel:
            settings = read_case_file(path).settings
            kernel = load_kernel(args.kernel, args.arrays, settings)
            verdict = fuzzing.replay(kernel, path, args.budget)
        else:
            verdict = fuzzing.replay(None, path, args.budget)
        print(verdict.details())
        verdicts.append(verdict)
    if args.json:
        write_verdicts(verdicts, json_path=args.json, command=" ".join(sys.argv))
    if args.expect:
        ok = all(v.passed if args.expect == "pass" else v.status == "FAIL" for v in verdicts)
        print("every verdict is " + args.expect + ", as expected" if ok else f"expected {args.expect}")
        return 0 if ok else 1
    return 0 if all(v.passed for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
