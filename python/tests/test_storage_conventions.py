"""Storage conventions of serving kernels: reduced-precision states (Problem.state_dtype) and
linear-space gates (Problem.gate_space, the decay given as alpha = exp(g)); the case format
gdn-case/3; the case-space axes; and the adapters that use them (docs/semantics.md §3, §7)."""
import json

import numpy as np
import pytest

import gdn_testbed as gt
from gdn_testbed import _core


def bf16_round(a):
    return gt.round_to("bf16", a)


def storing_recurrence(problem, x, extra_rounding=False):
    """A kernel with FlashInfer's and vLLM's conventions, in numpy: it reads alpha (linear gates) or
    g, keeps the running state in float64 (far finer than fp32) and stores hT and every per-token
    state rounded to problem.state_dtype. extra_rounding: the per-token states rounded twice
    through bf16 of a shifted value (a storage bug)."""
    cu = [int(c) for c in x["cu_seqlens"]]
    q, k, v, beta = (np.asarray(x[n], dtype=np.float64) for n in ("q", "k", "v", "beta"))
    decay = np.asarray(x[problem.decay_name], dtype=np.float64)
    if problem.gate_space == "log":
        decay = np.exp(decay)
    if problem.use_qk_l2norm:
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    o = np.zeros(problem.v_shape)
    hT = np.zeros(problem.state_shape)
    inter = np.zeros(problem.intermediate_shape) if problem.store_intermediate_states else None
    group = problem.group_size
    for n in range(problem.N):
        for j in range(problem.HV):
            h = j // group
            S = np.array(x["h0"][n, j], dtype=np.float64) if problem.has_h0 else np.zeros((problem.K, problem.V))
            for t in range(cu[n], cu[n + 1]):
                S = S * decay[t, j]
                S = S + np.outer(k[t, h], beta[t, j] * (v[t, j] - k[t, h] @ S))
                o[t, j] = problem.effective_scale * (q[t, h] @ S)
                if inter is not None:
                    stored = gt.round_to(problem.state_dtype, S)
                    if extra_rounding:
                        stored = gt.round_to(problem.state_dtype, stored * (1 + 2 ** -5))
                    inter[t, j] = stored
            hT[n, j] = gt.round_to(problem.state_dtype, S)
    return {"o": gt.round_to(problem.input_dtype, o), "hT": hT if problem.has_hT else None, "intermediate": inter}


def supports(problem):
    if problem.gate_mode != "direct" or problem.uses_state_cache or problem.state_layout != "k_major":
        return "direct gates and dense K-major states only"
    return None


SPACE = gt.CaseSpace("everything", fused_gates="off", state_cache="off", v_major="off", max_K=16, max_V=16,
                     max_work=6e4, state_dtypes=["f32", "bf16", "f16"], gate_spaces=["log", "linear"])


def test_problem_fields_and_their_rules():
    p = gt.Problem.packed([3, 2], H=1, HV=2, K=4, V=4, has_h0=True, has_hT=True)
    assert p.state_dtype == "f32" and p.gate_space == "log" and p.decay_name == "g"
    assert "state_dtype" not in p.to_dict() and "gate_space" not in p.to_dict()  # the gdn-case/1 object
    p.state_dtype, p.gate_space = "bf16", "linear"
    p.validate()
    d = p.to_dict()
    assert d["state_dtype"] == "bf16" and d["gate_space"] == "linear" and p.decay_name == "alpha"
    assert gt.Problem.from_dict(d) == p
    p.state_dtype = "f64"
    with pytest.raises(gt.ProblemError) as error:
        p.validate()
    assert error.value.argument == "state_dtype"
    p.state_dtype = "bf16"
    p.gate_mode = "fused"
    with pytest.raises(gt.ProblemError) as error:
        p.validate()
    assert error.value.argument == "gate_space"
    with pytest.raises(ValueError):
        p.gate_space = "exp"


def test_inputs_use_alpha_and_the_state_dtype():
    p = gt.Problem.packed([4], H=1, HV=1, K=3, V=2, has_h0=True, has_hT=True, state_dtype="bf16",
                          gate_space="linear")
    x = gt.make_inputs(p, seed=3)
    assert "alpha" in x and "g" not in x
    assert ((x["alpha"] >= 0) & (x["alpha"] <= 1)).all()
    assert (bf16_round(x["h0"]) == x["h0"]).all()
    gt.validate_inputs(p, x)
    wrong = dict(x)
    wrong["g"] = np.log(wrong.pop("alpha"))
    with pytest.raises(gt.ProblemError) as error:
        gt.validate_inputs(p, wrong)
    assert error.value.argument == "g"
    negative = dict(x, alpha=-x["alpha"] - 0.5)
    with pytest.raises(gt.ProblemError) as error:
        gt.validate_inputs(p, negative)
    assert error.value.argument == "alpha"
    fine = dict(x, h0=x["h0"] + 1e-3)  # not a bf16 value
    with pytest.raises(gt.ProblemError) as error:
        gt.validate_inputs(p, fine)
    assert error.value.argument == "h0" and "bf16" in str(error.value)


def test_case_space_axes():
    space = gt.CaseSpace("decode", state_dtypes=["f32", "bf16"], gate_spaces="linear", fused_gates="off")
    assert space.to_json()["state_dtypes"] == ["f32", "bf16"] and space.to_json()["gate_spaces"] == ["linear"]
    assert gt.CaseSpace.from_json(json.dumps(space.to_json())) == space
    seen = set()
    for case in space.cases(40, seed=2):
        assert case.problem.gate_space == "linear"
        seen.add(case.problem.state_dtype)
    assert seen == {"f32", "bf16"}
    with pytest.raises(ValueError, match="state_dtypes"):
        gt.CaseSpace(state_dtypes=["f64"])
    assert gt.CaseSpace().to_json()["state_dtypes"] == ["f32"]


def test_a_kernel_with_bf16_states_and_alpha_passes_a_storage_bug_fails(tmp_path):
    good = gt.Kernel(storing_recurrence, name="tests.storing", formulation="sequential", supports=supports,
                     space=SPACE)
    result = gt.check(good, cases=60, out=tmp_path / "good")
    result.assert_pass()
    bad = gt.Kernel(lambda p, x: storing_recurrence(p, x, extra_rounding=True), name="tests.storing_bug",
                    formulation="sequential", supports=supports,
                    space=SPACE.replace(state_dtypes=["bf16"], intermediate_states="always"))
    failed = gt.check(bad, cases=30, out=tmp_path / "bad")
    assert failed.failed >= 1
    shrunk = gt.read_case_file(failed.failures[0].file)
    assert shrunk.metadata["gdn.format"] == "gdn-case/3" and shrunk.problem.state_dtype == "bf16"


def test_case_files_round_trip_format_3(tmp_path):
    p = gt.Problem.packed([5, 0, 2], H=1, HV=2, K=3, V=4, has_h0=True, has_hT=True, state_dtype="f16",
                          gate_space="linear", input_dtype="bf16")
    x = gt.make_inputs(p, seed=5)
    out = storing_recurrence(p, x)
    path = tmp_path / "c.safetensors"
    gt.write_case_file(path, p, x, out)
    back = gt.read_case_file(path)
    assert back.metadata["gdn.format"] == "gdn-case/3"
    assert back.problem == p and np.array_equal(back.inputs["alpha"], x["alpha"])
    assert gt.judge_case_file(path).status == "PASS"


def test_adapters_state_the_conventions():
    from gdn_testbed.adapters import flashinfer, vllm
    assert flashinfer.SPACE_PREFILL.to_json()["gate_spaces"] == ["linear"]
    assert set(flashinfer.SPACE_DECODE.to_json()["state_dtypes"]) == {"f32", "bf16"}
    log_problem = next(flashinfer.SPACE_PREFILL.replace(gate_spaces=["log"]).cases(1)).problem
    assert "alpha" in flashinfer.supports_prefill(log_problem)
    for case in vllm.SPACE_SPEC_DECODE.cases(20, seed=3):
        p = case.problem
        assert vllm.supports_spec_decode(p) is None
        accepted = vllm.accepted_tokens(p)
        assert all(1 <= a <= p.seq_len(0) for a in accepted)
    # Every CUDA-free reason names the option.
    p = next(vllm.SPACE_RECURRENT.cases(1)).problem
    p.state_dtype = "f16"
    assert "bfloat16" in vllm.supports_recurrent(p)
