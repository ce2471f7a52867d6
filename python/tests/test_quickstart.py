"""The README's quickstart ("Verify your kernel in five minutes") runs as written: its two files,
taken from README.md, fail with a shrunk case with the planted bug and pass without it."""
import os
import re
import subprocess
import sys

import pytest

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")


def quickstart_files() -> dict:
    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = text.split("## Verify your kernel in five minutes", 1)[1].split("\n## ", 1)[0]
    files = {}
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        name = re.match(r"# (\S+\.py)\n", block)
        assert name, f"a quickstart block does not start with '# FILE.py': {block[:80]!r}"
        files[name.group(1)] = block
    assert set(files) == {"my_kernel.py", "test_my_kernel.py"}, sorted(files)
    return files


@pytest.mark.parametrize("bug", [True, False])
def test_readme_quickstart(tmp_path, bug):
    files = quickstart_files()
    assert "BUG = True" in files["my_kernel.py"]
    if not bug:
        files["my_kernel.py"] = files["my_kernel.py"].replace("BUG = True", "BUG = False")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path)] + sys.path), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_kernel.py"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    if bug:
        assert run.returncode == 1, run.stdout + run.stderr
        shrunk = re.search(r"shrunk case:\s+N=1 T=(\d+) ", run.stdout)
        assert shrunk and 64 < int(shrunk.group(1)) <= 80, run.stdout
        assert "replay:" in run.stdout and "my_kernel.py:my_kernel replay" in run.stdout
    else:
        assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr
