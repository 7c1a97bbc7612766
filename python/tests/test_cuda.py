"""test_cuda.py: the package on the cuda backend against the cpu backend. Run where the
library has a cuda backend that can run: tests/check_python.sh runs it a second time
with libcavs built on the emulated device of tests/cuda_emu.h (CAVS_TEST_CUDA=1, CAVS
the cavs command built on it, whose `build --target cuda` compiles MODEL.cu for it), and
on a machine with a GPU it runs against the real one. Elsewhere it is skipped."""
import os
import subprocess
import sys

import numpy as np
import pytest

import cavs
from conftest import model_path

pytestmark = pytest.mark.skipif(os.environ.get("CAVS_TEST_CUDA") != "1", reason="no cuda backend to test (CAVS_TEST_CUDA)")


def pair(vf, dims, vocab=None, data=()):
    """The same model on both devices, from one seed."""
    cpu = cavs.Model(cavs.compile(model_path(vf)), dims=dims, vocab=vocab, data=data, seed=4)
    cuda = cavs.Model(cavs.compile(model_path(vf), target="cuda"), dims=dims, vocab=vocab, data=data, seed=4,
                      device="cuda")
    return cpu, cuda


def test_training_on_cuda_is_the_cpus(data):
    """Two epochs of the Tree-LSTM (dropout off: the same masks are drawn, but keep it
    simple) on each device: every record within float's rounding; parameters copied out
    the same; a parameter written in comes back."""
    spec = cavs.compile(model_path("treelstm.vf"))
    vocab = cavs.Vocab()
    train = cavs.Dataset.load(data / "train.txt", "ptb-tree", spec, vocab, grow=True)
    dev = cavs.Dataset.load(data / "dev.txt", "ptb-tree", spec, vocab)
    cpu, cuda = pair("treelstm.vf", {"E": 8, "H": 8}, vocab)
    assert cuda.device == "cuda" and cpu.device == "cpu"
    for n in cpu.spec.params:
        assert np.array_equal(cpu.param(n), cuda.param(n)), n
    hist = [cavs.train(m, train, dev, epochs=2, batch=16, lr=0.01, seed=3) for m in (cpu, cuda)]
    for a, b in zip(*hist):
        for key in ("train_loss", "dev_loss", "dev_acc", "grad_norm_max"):
            assert a[key] == pytest.approx(b[key], rel=2e-4), key
    for n in cpu.spec.params:
        assert np.allclose(cpu.param(n), cuda.param(n), rtol=1e-3, atol=1e-5), n
    w = np.arange(np.prod(cuda.param("Wi").shape), dtype=np.float32).reshape(cuda.param("Wi").shape) / 100
    cuda.set_param("Wi", w)
    assert np.array_equal(cuda.param("Wi"), w)
    cpu.load_state_dict(cuda.state_dict())
    assert all(np.array_equal(cpu.param(n), cuda.param(n)) for n in cpu.spec.params)
    assert cavs.evaluate(cpu, dev)["loss"] == pytest.approx(cavs.evaluate(cuda, dev)["loss"], rel=1e-5)


def test_carried_state_on_cuda(tmp_path):
    """The language model in text-bptt chunks, its state carried from chunk to chunk, on
    both devices: the same losses."""
    (tmp_path / "lm.txt").write_text("".join(f"w{i % 7} a w{i % 3} b c\n" for i in range(60)))
    spec = cavs.compile(model_path("lstm_lm.vf"))
    vocab = cavs.Vocab()
    train = cavs.Dataset.load(tmp_path / "lm.txt", "text-bptt:7", spec, vocab, grow=True)
    cpu, cuda = pair("lstm_lm.vf", {"E": 6, "H": 6}, vocab)
    hist = [cavs.train(m, train, train, epochs=2, batch=4, lr=0.02, seed=2, bptt_state="carry") for m in (cpu, cuda)]
    for a, b in zip(*hist):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=2e-4)
        assert a["dev_loss"] == pytest.approx(b["dev_loss"], rel=2e-4)


def _emulator():
    """libcavs built on the emulated device, its fault hooks (tests/cuda_emu_api.h), or None
    on a real GPU."""
    import ctypes
    lib = ctypes.CDLL(os.environ.get("CAVS_LIB") or "libcavs.so.2")
    return lib if hasattr(lib, "cavs_emu_fail_malloc") else None


def test_device_out_of_memory_and_fault(data, tmp_path):
    """The device's failures raised as what they are. An allocation on the device that
    fails in a pass (its rows grown): OutOfMemoryError, from the step after it too; once
    the memory is there, the same minibatch gives the loss a model never refused gives.
    A kernel's fault (sticky, as a GPU's: so in a process of its own): DeviceError, and
    again from every pass after it."""
    emu = _emulator()
    if emu is None:
        pytest.skip("faults are injected on the emulated device only")
    import ctypes
    spec = cavs.compile(model_path("treelstm.vf"), target="cuda")
    vocab = cavs.Vocab()
    train = cavs.Dataset.load(data / "train.txt", "ptb-tree", spec, vocab, grow=True)
    graphs = [train[i] for i in range(len(train))]
    model, fresh = (cavs.Model(spec, dims={"E": 8, "H": 8}, vocab=vocab, seed=4, device="cuda") for _ in range(2))
    model.forward(graphs[:2])
    emu.cavs_emu_fail_malloc(ctypes.c_long(1))
    try:
        with pytest.raises(cavs.OutOfMemoryError, match="out of memory"):
            model.forward(graphs)
    finally:
        emu.cavs_emu_fail_malloc(ctypes.c_long(0))
    model.backward()
    with pytest.raises(cavs.OutOfMemoryError):
        model.step("adam", lr=0.1)
    assert model.forward(graphs)["loss"] == fresh.forward(graphs)["loss"]
    script = tmp_path / "fault.py"
    script.write_text(f"""
import ctypes, os, sys
import cavs
spec = cavs.compile({model_path("treelstm.vf")!r}, target="cuda")
vocab = cavs.Vocab()
train = cavs.Dataset.load({str(data / "train.txt")!r}, "ptb-tree", spec, vocab, grow=True)
model = cavs.Model(spec, dims={{"E": 8, "H": 8}}, vocab=vocab, seed=4, device="cuda")
ctypes.CDLL(os.environ["CAVS_LIB"]).cavs_emu_fail_launch(ctypes.c_long(1))
for _ in range(2):
    try:
        model.forward([train[0], train[1]])
    except cavs.DeviceError as e:
        print("DeviceError:", e)
""")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=os.environ)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(l.startswith("DeviceError:") and "illegal memory access" in l for l in lines), r.stdout
