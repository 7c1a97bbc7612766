"""test_readme.py: python/README's tutorial, run as it is written (the lines above its
first "optional" mark, which need scikit-learn or PyTorch), on a toy treebank."""
import os
import subprocess
import sys

from conftest import TOP


def tutorial():
    lines = open(os.path.join(TOP, "python", "README")).read().split("\n")
    start = lines.index("Tutorial: the SST Tree-LSTM")
    code, inside = [], False
    for line in lines[start:]:
        if line.startswith("    ") or (inside and not line):
            inside = True
            if "# --- optional" in line:
                break
            code.append(line[4:])
        elif inside:
            break
    return "\n".join(code)


def absolute_env():
    """The environment, with the paths that find cavs (PYTHONPATH, $CAVS, $CAVS_LIB) made
    absolute: the tutorial runs in a directory of its own, where a relative one (pytest
    run by hand with PYTHONPATH=python) would find nothing."""
    env = dict(os.environ)
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    for k in ("CAVS", "CAVS_LIB"):
        if os.sep in env.get(k, ""):  # (a bare name is looked up in PATH, as it was)
            env[k] = os.path.abspath(env[k])
    return env


def test_tutorial_runs(data, tmp_path):
    code = tutorial()
    assert "cavs.train(" in code and "model.outputs(" in code and "sklearn" not in code
    os.symlink(data / "train.txt", tmp_path / "train.txt")
    os.symlink(data / "dev.txt", tmp_path / "dev.txt")
    os.symlink(os.path.join(TOP, "dsl-examples"), tmp_path / "dsl-examples")
    code += "\nassert h_train.shape == (len(train), 64) and y_dev.shape == (len(dev),)\n"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=absolute_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "epoch 3: train loss" in r.stdout and "'accuracy'" in r.stdout
