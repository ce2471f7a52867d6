"""fuzz and check on Python kernels: the C++ campaign, judge and shrinker with the kernel called back."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gdn_testbed as gt
import planted_kernels

HERE = os.path.dirname(os.path.abspath(__file__))


def test_correct_kernel_passes():
    result = gt.check(planted_kernels.GOOD, cases=60)
    result.assert_pass()
    assert result.passed == 60 and result.failures == [] and result.worst_margin < 1


def test_planted_bug_is_found_shrunk_and_saved(tmp_path):
    result = gt.check(planted_kernels.BAD, cases=300, out=tmp_path)
    assert not result.ok and len(result.failures) == 1
    failure = result.failures[0]
    shrunk = failure.verdict
    assert shrunk.status == "FAIL"
    # The bug needs one decay at position 64: the shrinker keeps about one sequence of 65 tokens.
    problem = gt.read_case_file(failure.file).problem
    assert problem.T <= 130 and problem.N == 1 and problem.HV == 1
    with pytest.raises(AssertionError) as error:
        result.assert_pass()
    message = str(error.value)
    for part in ("shrunk case", "worst check", "margin", "replay", failure.file):
        assert part in message
    # The replay command names this test file's kernel and reruns it.
    assert "--kernel" in failure.replay and "planted_kernels.py:BAD" in failure.replay
    command = failure.replay.replace("python3 -m gdn_testbed", f"{sys.executable} -m gdn_testbed", 1)
    run = subprocess.run(command, shell=True, capture_output=True, text=True, cwd=HERE)
    assert run.returncode == 1 and "FAIL" in run.stdout, run.stdout + run.stderr
    assert gt.replay(planted_kernels.BAD, failure.file).status == "FAIL"
    assert gt.replay(planted_kernels.GOOD, failure.file).status == "PASS"
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["format"] == "gdn-fuzz-results/1" and results["failures_total"] == 1


def test_fuzz_counts_every_failure_and_saves_some(tmp_path):
    result = gt.fuzz(planted_kernels.BAD, cases=40, out=tmp_path, max_failures=2, shrink=False, progress=False)
    assert result.cases == 40 and result.failures_total == result.failed >= 2
    assert len(result.failures) == 2 and all(os.path.exists(f.file) for f in result.failures)


def test_registered_fault_in_process(tmp_path):
    result = gt.fuzz("fault.dropped_decay", gt.CaseSpace(max_work=2e5), cases=40, out=tmp_path, progress=False)
    assert result.failures_total > 0


def test_unsupported_everywhere_is_not_a_pass(tmp_path):
    k = gt.Kernel(planted_kernels.recurrence, supports=lambda p: "nothing")
    result = gt.check(k, planted_kernels.SPACE, cases=5, out=tmp_path)
    assert result.skipped == 5 and not result.ok
    with pytest.raises(AssertionError, match="no case was judged"):
        result.assert_pass()


def test_kernel_errors_are_errors(tmp_path):
    def broken(problem, x):
        raise RuntimeError("kernel exploded")

    result = gt.check(gt.Kernel(broken, supports=planted_kernels.supports), planted_kernels.SPACE, cases=5,
                      out=tmp_path)
    assert result.errors == 1 and "kernel exploded" in result.failures[0].verdict.message

    def wrong_shape(problem, x):
        return {"o": np.zeros((1, 1, 1))}

    result = gt.check(gt.Kernel(wrong_shape, supports=planted_kernels.supports), planted_kernels.SPACE, cases=5,
                      out=tmp_path)
    assert result.errors == 1 and "shape" in result.failures[0].verdict.message

    def late_unsupported(problem, x):
        raise gt.Unsupported("decided too late")

    result = gt.check(gt.Kernel(late_unsupported), planted_kernels.SPACE, cases=5, out=tmp_path)
    assert result.errors == 1 and "supports=" in result.failures[0].verdict.message


def test_limits_are_required():
    with pytest.raises(ValueError, match="limit"):
        gt.fuzz(planted_kernels.GOOD, cases=0, seconds=0)


PLUGIN_TEST = textwrap.dedent("""
    import gdn_testbed as gt
    import planted_kernels

    def test_kernel(gdn_check):
        gdn_check(planted_kernels.{name}, cases=150).assert_pass()
""")


@pytest.mark.parametrize("name, passes", [("GOOD", True), ("BAD", False)])
def test_pytest_plugin(tmp_path, name, passes):
    (tmp_path / "test_mine.py").write_text(PLUGIN_TEST.format(name=name))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + sys.path), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "gdn_testbed.pytest_plugin", "-p",
                          "no:cacheprovider", str(tmp_path / "test_mine.py")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert (run.returncode == 0) == passes, run.stdout + run.stderr
    if not passes:
        assert "shrunk case" in run.stdout and "replay" in run.stdout
