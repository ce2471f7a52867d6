"""Precision designs (docs/python.md, "Precision designs"): a kernel that keeps its chunk states
and tensor-core operands in the input dtype by design is judged by the budget that models that
design, so that its FAIL means a bug; its distance from the fp32 baseline is a quality figure."""
import argparse
import importlib.util
import os

import pytest

import gdn_testbed as gt
import planted_kernels

DESIGN = "chunk states and computed operands rounded once to the input dtype (the operand model itself)"
SPACE = planted_kernels.SPACE.replace(input_dtypes=["bf16"], initial_state="always", final_state="always")


def operand_model(problem, x):
    """A kernel of exactly that design: gdn-testbed's own emulation of it."""
    return gt.emulate_operands(problem, x, "single")


def designed(fn, name):
    return gt.Kernel(fn, name=name, formulation="chunked", chunk_size=64, supports=planted_kernels.supports,
                     space=SPACE, budget=gt.OPERANDS_SINGLE, design=DESIGN)


def test_design_needs_its_budget_and_a_chunked_formulation():
    with pytest.raises(ValueError, match="design needs the budget"):
        gt.Kernel(operand_model, formulation="chunked", design=DESIGN)
    with pytest.raises(ValueError, match="design must be"):
        gt.Kernel(operand_model, formulation="chunked", budget=gt.OPERANDS_SINGLE, design=" ")
    with pytest.raises(ValueError, match="chunked form at C = 64"):
        gt.Kernel(operand_model, formulation="sequential", budget=gt.OPERANDS_SINGLE, design=DESIGN)
    with pytest.raises(ValueError, match="chunked form at C = 64"):
        gt.Kernel(operand_model, formulation="chunked", chunk_size=32, budget=gt.OPERANDS_SINGLE, design=DESIGN)
    k = designed(operand_model, "tests.operand_model")
    assert "baseline=operands_single" in k.budget and "state_unit=input" in k.budget and k.design == DESIGN


def test_adapters_declare_their_designs():
    from gdn_testbed.adapters import fla, flash_qla, transformers, vllm
    # fla (both backends) and FlashQLA store the normalised q, k in the input dtype (reports/peers.md).
    for k in (fla.CHUNK_TRITON, fla.CHUNK_FLASH_QLA, fla.CHUNK_AUTO, flash_qla.CHUNK, flash_qla.CHUNK_NO_CP,
              vllm.chunk()):
        assert k.budget == gt.budget_describe(gt.OPERANDS_SINGLE_QK) and "normalised q, k stored" in k.design, k
        assert k.precision.normalized_qk == "input", k
    assert fla.CHUNK_TRITON.precision.tf32 and "TF32" in fla.CHUNK_TRITON.design
    for k in (fla.FUSED_RECURRENT, transformers.chunk(), transformers.recurrent(), vllm.recurrent()):
        assert k.budget is None and k.design is None, k


def test_design_passes_its_budget_and_misses_the_fp32_baseline(tmp_path):
    """The design passes its own budget, while its bf16 chunk states put hT far outside the
    fp32 baseline's (the 1,850x-10,000x seen on the GPU kernels): a quality figure."""
    k = designed(operand_model, "tests.operand_model")
    gt.check(k, cases=25, out=tmp_path / "design").assert_pass()   # the kernel's budget by default
    plain = gt.check(k, cases=25, out=tmp_path / "fp32", budget=gt.QUALITY_BUDGET, shrink=False)
    assert plain.failed >= 1 and plain.failures[0].verdict.worst_check["tensor"] == "hT", str(plain)


def test_design_vocabulary():
    """gt.Design picks the budget of the design it names and refuses what the model cannot state."""
    assert gt.Design().budget == gt.OPERANDS_SINGLE
    assert gt.Design(normalized_qk="input").budget == gt.OPERANDS_SINGLE_QK
    assert gt.budget_describe(gt.OPERANDS_SINGLE_QK) == "calibrated(state_unit=input,baseline=operands_single_qk)"
    with pytest.raises(ValueError, match="normalized_qk"):
        gt.Design(normalized_qk="bf16")
    with pytest.raises(ValueError, match="operands"):
        gt.Design(operands="fp32")
    with pytest.raises(ValueError, match="chunks of 64"):
        gt.Design(chunk_size=32)
    with pytest.raises(ValueError, match="chunked form at C = 64"):
        gt.Kernel(operand_model, formulation="sequential", design=gt.Design())
    k = gt.Kernel(operand_model, formulation="chunked", design=gt.Design(normalized_qk="input", notes="a note"))
    assert k.budget == gt.budget_describe(gt.OPERANDS_SINGLE_QK) and k.design.endswith("a note")
    assert isinstance(k.precision, gt.Design)
    # An explicit budget beside a Design wins (the quality figure, for example).
    assert gt.Kernel(operand_model, formulation="chunked", design=gt.Design(), budget="calibrated").budget == "calibrated"


def test_single_qk_rounds_the_normalised_q_k_and_nothing_else():
    """emulate_operands(single_qk) is single on cases without l2norm and differs on bf16 l2norm
    cases by the rounding of the normalised q, k."""
    import numpy as np
    space = SPACE.replace(max_K=32, max_V=32)
    differ = 0
    for case in space.cases(40, seed=11):
        p = case.problem
        if planted_kernels.supports(p) is not None:
            continue
        a, b = gt.emulate_operands(p, case.inputs, "single"), gt.emulate_operands(p, case.inputs, "single_qk")
        same = all(np.array_equal(a[t], b[t]) for t in ("o", "hT"))
        if not p.use_qk_l2norm:
            assert same, p.describe()
        differ += not same
    assert differ >= 3, differ


def test_design_budget_still_catches_a_bug(tmp_path):
    """A dropped decay at the chunk boundary FAILs the design's budget: the design model does
    not loosen the budget past a bug."""
    k = designed(planted_kernels.dropped_decay, "tests.dropped_decay_designed")
    result = gt.check(k, cases=300, out=tmp_path)
    assert result.failed == 1, str(result)
    assert "operands single" in result.failures[0].verdict.worst_check["basis"], result.failures[0].describe()
    qk = gt.Kernel(planted_kernels.dropped_decay, name="tests.dropped_decay_qk", formulation="chunked",
                   supports=planted_kernels.supports, space=SPACE.replace(l2norm="always"),
                   design=gt.Design(normalized_qk="input"))
    result = gt.check(qk, cases=300, out=tmp_path / "qk")
    assert result.failed == 1, str(result)
    assert "q k stored" in result.failures[0].verdict.worst_check["basis"], result.failures[0].describe()


def test_gpu_driver_quality_figure():
    """run_adapters.quality: each case judged by the design's budget (PASS here) and by the fp32
    baseline, reported per tensor as worst margin and rel_rms, labelled quality."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu", "run_adapters.py")
    spec = importlib.util.spec_from_file_location("run_adapters", path)
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    k = designed(operand_model, "tests.operand_model")
    args = argparse.Namespace(quality_cases=6, seed=1)
    q = driver.quality(gt, k, SPACE, args, k.budget, until=float("inf"))
    assert not q["errors"] and q["cases"], q
    assert all(row["design_status"] == "PASS" for row in q["cases"]), q
    assert q["per_tensor"]["hT"]["worst_margin"] > 1 and "not a verdict" in q["note"], q
    assert set(q["per_tensor"]) == {"o", "hT"}
