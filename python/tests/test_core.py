"""The C++ core through Python: the Problem, inputs, references, emulation, oracle, case files."""
import json

import numpy as np
import pytest

import gdn_testbed as gt


def small_problem(**options):
    return gt.Problem.packed([5, 70, 0], H=1, HV=2, K=12, V=8, has_h0=True, has_hT=True, **options)


def test_problem_round_trip_and_validation():
    p = small_problem(input_dtype="bf16", use_qk_l2norm=True)
    d = p.to_dict()
    assert d["cu_seqlens"] == [0, 5, 75, 75] and d["input_dtype"] == "bf16"
    assert gt.Problem.from_dict(d) == p
    with pytest.raises(gt.ProblemError) as error:
        gt.Problem.packed([3], H=2, HV=3)
    assert error.value.argument == "HV" and "multiple of H" in error.value.rule
    bad = dict(d, T=4)
    with pytest.raises(ValueError, match="cu_seqlens"):
        gt.Problem.from_dict(bad)
    missing = {k: v for k, v in d.items() if k != "gate_mode"}
    with pytest.raises(ValueError, match="gate_mode"):
        gt.Problem.from_dict(missing)


def test_inputs_are_deterministic_and_checked():
    p = small_problem(input_dtype="f16")
    a, b = gt.make_inputs(p, seed=7), gt.make_inputs(p, seed=7)
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert not np.array_equal(a["q"], gt.make_inputs(p, seed=8)["q"])
    x = dict(a, q=a["q"] + 1e-4)  # no longer representable in f16
    with pytest.raises(gt.ProblemError) as error:
        gt.sequential(p, x)
    assert error.value.argument == "q" and "representable" in error.value.rule
    with pytest.raises(gt.ProblemError) as error:
        gt.sequential(p, dict(a, v=a["v"][:3]))
    assert error.value.argument == "v"
    with pytest.raises(TypeError):
        gt.make_inputs(p, seed=1, regime_typo="mild")
    # zero_key_tail: the last tokens of every sequence get zero keys, the rest stays as drawn.
    z = gt.make_inputs(p, seed=7, zero_key_tail=2)
    ends = np.asarray(p.cu_seqlens)[1:]
    for end, start in zip(ends, np.asarray(p.cu_seqlens)[:-1]):
        assert not z["k"][max(start, end - 2):end].any()
    kept = np.ones(p.T, dtype=bool)
    for end, start in zip(ends, np.asarray(p.cu_seqlens)[:-1]):
        kept[max(start, end - 2):end] = False
    assert np.array_equal(z["k"][kept], a["k"][kept]) and np.array_equal(z["v"], a["v"])


def test_references_agree():
    p = small_problem()
    x = gt.make_inputs(p, seed=3, regime="strong")
    exact = gt.sequential(p, x)
    f80 = gt.sequential(p, x, "f80")
    assert f80["o"].dtype == np.longdouble
    assert np.max(np.abs(exact["o"] - f80["o"].astype(np.float64))) < 1e-12
    chunk, trace = gt.chunked(p, x, chunk_size=16, trace=True)
    assert np.max(np.abs(exact["hT"] - chunk["hT"])) < 1e-12
    # (sequence, head, chunk) records: 1 chunk for the 5 tokens, 5 for the 70, none for the empty one
    assert len(trace) == 2 * (1 + 5)
    assert trace[0]["W"].shape == (5, 12) and trace[1]["S_end"].shape == (12, 8)
    emulated = gt.emulate(p, x, "chunked", 64)
    difference = np.max(np.abs(emulated["o"] - exact["o"]))
    assert 0 < difference < 1e-4  # fp32 arithmetic: not exact, close


def test_judge_passes_the_reference_and_fails_a_wrong_output():
    p = small_problem(input_dtype="bf16")
    x = gt.make_inputs(p, seed=5)
    exact = gt.sequential(p, x)
    rounded = {"o": gt.round_to("bf16", exact["o"]), "hT": gt.round_to("f32", exact["hT"])}
    verdict = gt.judge(p, x, rounded, formulation="chunked")
    assert verdict.status == "PASS" and verdict.worst_margin <= 1
    wrong = dict(rounded, hT=rounded["hT"] * 1.01)
    verdict = gt.judge(p, x, wrong, formulation="chunked")
    assert verdict.status == "FAIL" and verdict.worst_check["tensor"] == "hT"
    j = json.loads(verdict.to_json())
    assert j["status"] == "FAIL" and j["checks"]
    assert gt.verdicts_json([verdict])["verdicts"][0]["status"] == "FAIL"
    nan = dict(rounded, o=np.full_like(rounded["o"], np.nan))
    assert gt.judge(p, x, nan).status == "FAIL"
    with pytest.raises(ValueError, match="no 'hT'"):
        gt.judge(p, x, {"o": rounded["o"]})


def test_case_file_round_trip(tmp_path):
    p = small_problem(input_dtype="bf16")
    x = gt.make_inputs(p, seed=2)
    exact = gt.sequential(p, x)
    path = tmp_path / "case.safetensors"
    gt.write_case_file(path, p, x, exact, {"gdn.implementation": "tests.exact", "gdn.formulation": "sequential"})
    c = gt.read_case_file(path)
    assert c.problem == p and c.metadata["gdn.implementation"] == "tests.exact"
    assert all(np.array_equal(c.inputs[n], x[n]) for n in x)
    assert np.array_equal(c.outputs["o"], exact["o"])
    assert c.settings["formulation"] == "sequential"
    assert gt.judge_case_file(path).status == "PASS"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError):
        gt.read_case_file(path)
    assert gt.judge_case_file(path).status == "ERROR"


def test_registered_implementations_run_in_process():
    names = {e["name"] for e in gt.implementations()}
    assert "reference.sequential.f64" in names and "fault.dropped_decay" in names
    p = small_problem()
    x = gt.make_inputs(p, seed=4)
    assert np.array_equal(gt.run_implementation("reference.sequential.f64", p, x)["o"], gt.sequential(p, x)["o"])
