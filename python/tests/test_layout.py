"""The package's ctypes structures against cavs.h and cavs_abi.h as a C compiler lays them
out: every field's offset and each structure's size. A field added to a C structure and
not to its mirror here (cavs_train_state grew twice) would have libcavs read past the
Python object, or save garbage into a checkpoint; this catches it."""
import ctypes
import os
import shutil
import subprocess

import pytest

from cavs import _capi as C
from conftest import TOP

MIRRORS = {"Lin": "cavs_lin", "DimDesc": "cavs_dim_desc", "OptionDesc": "cavs_option_desc",
           "InputDesc": "cavs_input_desc", "ParamDesc": "cavs_param_desc", "VertexDesc": "cavs_vertex_desc",
           "LossDesc": "cavs_loss_desc", "ValueDesc": "cavs_value_desc", "Desc": "cavs_desc", "Graph": "cavs_graph",
           "Stats": "cavs_stats", "LossAcc": "cavs_loss_acc", "Optim": "cavs_optim", "ModelOpts": "cavs_model_opts",
           "TrainState": "cavs_train_state"}


def test_structures_match_the_headers(tmp_path):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "cavs.h"', '#include "cavs_abi.h"',
             'int main(void) {']
    want = []
    for py, c in MIRRORS.items():
        st = getattr(C, py)
        lines.append(f'  printf("{py} %zu\\n", sizeof({c}));')
        want.append(f"{py} {ctypes.sizeof(st)}")
        for name, *_ in st._fields_:
            lines.append(f'  printf("{py}.{name} %zu\\n", offsetof({c}, {name}));')
            want.append(f"{py}.{name} {getattr(st, name).offset}")
        # every C field has a mirror: the last one's end is the structure's size, less padding
        last = st._fields_[-1][0]
        lines.append(f'  printf("{py} ends %d\\n", sizeof({c}) - offsetof({c}, {last}) - '
                     f'sizeof((({c} *)0)->{last}) < _Alignof({c}));')
        want.append(f"{py} ends 1")
    lines += ['  return 0;', '}']
    (tmp_path / "layout.c").write_text("\n".join(lines) + "\n")
    inc = [f"-I{os.path.join(TOP, 'runtime')}", f"-I{TOP}"]
    subprocess.run([cc, "-std=c11", *inc, "-o", str(tmp_path / "layout"), str(tmp_path / "layout.c")], check=True)
    got = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True, check=True).stdout.split("\n")
    assert [g for g in got if g] == want
