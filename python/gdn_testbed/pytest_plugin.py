"""pytest plugin (entry point pytest11 "gdn_testbed.pytest_plugin"): the `gdn_check` fixture and
the --gdn-cases / --gdn-seconds / --gdn-seed options.

    def test_my_kernel(gdn_check):
        gdn_check(my_kernel, space).assert_pass()

gdn_check is gdn_testbed.check with out= the test's tmp_path (failures and their case files
stay there; the message names them) and cases, seconds and seed from the command line
(defaults 200 cases, no time limit, seed 1). Nothing is imported until the fixture is used.
"""
from __future__ import annotations

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("gdn_testbed")
    group.addoption("--gdn-cases", type=int, default=None, help="cases per gdn_check (default: the test's, else 200)")
    group.addoption("--gdn-seconds", type=float, default=None, help="time limit per gdn_check")
    group.addoption("--gdn-seed", type=int, default=None, help="campaign seed of gdn_check (default 1)")


@pytest.fixture
def gdn_check(request, tmp_path):
    from . import check

    config = request.config

    def run(kernel, space=None, **options):
        if config.getoption("--gdn-cases") is not None:
            options["cases"] = config.getoption("--gdn-cases")
        if config.getoption("--gdn-seconds") is not None:
            options["seconds"] = config.getoption("--gdn-seconds")
        if config.getoption("--gdn-seed") is not None:
            options["seed"] = config.getoption("--gdn-seed")
        options.setdefault("out", str(tmp_path / "gdn-check"))
        return check(kernel, space, **options)

    return run
