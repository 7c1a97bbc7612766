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


def test_tutorial_runs(data, tmp_path):
    code = tutorial()
    assert "cavs.train(" in code and "model.outputs(" in code and "sklearn" not in code
    os.symlink(data / "train.txt", tmp_path / "train.txt")
    os.symlink(data / "dev.txt", tmp_path / "dev.txt")
    os.symlink(os.path.join(TOP, "dsl-examples"), tmp_path / "dsl-examples")
    code += "\nassert h_train.shape == (len(train), 64) and y_dev.shape == (len(dev),)\n"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "epoch 3: train loss" in r.stdout and "'accuracy'" in r.stdout
