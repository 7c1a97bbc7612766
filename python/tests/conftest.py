"""conftest.py: what the tests share: the source tree, the cavs command (as $CAVS, which
tests/check_python.sh sets to the build tree's), a scratch directory with toy data made
by `cavs gen`, and a way to run cavs."""
import os
import subprocess

import pytest

TOP = os.path.abspath(os.environ.get("TOP_SRCDIR") or os.path.join(os.path.dirname(__file__), "..", ".."))


def cavs_cli(*args, check=True):
    """cavs with these arguments: (exit status, stdout, stderr); a failure fails the test
    when check."""
    exe = os.environ.get("CAVS", "cavs")
    r = subprocess.run([exe, *map(str, args)], capture_output=True, text=True)
    if check and r.returncode:
        pytest.fail(f"cavs {' '.join(map(str, args))}: exit {r.returncode}\n{r.stderr}")
    return r.returncode, r.stdout, r.stderr


def model_path(name):
    return os.path.join(TOP, "dsl-examples", name)


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """A toy treebank: train.txt (400 trees) and dev.txt (100), in a directory of its own."""
    d = tmp_path_factory.mktemp("data")
    cavs_cli("gen", "toy", "--graphs", 400, "--leaves", 10, "--words", 40, "--seed", 1, "-o", d / "train.txt")
    cavs_cli("gen", "toy", "--graphs", 100, "--leaves", 10, "--words", 40, "--seed", 2, "-o", d / "dev.txt")
    return d
