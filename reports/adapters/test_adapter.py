#!/usr/bin/env python3
"""The adapter's plumbing on the CPU (pytest; CTest reports/adapter_plumbing).

Writes case files (format gdn-case/1, docs/case_files.md) by hand, runs gdn_adapter.py with
the float64 torch implementation and with impl_fla's conversions driving a torch stand-in of
fla's API, and checks: every input tensor and metadata entry survives bit for bit, the out.*
tensors have the problem's shapes and a kernel's dtypes, the metadata names implementation,
formulation, versions and device, unsupported problems are logged SKIPPED with a reason, the
naive implementation matches a closed form, and fla's conversions (batch axis, GVA, state
layout, fused gates) reproduce the naive implementation, which uses gdn-testbed's conventions.

With a gdn-testbed binary in GDN_TESTBED_BINARY, `gdn-testbed verify` must also pass every
output file (the oracle knows nothing of fla's conventions, so a conversion slip fails there).
Skipped when torch or safetensors is missing.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FAILURES: list[str] = []

torch = pytest.importorskip("torch", reason="the adapter needs torch")
pytest.importorskip("safetensors", reason="the adapter tests read case files with safetensors")


def check(condition: bool, what: str) -> None:
    """Collects a failed check; each test asserts that none were collected, so one run reports
    every broken check instead of the first."""
    if not condition:
        FAILURES.append(what)


@pytest.fixture(autouse=True)
def no_failed_checks():
    FAILURES.clear()
    yield
    assert not FAILURES, "\n".join(FAILURES)


def problem(cu, H, HV, K, V, dtype, **overrides) -> dict:
    p = {"cu_seqlens": cu, "T": cu[-1], "H": H, "HV": HV, "K": K, "V": V, "scale": None, "use_qk_l2norm": False,
         "has_h0": True, "has_hT": True, "state_layout": "k_major", "state_slots": 0,
         "store_intermediate_states": False, "input_dtype": dtype, "gate_dtype": "f32", "gate_mode": "direct",
         "allow_negative_eigenvalues": False}
    p.update(overrides)
    return p


def write_case(path: Path, p: dict, seed: int) -> None:
    import torch
    from safetensors.torch import save_file
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}
    generator = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)  # noqa: E731
    T, H, HV, K, V = p["T"], p["H"], p["HV"], p["K"], p["V"]
    dt, gate_dt = dtypes[p["input_dtype"]], dtypes[p["gate_dtype"]]
    k = randn(T, H, K)
    if not p["use_qk_l2norm"]:
        k = k / k.norm(dim=-1, keepdim=True)  # unit keys keep the recurrence contractive
    tensors = {"cu_seqlens": torch.tensor(p["cu_seqlens"], dtype=torch.int64), "q": randn(T, H, K).to(dt),
               "k": k.to(dt), "v": randn(T, HV, V).to(dt)}
    if p["gate_mode"] == "fused":
        tensors.update(a=randn(T, HV).to(gate_dt), b=randn(T, HV).to(gate_dt),
                       A_log=torch.log(1 + 15 * torch.rand(HV, generator=generator)).float(),
                       dt_bias=randn(HV).float())
    else:
        tensors.update(g=(-0.1 * torch.rand(T, HV, generator=generator, dtype=torch.float64)).to(gate_dt),
                       beta=torch.rand(T, HV, generator=generator, dtype=torch.float64).to(gate_dt))
    rows = p["state_slots"] or len(p["cu_seqlens"]) - 1
    if p["has_h0"] or p["state_slots"]:
        shape = [rows, HV, K, V] if p["state_layout"] == "k_major" else [rows, HV, V, K]
        tensors["h0"] = (0.5 * randn(*shape)).float()
    if p["state_slots"]:
        tensors["state_indices"] = torch.tensor([1, -1, 0][: len(p["cu_seqlens"]) - 1], dtype=torch.int32)
    metadata = {"gdn.format": "gdn-case/1", "gdn.problem": json.dumps(p), "gdn.case_name": f"test/{path.stem}",
                "gdn.versions": json.dumps({"gdn-testbed": "test"}), "gdn.command": "test_adapter.py",
                "other.key": "kept as it was"}
    save_file(tensors, str(path), metadata=metadata)


CASES = {
    # name: (problem, which fla functions must skip it)
    "gva_varlen_bf16": (problem([0, 5, 5, 70, 71], 2, 4, 16, 8, "bf16", use_qk_l2norm=True), set()),
    "fused_vmajor_f32": (problem([0, 9, 20], 1, 2, 8, 8, "f32", gate_mode="fused", state_layout="v_major",
                                 allow_negative_eigenvalues=True), set()),
    "no_h0_f16_scale": (problem([0, 12], 2, 2, 8, 4, "f16", has_h0=False, scale=0.3), set()),
    "state_cache_f32": (problem([0, 3, 4, 6], 1, 1, 4, 4, "f32", state_slots=2), {"chunk", "fused_recurrent"}),
    "intermediate_f32": (problem([0, 4], 1, 1, 4, 4, "f32", store_intermediate_states=True), {"chunk", "fused_recurrent"}),
    "wide_k_f32": (problem([0, 3], 1, 1, 320, 4, "f32"), {"chunk"}),
    "single_token": (problem([0, 1], 1, 1, 4, 3, "f32", has_h0=False), set()),
}


def load(path: Path):
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}, dict(f.metadata())


def run_adapter(impl: str, cases: Path, out: Path | None, log: Path, env=None) -> subprocess.CompletedProcess:
    import os
    command = [sys.executable, str(HERE / "gdn_adapter.py"), "--impl", impl, "--device", "cpu", "--log", str(log), str(cases)]
    if out is not None:
        command[-1:-1] = ["--out-dir", str(out)]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})


RUNS = {"naive": ("naive", set()), "chunk": (f"{HERE / 'fla_standin.py'}:CHUNK", "chunk"),
        "fused_recurrent": (f"{HERE / 'fla_standin.py'}:FUSED_RECURRENT", "fused_recurrent")}


@pytest.fixture(scope="module")
def plumbing(tmp_path_factory):
    """The hand-made cases run once through the naive implementation and both fla stand-ins:
    (root, cases folder, {label: output folder}, {label: (exit code, stderr, log records)})."""
    root = tmp_path_factory.mktemp("adapter")
    cases = root / "cases"
    cases.mkdir()
    for seed, (name, (p, _)) in enumerate(CASES.items()):
        write_case(cases / f"{name}.safetensors", p, seed)
    outputs, runs = {}, {}
    for label, (impl, _) in RUNS.items():
        out, log = root / label, root / f"{label}.jsonl"
        result = run_adapter(impl, cases, out, log)
        records = {Path(r["file"]).stem: r for r in map(json.loads, log.read_text().splitlines())} if log.exists() else {}
        outputs[label], runs[label] = out, (result.returncode, result.stderr, records)
    return root, cases, outputs, runs


def test_runs_log_every_case_and_skip_with_a_reason(plumbing):
    _, _, outputs, runs = plumbing
    for label, (_, variant) in RUNS.items():
        code, stderr, records = runs[label]
        out = outputs[label]
        check(code == 0, f"{label}: adapter exited {code}: {stderr[-2000:]}")
        check(set(records) == set(CASES), f"{label}: log covers {sorted(records)}")
        for name, (p, skipped_by) in CASES.items():
            record = records.get(name, {})
            expected = "SKIPPED" if variant in skipped_by else "RAN"
            check(record.get("status") == expected,
                  f"{label}/{name}: status {record.get('status')} ({record.get('message')}), expected {expected}")
            if expected == "SKIPPED":
                check(bool(record.get("message")), f"{label}/{name}: a skip must give its reason")
                check(not (out / f"{name}.safetensors").exists(), f"{label}/{name}: skipped but written")
            check(record.get("problem_json") == p, f"{label}/{name}: log lacks the problem")
        check(not list(out.rglob(".*.tmp.*")), f"{label}: temporary files left behind")


def test_outputs_keep_inputs_and_match_the_naive_recurrence(plumbing):
    _, cases, outputs, _ = plumbing
    for name, (p, skipped_by) in CASES.items():
        source_tensors, source_meta = load(cases / f"{name}.safetensors")
        results = {}
        for label in RUNS:
            path = outputs[label] / f"{name}.safetensors"
            if not path.exists():
                continue
            tensors, meta = load(path)
            results[label] = tensors
            for key, tensor in source_tensors.items():
                check(key in tensors and tensors[key].dtype == tensor.dtype and torch.equal(tensors[key], tensor),
                      f"{label}/{name}: input tensor {key} changed")
            for key, text in source_meta.items():
                if key != "gdn.versions":
                    check(meta.get(key) == text, f"{label}/{name}: metadata {key} changed")
            versions = json.loads(meta.get("gdn.versions", "{}"))
            check(versions.get("gdn-testbed") == "test" and "torch" in versions,
                  f"{label}/{name}: gdn.versions {versions} should keep old and add new entries")
            check(meta.get("gdn.device") == "cpu", f"{label}/{name}: gdn.device {meta.get('gdn.device')}")
            formulation = "chunked" if label == "chunk" else "sequential"
            check(meta.get("gdn.formulation") == formulation, f"{label}/{name}: gdn.formulation")
            check((meta.get("gdn.chunk_size") == "64") == (formulation == "chunked"), f"{label}/{name}: gdn.chunk_size")
            check(bool(meta.get("gdn.implementation")), f"{label}/{name}: no gdn.implementation")
            if label != "naive":
                check("stand-in" in meta.get("gdn.implementation", ""), f"{label}/{name}: stand-in not named as such")
            o = tensors.get("out.o")
            check(o is not None and list(o.shape) == [p["T"], p["HV"], p["V"]] and o.dtype == source_tensors["q"].dtype,
                  f"{label}/{name}: out.o shape/dtype")
            if p["has_hT"]:
                hT = tensors.get("out.hT")
                rows = p["state_slots"] or len(p["cu_seqlens"]) - 1
                shape = [rows, p["HV"], p["K"], p["V"]] if p["state_layout"] == "k_major" else [rows, p["HV"], p["V"], p["K"]]
                check(hT is not None and list(hT.shape) == shape and hT.dtype == torch.float32, f"{label}/{name}: out.hT")
        if "naive" in results:
            naive = results["naive"]
            for label in ("chunk", "fused_recurrent"):
                if label in results:
                    for key in ("out.o", "out.hT"):
                        if key in naive:
                            difference = (results[label][key].double() - naive[key].double()).abs().max().item()
                            # Both compute in float64; only the final rounding may differ.
                            tolerance = 8 * torch.finfo(naive[key].dtype).eps * max(1.0, naive[key].double().abs().max().item())
                            check(difference <= tolerance, f"{label}/{name}: {key} differs from naive by {difference:.3g}")


def test_naive_closed_form(plumbing):
    _, _, outputs, _ = plumbing
    # Closed form: one token, no h0, so S = beta k v^T and o = scale (k . q) beta v.
    tensors, _ = load(outputs["naive"] / "single_token.safetensors")
    q, k, v = (tensors[n][0, 0].double() for n in ("q", "k", "v"))
    beta, g = tensors["beta"][0, 0].double(), tensors["g"][0, 0].double()
    expected_o = (1 / math.sqrt(4)) * torch.dot(k, q) * beta * v
    check(torch.allclose(tensors["out.o"][0, 0].double(), expected_o, rtol=1e-6, atol=1e-7),
          f"naive closed form: o {tensors['out.o'][0, 0].tolist()} != {expected_o.tolist()}")
    check(torch.allclose(tensors["out.hT"][0, 0].double(), beta * torch.outer(k, v), rtol=1e-6, atol=1e-7),
          "naive closed form: hT != beta k v^T")
    del g


def test_builtin_codec_writes_what_the_package_does(plumbing):
    root, cases, outputs, _ = plumbing
    # The built-in safetensors codec (for machines without the package) reads and writes
    # what the package does: same outputs, and the package reads its files back.
    builtin = root / "builtin"
    result = run_adapter("naive", cases, builtin, root / "builtin.jsonl", env={"GDN_SAFETENSORS": "builtin"})
    check(result.returncode == 0, f"builtin codec run: {result.stderr[-1000:]}")
    for name in CASES:
        a, meta_a = load(outputs["naive"] / f"{name}.safetensors")
        b, meta_b = load(builtin / f"{name}.safetensors")
        check(set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a),
              f"builtin codec/{name}: tensors differ from the package's")
        check(json.loads(meta_b["gdn.versions"]).get("safetensors io") == "builtin", f"builtin codec/{name}: not used")
        check({k: v for k, v in meta_a.items() if k not in ("gdn.versions", "gdn.output_command")} ==
              {k: v for k, v in meta_b.items() if k not in ("gdn.versions", "gdn.output_command")},
              f"builtin codec/{name}: metadata differs")


def test_device_error_stops_and_resume_goes_on(plumbing):
    root, cases, _, _ = plumbing
    # A device error that poisons the CUDA context stops the driver (exit 3); --resume goes
    # on with the cases the log does not hold yet.
    (root / "poison.py").write_text(
        "import impl_naive_torch as naive\n"
        "NAME, FORMULATION = 'poison', 'sequential'\n"
        "def run(problem, tensors):\n"
        "    if problem['T'] == 71:\n"
        "        raise RuntimeError('CUDA error: an illegal memory access was encountered')\n"
        "    return naive.run(problem, tensors)\n")
    poison_log = root / "poison.jsonl"
    first = run_adapter(str(root / "poison.py"), cases, root / "poison", poison_log)
    records = [json.loads(line) for line in poison_log.read_text().splitlines()]
    check(first.returncode == 3 and records[-1]["status"] == "ERROR" and len(records) < len(CASES),
          f"device error: exit {first.returncode}, {len(records)} records")
    command = [sys.executable, str(HERE / "gdn_adapter.py"), "--impl", str(root / "poison.py"), "--device", "cpu",
               "--out-dir", str(root / "poison"), "--log", str(poison_log), "--resume", str(cases)]
    second = subprocess.run(command, capture_output=True, text=True)
    records = [json.loads(line) for line in poison_log.read_text().splitlines()]
    check(second.returncode == 0 and sorted(r["file"] for r in records) == sorted(str(p) for p in cases.glob("*.safetensors")),
          f"--resume: exit {second.returncode}, {len(records)} records for {len(CASES)} cases: {second.stderr[-500:]}")


def test_in_place_run_adds_outputs(plumbing):
    root, _, _, _ = plumbing
    # In place (no --out-dir): the file gains outputs and keeps its inputs.
    in_place = root / "in_place"
    in_place.mkdir()
    write_case(in_place / "case.safetensors", CASES["gva_varlen_bf16"][0], 99)
    before, _ = load(in_place / "case.safetensors")
    result = run_adapter("naive", in_place, None, root / "in_place.jsonl")
    after, meta = load(in_place / "case.safetensors")
    check(result.returncode == 0 and "out.o" in after and all(torch.equal(after[k], t) for k, t in before.items()),
          f"in-place run: {result.stderr[-500:]}")


def test_gdn_testbed_verify_passes_every_output(plumbing):
    """Needs the CLI: CTest passes it in GDN_TESTBED_BINARY."""
    root, _, outputs, _ = plumbing
    binary = os.environ.get("GDN_TESTBED_BINARY")
    if not binary:
        pytest.skip("GDN_TESTBED_BINARY is not set (the gdn-testbed CLI)")
    # gdn-testbed's own generator: every problem kind it draws (state caches,
    # intermediate states, zero-length sequences, odd head sizes) through the naive
    # implementation must pass verify.
    generated = root / "generated"
    generated.mkdir()
    result = subprocess.run([str(binary), "generate", "--out", str(generated / "cases"), "--cases", "24",
                             "--seed", "11", "--intermediate"], capture_output=True, text=True)
    check(result.returncode == 0, f"gdn-testbed generate failed: {result.stderr[-1000:]}")
    result = run_adapter("naive", generated / "cases", generated / "naive", generated / "naive.jsonl")
    check(result.returncode == 0, f"naive on generated cases: {result.stderr[-1000:]}")
    result = subprocess.run([str(binary), "verify", str(generated / "naive")], capture_output=True, text=True)
    check(result.returncode == 0 and "24 passed" in result.stdout,
          f"verify of naive on generated cases: {result.stdout[-2000:]}{result.stderr[-500:]}")
    for label in RUNS:
        files = sorted(str(p) for p in outputs[label].glob("*.safetensors"))
        result = subprocess.run([str(binary), "verify", *files], capture_output=True, text=True)
        check(result.returncode == 0, f"gdn-testbed verify of {label} outputs failed ({result.returncode}):\n"
                                      f"{result.stdout[-3000:]}{result.stderr[-2000:]}")



def test_flash_qla_driver_converts_and_skips(tmp_path):
    """impl_flash_qla through the driver, with a `flash_qla` module whose function is fla's stand-in
    (FlashQLA keeps fla's calling convention): a bf16 varlen GVA case at K = V = 128 runs and
    matches the naive recurrence; fp32 and K != 128 are skipped with their reasons, unwritten."""
    fake = tmp_path / "fake"
    (fake / "flash_qla").mkdir(parents=True)
    (fake / "flash_qla" / "__init__.py").write_text(
        "import fla_standin\n"
        "def chunk_gated_delta_rule(**kwargs):\n"
        "    return fla_standin.chunk_gated_delta_rule(**kwargs)\n")
    cases = tmp_path / "cases"
    cases.mkdir()
    runs = {"bf16_gva": (problem([0, 3, 70, 71], 1, 2, 128, 128, "bf16", use_qk_l2norm=True), "RAN"),
            "f32": (problem([0, 5], 1, 1, 128, 128, "f32"), "SKIPPED"),
            "k64_bf16": (problem([0, 5], 1, 1, 64, 128, "bf16"), "SKIPPED")}
    for seed, (name, (p, _)) in enumerate(runs.items()):
        write_case(cases / f"{name}.safetensors", p, seed)
    env = {"PYTHONPATH": os.pathsep.join([str(fake), str(HERE), os.environ.get("PYTHONPATH", "")])}
    result = run_adapter("flash_qla.chunk", cases, tmp_path / "qla", tmp_path / "qla.jsonl", env)
    naive = run_adapter("naive", cases, tmp_path / "naive", tmp_path / "naive.jsonl")
    check(result.returncode == 0 and naive.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}")
    records = {Path(r["file"]).stem: r for r in map(json.loads, (tmp_path / "qla.jsonl").read_text().splitlines())}
    for name, (p, expected) in runs.items():
        record = records.get(name, {})
        check(record.get("status") == expected, f"{name}: {record.get('status')} ({record.get('message')})")
        written = (tmp_path / "qla" / f"{name}.safetensors").exists()
        check(written == (expected == "RAN"), f"{name}: written {written}")
        if expected == "SKIPPED":
            check(bool(record.get("message")), f"{name}: a skip must give its reason")
    tensors, meta = load(tmp_path / "qla" / "bf16_gva.safetensors")
    reference, _ = load(tmp_path / "naive" / "bf16_gva.safetensors")
    check(meta.get("gdn.implementation") == "flash_qla.chunk_gated_delta_rule", f"name {meta.get('gdn.implementation')}")
    check(meta.get("gdn.formulation") == "chunked" and meta.get("gdn.chunk_size") == "64", "formulation / chunk size")
    for key in ("out.o", "out.hT"):
        difference = (tensors[key].double() - reference[key].double()).abs().max().item()
        tolerance = 8 * torch.finfo(reference[key].dtype).eps * max(1.0, reference[key].double().abs().max().item())
        check(difference <= tolerance, f"{key}: differs from the naive recurrence by {difference}")
