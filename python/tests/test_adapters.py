"""Adapters: importable without their libraries, spaces inside their support, and (where the
library is here) their kernels judged. Tests that need a library or a GPU skip, naming it."""
import importlib
import json
import os
import subprocess
import sys
import tarfile

import pytest

import gdn_testbed as gt
from gdn_testbed.adapters import has_module

MODULES = ["fla", "flash_qla", "flashinfer", "transformers", "vllm"]


def kernels_of(module):
    return [getattr(module, name) for name in dir(module) if isinstance(getattr(module, name), gt.Kernel)]


@pytest.mark.parametrize("name", MODULES)
def test_adapter_spaces_lie_inside_their_support(name):
    module = importlib.import_module(f"gdn_testbed.adapters.{name}")
    found = kernels_of(module)
    assert found, f"{name} declares no kernels"
    for kernel in found:
        assert kernel.space is not None and kernel.replay and kernel.replay.startswith("gdn_testbed.adapters.")
        assert isinstance(module.available(), (str, type(None)))
        for case in kernel.space.cases(30, seed=5):
            assert kernel._gdn_supports(case.problem) is None, (kernel.name, case.problem)


def test_flashinfer_decode_space_is_one_token_per_request():
    from gdn_testbed.adapters import flashinfer
    for case in flashinfer.SPACE_DECODE.cases(20):
        p = case.problem
        assert all(p.seq_len(n) == 1 for n in range(p.N)) and p.uses_state_cache and p.state_layout == "v_major"


def import_transformers_model():
    """Imports Qwen3-Next's modelling module, which defines the two torch functions. (The
    planted-bug kernels of this folder are planted_kernels.py, not kernels.py, so that
    transformers' `import kernels` finds Hugging Face's kernel hub, never them.)"""
    importlib.import_module("transformers.models.qwen3_next.modeling_qwen3_next")


@pytest.mark.skipif(not (has_module("torch") and has_module("transformers")), reason="needs torch and transformers")
def test_transformers_on_cpu(tmp_path):
    """Both torch functions pass where the decays are mild. (The chunk function's fp32 cumulative
    sum of g loses ulp(|sum|) in each exponent: strong decays, a sum of -100 over a chunk, fail
    by a margin near 1; g = -1e4 is the next test's.)"""
    from gdn_testbed.adapters import transformers
    import_transformers_model()
    regimes = ["no_decay", "mild"]
    space = transformers.SPACE_CHUNK.replace(input_dtypes=["f32"], max_work=2e5, regimes=regimes)
    gt.check(transformers.chunk(device="cpu"), space, cases=30, out=tmp_path / "chunk").assert_pass()
    space = transformers.SPACE_RECURRENT.replace(input_dtypes=["f32"], max_work=2e5, regimes=regimes)
    gt.check(transformers.recurrent(device="cpu"), space, cases=30, out=tmp_path / "recurrent").assert_pass()


@pytest.mark.skipif(not (has_module("torch") and has_module("transformers")), reason="needs torch and transformers")
def test_transformers_chunk_fails_where_a_gate_underflows(tmp_path):
    """The known fact: torch_chunk_gated_delta_rule takes the within-chunk cumulative sum of g in
    fp32, so where some g are -1e4 the differences of that sum lose about ulp(1e4) = 1e-3 in the
    exponent. The oracle finds it and shrinks it to a handful of tokens with such a gate; the
    recurrent function, which multiplies by exp(g) token by token, passes the same cases."""
    from gdn_testbed.adapters import transformers
    import_transformers_model()
    space = transformers.SPACE_CHUNK.replace(input_dtypes=["f32"], max_work=2e5, regimes=["underflow"])
    result = gt.check(transformers.chunk(device="cpu"), space, cases=60, out=tmp_path / "chunk")
    assert result.failed == 1 and result.errors == 0, str(result)
    failure = result.failures[0]
    shrunk = gt.read_case_file(failure.file)
    assert shrunk.problem.T <= 8 and (shrunk.inputs["g"] <= -1e3).any(), failure.describe()
    space = transformers.SPACE_RECURRENT.replace(input_dtypes=["f32"], max_work=2e5, regimes=["underflow"])
    gt.check(transformers.recurrent(device="cpu"), space, cases=60, out=tmp_path / "recurrent").assert_pass()


@pytest.mark.skipif(not has_module("torch"), reason="needs torch")
def test_torch_kernel_convention(tmp_path):
    import torch
    import planted_kernels as kernels

    def torch_kernel(problem, x):
        assert all(isinstance(t, torch.Tensor) for t in x.values())
        assert x["q"].dtype == {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[problem.input_dtype]
        out = kernels.recurrence(problem, {n: t.to(torch.float64).numpy() for n, t in x.items()})
        return out["o"], (torch.from_numpy(out["hT"]) if out["hT"] is not None else None)

    k = gt.Kernel(torch_kernel, arrays="torch", device="cpu", supports=kernels.supports)
    gt.check(k, kernels.SPACE, cases=30, out=tmp_path).assert_pass()


@pytest.mark.parametrize("name", ["fla", "flash_qla", "flashinfer", "vllm"])
def test_gpu_adapters(name, tmp_path):
    module = importlib.import_module(f"gdn_testbed.adapters.{name}")
    why = module.available()
    if why:
        pytest.skip(why)
    for kernel in kernels_of(module):
        result = gt.fuzz(kernel, cases=20, out=tmp_path / kernel.name, progress=False)
        assert result.judged > 0 and result.errors == 0, str(result)


GPU_DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu", "run_adapters.py")


def test_gpu_driver_records_skipped_and_judged_runs(tmp_path):
    """python/gpu/run_adapters.py keeps every run it is given: one whose library or GPU is
    missing is SKIPPED with its adapter's reason; one that runs (transformers on the CPU, where
    torch is here) is judged, with its counts, backend and wall time, and archived."""
    from gdn_testbed.adapters import transformers, vllm
    runs = ["vllm.chunk"]
    judged = transformers.available() is None
    if judged:
        runs.append("transformers.recurrent.f32")
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run([sys.executable, GPU_DRIVER, "--out", str(out), "--work", str(work), "--only", *runs,
                           "--cases", "5", "--seconds", "3", "--warmup", "1", "--total-seconds", "60",
                           "--commit", "test"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "adapter-verdicts.json").read_text())
    assert data["format"] == "gdn-adapter-verdicts/1" and data["commit"] == "test"
    assert [r["id"] for r in data["runs"]] == runs
    skipped = data["runs"][0]
    if vllm.available() is not None:
        assert skipped["status"] == "SKIPPED" and skipped["reason"].startswith(vllm.available())
    with tarfile.open(out / "adapter-failures.tar.xz") as tar:
        names = tar.getnames()
    if judged:
        run = data["runs"][1]
        assert run["status"] == "DONE" and run["verdict"] == "PASS", run
        assert run["phases"]["check"]["judged"] == 5 and run["backend"]["kernel_calls"] >= 6
        assert run["space"]["input_dtypes"] == ["f32"] and run["wall_seconds"] > 0
        assert "runs/transformers.recurrent.f32/result.json" in names
