"""CaseSpace: the C++ space's fields, its JSON, the pinned axes, and the CLI's --space."""
import json
import os
import subprocess

import pytest

import gdn_testbed as gt


def test_json_round_trip_and_strictness(tmp_path):
    space = gt.CaseSpace(dtypes="bf16", K=128, V=[64, 128], H=[1, 2], group=[1, 4], lengths=[0, 1, 63, 64, 65],
                         sequences=(2, 3), regimes=["underflow"], v_major="always", l2norm=False)
    data = space.to_json()
    assert data["format"] == "gdn-case-space/1" and data["K_values"] == [128] and data["l2norm"] == "off"
    assert gt.CaseSpace.from_json(data) == space
    path = tmp_path / "space.json"
    space.save(path)
    assert gt.CaseSpace.load(path) == space
    with pytest.raises(ValueError, match="not_a_field"):
        gt.CaseSpace(not_a_field=1)
    with pytest.raises(ValueError, match="input_dtypes"):
        gt.CaseSpace(dtypes="bf17")
    with pytest.raises(ValueError, match="K_values"):
        gt.CaseSpace(K=0)
    with pytest.raises(ValueError, match="min_sequences"):
        gt.CaseSpace(sequences=(4, 2))
    with pytest.raises(ValueError, match="always"):
        gt.CaseSpace(v_major="often")


def test_pinned_axes_are_respected():
    space = gt.CaseSpace(dtypes="bf16", K=128, V=[64, 128], H=[1, 2], group=[1, 4], lengths=[0, 1, 63, 64, 65],
                         sequences=(2, 3), v_major="always", fused_gates="off", scale=[0.25], explicit_scale="always",
                         state_cache="always", padding="off", max_work=5e6)
    seen_V = set()
    for case in space.cases(40, seed=3):
        p = case.problem
        assert p.input_dtype == "bf16" and p.K == 128 and p.V in (64, 128)
        assert p.H in (1, 2) and p.HV // p.H in (1, 4)
        assert 2 <= p.N <= 3 and all(p.seq_len(n) in (0, 1, 63, 64, 65) for n in range(p.N))
        assert p.state_layout == "v_major" and p.gate_mode == "direct" and p.scale == 0.25
        assert p.uses_state_cache and all(i >= 0 for i in case.inputs["state_indices"])
        seen_V.add(p.V)
    assert seen_V == {64, 128}


def test_default_space_unchanged_by_the_new_axes():
    # The same seeds give the same cases whether or not the new fields are spelled out at their
    # defaults (the C++ generator's draw is unchanged when they are empty: fuzz/ tests check
    # the draw itself).
    plain = gt.CaseSpace()
    spelled = gt.CaseSpace(K_values=[], V_values=[], H_values=[], group_values=[], length_values=[],
                           scale_values=[], min_sequences=1, padding="sometimes")
    for seed in range(20):
        assert gt.sample_case(seed, plain).problem == gt.sample_case(seed, spelled).problem


@pytest.mark.skipif(not os.environ.get("GDN_TESTBED_CLI"), reason="GDN_TESTBED_CLI (the gdn-testbed binary) not set")
def test_cli_generate_reads_the_same_space(tmp_path):
    space = gt.CaseSpace(dtypes="f16", K=[32], V=[16], lengths=[1, 65], fused_gates="off")
    space.save(tmp_path / "space.json")
    out = tmp_path / "cases"
    cli = os.environ["GDN_TESTBED_CLI"]
    subprocess.run([cli, "generate", "--out", str(out), "--cases", "6", "--seed", "9", "--space",
                    str(tmp_path / "space.json")], check=True, capture_output=True)
    files = sorted(out.glob("case-*.safetensors"))
    assert len(files) == 6
    for index, path in enumerate(files):
        c = gt.read_case_file(path)
        assert c.problem.input_dtype == "f16" and c.problem.K == 32 and c.problem.V == 16
        # generate --seed S draws case i from case_seed(S, i): the same case in Python
        assert c.problem == list(space.cases(index + 1, seed=9))[index].problem
    # A flag given on the command line overrides the file's field.
    subprocess.run([cli, "generate", "--out", str(out), "--force", "--cases", "3", "--space",
                    str(tmp_path / "space.json"), "--max-tokens", "1"], check=True, capture_output=True)
    assert all(gt.read_case_file(p).problem.T <= 1 for p in out.glob("case-*.safetensors"))
    (tmp_path / "bad.json").write_text(json.dumps({"K_values": [0]}))
    r = subprocess.run([cli, "generate", "--out", str(tmp_path / "x"), "--space", str(tmp_path / "bad.json")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--space" in r.stderr + r.stdout and "K_values" in r.stderr + r.stdout


@pytest.mark.skipif(not os.environ.get("GDN_TESTBED_CLI"), reason="GDN_TESTBED_CLI (the gdn-testbed binary) not set")
def test_cli_preset_and_dtypes(tmp_path):
    """--preset NAME draws from that preset (the cases CaseSpace(preset=NAME) gives), --dtypes pins
    the input dtypes; bad values, and --preset beside --space, are usage errors naming the flag."""
    cli = os.environ["GDN_TESTBED_CLI"]
    out = tmp_path / "cases"
    subprocess.run([cli, "generate", "--out", str(out), "--cases", "8", "--seed", "4", "--preset", "chunked_prefill",
                    "--dtypes", "f16"], check=True, capture_output=True)
    space = gt.CaseSpace("chunked_prefill", dtypes="f16")
    files = sorted(out.glob("case-*.safetensors"))
    assert len(files) == 8
    for index, path in enumerate(files):
        p = gt.read_case_file(path).problem
        assert p.input_dtype == "f16" and p.K % 16 == 0 and p.V % 16 == 0
        assert p == list(space.cases(index + 1, seed=4))[index].problem
    (tmp_path / "space.json").write_text(json.dumps({"preset": "chunked_prefill"}))
    for args, flag in ((["--preset", "nope"], "--preset"), (["--dtypes", "f64"], "--dtypes"),
                       (["--dtypes", "bf16,x"], "--dtypes"),
                       (["--preset", "decode", "--space", str(tmp_path / "space.json")], "--preset")):
        r = subprocess.run([cli, "generate", "--out", str(tmp_path / "x"), *args], capture_output=True, text=True)
        assert r.returncode == 2 and flag in r.stderr + r.stdout, (args, r.stderr + r.stdout)
        assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())
