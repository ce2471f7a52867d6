"""Adapters: importable without their libraries, spaces inside their support, and (where the
library is here) their kernels judged. Tests that need a library or a GPU skip, naming it."""
import importlib

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


@pytest.mark.skipif(not (has_module("torch") and has_module("transformers")), reason="needs torch and transformers")
def test_transformers_on_cpu(tmp_path):
    from gdn_testbed.adapters import transformers
    space = transformers.SPACE_CHUNK.replace(input_dtypes=["f32"], max_work=2e5)
    gt.check(transformers.chunk(device="cpu"), space, cases=30, out=tmp_path).assert_pass()


@pytest.mark.skipif(not has_module("torch"), reason="needs torch")
def test_torch_kernel_convention(tmp_path):
    import torch
    import kernels

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
