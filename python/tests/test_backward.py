"""The backward in Python: references, the gradient judge, check_backward/fuzz_backward, autograd_kernel."""
import os

import numpy as np
import pytest

import gdn_testbed as gt

SPACE = gt.CaseSpace(max_K=16, max_V=16, max_work=4e4)


def exact(problem, x, dO, dhT):
    """The exact reference as a backward kernel (numpy in, numpy out)."""
    return gt.sequential_backward(problem, x, dO, dhT)


def scaled_beta(problem, x, dO, dhT):
    """A planted fault: dbeta (or db with fused gates) 1% too large."""
    g = gt.sequential_backward(problem, x, dO, dhT)
    g["dbeta" if "dbeta" in g else "db"] = g["dbeta" if "dbeta" in g else "db"] * 1.01
    return g


def case(seed=3):
    problem, inputs, _ = gt.sample_case(seed, gt.CaseSpace(max_K=16, max_V=16, max_work=4e4, fused_gates="off",
                                                            state_cache="off", intermediate_states="off"))
    return problem, inputs, gt.make_backward_inputs(problem, seed)


def test_references_agree():
    problem, inputs, b = case()
    seq = gt.sequential_backward(problem, inputs, b["dO"], b["dhT"])
    chunked = gt.chunked_backward(problem, inputs, b["dO"], b["dhT"], chunk_size=5)
    f80 = gt.sequential_backward(problem, inputs, b["dO"], b["dhT"], precision="f80")
    grads, magnitudes = gt.sequential_backward(problem, inputs, b["dO"], b["dhT"], term_magnitudes=True)
    assert set(seq) == set(gt.backward_tensors(problem)) == set(magnitudes)
    for name in seq:
        scale = max(float(np.max(magnitudes[name], initial=0)), 1e-300)
        assert np.max(np.abs(seq[name] - chunked[name]), initial=0) <= 1e-12 * scale, name
        assert np.max(np.abs(seq[name] - f80[name].astype(np.float64)), initial=0) <= 1e-13 * scale, name
        assert np.all(magnitudes[name] >= np.abs(grads[name]) * (1 - 1e-12)), name


def test_judge_backward():
    problem, inputs, b = case()
    emulation = gt.emulate_backward(problem, inputs, b["dO"], b["dhT"], formulation="sequential")
    v = gt.judge_backward(problem, inputs, b["dO"], b["dhT"], emulation)
    assert v.status == "PASS" and 0 < v.worst_margin <= 0.5 + 1e-12
    assert [c["tensor"] for c in v.checks] == gt.backward_tensors(problem)
    broken = dict(emulation, dv=emulation["dv"] * 1.05)
    v = gt.judge_backward(problem, inputs, b["dO"], b["dhT"], broken)
    assert v.status == "FAIL" and v.worst_check["tensor"] == "dv"
    missing = {k: v for k, v in emulation.items() if k != "dq"}
    v = gt.judge_backward(problem, inputs, b["dO"], b["dhT"], missing)
    assert v.status == "ERROR" and "dq" in v.message
    v = gt.judge_backward(problem, inputs, b["dO"], b["dhT"], emulation, budget="bitwise", first=emulation)
    assert v.status == "PASS"
    with pytest.raises(ValueError, match="dO"):
        gt.judge_backward(problem, inputs, b["dO"] + 1e-9, b["dhT"], emulation)


def test_exact_reference_passes(tmp_path):
    kernel = gt.BackwardKernel(exact, name="tests.exact_backward", formulation="sequential")
    result = gt.check_backward(kernel, SPACE, cases=40, out=tmp_path)
    result.assert_pass()
    assert result.passed == 40 and result.failures == [] and result.worst_margin < 1e-3


def test_planted_fault_fails_readably(tmp_path):
    kernel = gt.BackwardKernel(scaled_beta, name="tests.scaled_beta", formulation="sequential")
    result = gt.check_backward(kernel, SPACE, cases=60, out=tmp_path)
    assert not result.ok and result.failures_total == 1 and len(result.failures) == 1
    failure = result.failures[0]
    assert failure.verdict.status == "FAIL"
    assert failure.verdict.worst_check["tensor"] in ("dbeta", "db")
    with pytest.raises(AssertionError) as error:
        result.assert_pass()
    message = str(error.value)
    for part in ("shrunk case", "worst check", "margin", "replay", failure.file):
        assert part in message
    original = failure.file.replace(".safetensors", ".original.safetensors")
    assert failure.file.endswith(".safetensors") and os.path.exists(failure.file) and os.path.exists(original)
    # The shrinker made the case smaller, and both replays judge it again.
    assert gt.load_backward_case(failure.file)["problem"].T <= gt.load_backward_case(original)["problem"].T
    assert gt.replay_backward(None, failure.file).status == "FAIL"
    assert gt.replay_backward(exact, failure.file).status == "PASS"
    # The failure is a case file (gdn-case/2): its settings in the metadata, and the judge of
    # case files (what `gdn-testbed verify` runs) gives the same verdict, on the same tensor.
    c = gt.read_case_file(failure.file)
    assert c.metadata["gdn.format"] == "gdn-case/2" and c.metadata["gdn.implementation"] == "tests.scaled_beta"
    assert c.metadata["gdn.formulation"] == "sequential" and c.metadata["gdn.shrunk_from"] == original
    assert c.backward is not None and set(c.gradients) == set(gt.backward_tensors(c.problem))
    v = gt.judge_case_file(failure.file)
    assert v.status == "FAIL" and v.worst_check["tensor"] in ("dbeta", "db")


def test_case_files_hold_the_backward(tmp_path):
    """gdn-case/2 from Python: cotangents and gradients written, read back exactly, judged."""
    problem, inputs, b = case()
    grads = gt.sequential_backward(problem, inputs, b["dO"], b["dhT"])
    path = tmp_path / "case.safetensors"
    gt.write_case_file(path, problem, inputs, None, {"gdn.formulation": "sequential"}, backward=b, gradients=grads)
    c = gt.read_case_file(path)
    assert c.metadata["gdn.format"] == "gdn-case/2" and c.outputs is None
    assert np.array_equal(c.backward["dO"], b["dO"])
    assert (c.backward["dhT"] is None) == (b["dhT"] is None)
    if b["dhT"] is not None:
        assert np.array_equal(c.backward["dhT"], b["dhT"])
    assert set(c.gradients) == set(grads) and all(np.array_equal(c.gradients[n], grads[n]) for n in grads)
    assert gt.judge_case_file(path).status == "PASS"
    # A forward-only file stays gdn-case/1 and has no backward.
    gt.write_case_file(tmp_path / "forward.safetensors", problem, inputs)
    f = gt.read_case_file(tmp_path / "forward.safetensors")
    assert f.metadata["gdn.format"] == "gdn-case/1" and f.backward is None and f.gradients is None
    # The writer's rules are the reader's: gradients need dO, and only the problem's gradients.
    with pytest.raises(ValueError, match="gradients need the backward's inputs"):
        gt.write_case_file(tmp_path / "bad.safetensors", problem, inputs, gradients=grads)
    with pytest.raises(ValueError, match="'da' is not one of this problem's"):
        gt.write_case_file(tmp_path / "bad.safetensors", problem, inputs, backward=b,
                           gradients=dict(grads, da=grads["dg"]))


def test_replay_reads_npz_of_earlier_versions(tmp_path):
    """replay_backward and load_backward_case still read the .npz that earlier versions saved."""
    import json
    problem, inputs, b = case()
    grads = gt.sequential_backward(problem, inputs, b["dO"], b["dhT"])
    arrays = {"format": np.array(gt.backward.NPZ_FORMAT), "problem": np.array(problem.to_json()),
              "settings": np.array(json.dumps({"implementation": "old", "formulation": "sequential",
                                               "chunk_size": 64, "budget": "calibrated"}))}
    arrays.update({"in." + n: np.asarray(v) for n, v in inputs.items()})
    arrays.update({"bwd." + n: np.asarray(v) for n, v in b.items() if v is not None})
    arrays.update({"out." + n: v * (1.05 if n == "dv" else 1.0) for n, v in grads.items()})
    path = tmp_path / "old.npz"
    np.savez(path, **arrays)
    assert gt.load_backward_case(path)["settings"]["implementation"] == "old"
    v = gt.replay_backward(None, path)
    assert v.status == "FAIL" and v.worst_check["tensor"] == "dv"
    assert gt.replay_backward(exact, path).status == "PASS"


def test_kernel_errors_are_errors(tmp_path):
    def broken(problem, x, dO, dhT):
        raise RuntimeError("backward exploded")

    result = gt.fuzz_backward(broken, SPACE, cases=3, out=tmp_path, shrink=False)
    assert result.errors == 3 and not result.ok
    assert "backward exploded" in result.failures[0].verdict.message
    with pytest.raises(ValueError, match="limit"):
        gt.fuzz_backward(exact, SPACE, cases=0)


def test_autograd_kernel(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed: autograd_kernel is not tested here")

    def forward(problem, x):
        """The recurrence of docs/semantics.md section 2 in torch (float64 inside), direct gates,
        K-major states."""
        cu = [int(c) for c in x["cu_seqlens"]]
        q, k, v = (x[n].double() for n in ("q", "k", "v"))
        g, beta = x["g"].double(), x["beta"].double()
        if problem.use_qk_l2norm:
            q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
            k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        group = problem.group_size
        o_rows, states = [], []
        for n in range(problem.N):
            heads = []
            for j in range(problem.HV):
                h = j // group
                S = x["h0"][n, j].double() if problem.has_h0 else torch.zeros(problem.K, problem.V, dtype=torch.float64)
                for t in range(cu[n], cu[n + 1]):
                    S = S * torch.exp(g[t, j])
                    S = S + torch.outer(k[t, h], beta[t, j] * (v[t, j] - k[t, h] @ S))
                    o_rows.append((t, j, problem.effective_scale * (q[t, h] @ S)))
                heads.append(S)
            states.append(torch.stack(heads))
        rows = {(t, j): r for t, j, r in o_rows}
        zero = torch.zeros(problem.V, dtype=torch.float64)
        o = torch.stack([torch.stack([rows.get((t, j), zero) for j in range(problem.HV)]) for t in range(problem.T)]) \
            if problem.T > 0 else torch.zeros(problem.v_shape, dtype=torch.float64)
        hT = torch.stack(states).float() if problem.has_hT else None
        return o.to(x["v"].dtype), hT

    def supports(problem):
        if problem.gate_mode != "direct" or problem.state_layout != "k_major":
            return "direct gates, K-major states"
        return None

    kernel = gt.autograd_kernel(forward, name="tests.torch_autograd", formulation="sequential", supports=supports,
                                device="cpu")
    result = gt.check_backward(kernel, gt.CaseSpace(max_K=8, max_V=8, max_work=5e3, input_dtypes=["f32"]),
                               cases=20, out=tmp_path)
    result.assert_pass()


def operand_design(problem, x, dO, dhT):
    """A backward of the design that stores every product's operand in the input dtype."""
    return gt.emulate_backward(problem, x, dO, dhT, formulation="chunked", baseline="operands_single")


def test_operand_baseline_judges_a_bf16_operand_design(tmp_path):
    # docs/budgets.md "Gradients": such a backward misses the fp32 budget by its design and passes
    # its own (gt.OPERANDS_SINGLE, the operand model as the baseline); a fault in it still fails.
    space = gt.CaseSpace(max_K=16, max_V=16, max_work=4e4, dtypes=["bf16"], state_cache="off",
                         intermediate_states="off")
    kernel = gt.BackwardKernel(operand_design, name="tests.operand_design", formulation="chunked")
    fp32 = gt.check_backward(kernel, space, cases=40, out=tmp_path / "fp32")
    assert not fp32.ok
    own = gt.check_backward(kernel, space, cases=40, out=tmp_path / "own", budget=gt.OPERANDS_SINGLE)
    own.assert_pass()
    assert own.passed == 40 and own.worst_margin <= 0.5 + 1e-12

    def worse(problem, x, dO, dhT):
        g, e = operand_design(problem, x, dO, dhT), gt.sequential_backward(problem, x, dO, dhT)
        return {k: e[k] + 16 * (g[k] - e[k]) for k in g}

    bad = gt.check_backward(gt.BackwardKernel(worse, name="tests.operand_design_x16", formulation="chunked"), space,
                            cases=40, out=tmp_path / "bad", budget=gt.OPERANDS_SINGLE)
    assert not bad.ok
    problem, inputs, b = case()
    with pytest.raises(ValueError, match="chunked form"):
        gt.emulate_backward(problem, inputs, b["dO"], b["dhT"], formulation="sequential", baseline="operands_single")
