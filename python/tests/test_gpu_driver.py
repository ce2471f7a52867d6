"""python/gpu/run_adapters.py on the CPU: the pinned compile variant of fla's Triton chunk path
and --narrow (python/gpu/README.md, "One compile variant")."""
import importlib.util
import os

import pytest

import gdn_testbed as gt


def driver():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu", "run_adapters.py")
    spec = importlib.util.spec_from_file_location("run_adapters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pinned_run_draws_one_compile_variant():
    """Every case of fla.chunk.triton.bf16.pinned has the same autotune key (H, HV, K, V), the same
    constexpr flags and whole chunks, and the kernel supports them all."""
    from gdn_testbed.adapters import fla
    d = driver()
    run = next(r for r in d.RUNS if r["id"] == "fla.chunk.triton.bf16.pinned")
    space = fla.CHUNK_TRITON.space.replace(**run["narrow"])
    keys, judged = set(), 0
    for case in space.cases(300, seed=1):
        p = case.problem
        assert fla.CHUNK_TRITON.supports(p) is None, p.describe()
        lengths = [p.seq_len(n) for n in range(p.N)]
        assert all(n > 0 and n % 64 == 0 for n in lengths), p.describe()
        keys.add((p.H, p.HV, p.K, p.V, p.input_dtype, p.gate_dtype, p.use_qk_l2norm, p.has_h0, p.has_hT,
                  p.gate_mode, p.state_layout, p.scale is None))
        judged += 1
    assert judged == 300 and len(keys) == 1, keys
    # The unpinned run keeps the edge lengths and both head layouts.
    wide = next(r for r in d.RUNS if r["id"] == "fla.chunk.triton.bf16")
    cases = list(fla.CHUNK_TRITON.space.replace(**wide["narrow"]).cases(200, seed=1))
    assert len({c.problem.HV for c in cases}) == 2
    assert any(c.problem.seq_len(n) % 64 for c in cases for n in range(c.problem.N))


def test_narrow_argument(capsys):
    d = driver()
    args = d.parse(["--out", "x", "--narrow", 'fla.chunk.triton.bf16={"length_values": [64, 128]}',
                    "--narrow", 'flash_qla.chunk={"max_sequences": 2}'])
    assert args.extra_narrow == {"fla.chunk.triton.bf16": {"length_values": [64, 128]},
                                 "flash_qla.chunk": {"max_sequences": 2}}
    run = next(r for r in d.RUNS if r["id"] == "fla.chunk.triton.bf16")
    # The worker gets its own run's narrowing, merged over the run's.
    command = d.worker_command(run, args, 10.0)
    worker = d.parse(command[command.index("--worker"):])
    assert worker.extra_narrow == {"fla.chunk.triton.bf16": {"length_values": [64, 128]}}
    narrow = d.run_narrowing(run, worker)
    assert narrow["length_values"] == [64, 128] and narrow["group_values"] == run["narrow"]["group_values"]
    args.full_spaces = True
    assert d.run_narrowing(run, args) == {"length_values": [64, 128]}
    for bad, rule in (("nosuchrun={}", "expected ID=JSON"), ("fla.chunk.triton.bf16=[1]", "non-empty JSON object"),
                      ("fla.chunk.triton.bf16={not json", "not JSON"),
                      ('fla.chunk.triton.bf16={"no_such_field": 1}', "fla.chunk.triton.bf16")):
        with pytest.raises(SystemExit):
            d.parse(["--out", "x", "--narrow", bad])
        assert rule in capsys.readouterr().err, bad
