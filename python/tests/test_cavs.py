"""test_cavs.py: the package against the cavs command itself: the same training, step for
step, as cavs train; checkpoints each reads of the other; parameters that are the
model's memory; graphs from lists that are the data file's; per-vertex values; errors
that carry libcavs's message."""
import json
import math
import os
import re

import numpy as np
import pytest

import cavs
from cavs import _capi
from conftest import TOP, cavs_cli, model_path


def treefc(data, vocab=None):
    spec = cavs.compile(model_path("treefc.vf"))
    vocab = vocab or cavs.Vocab()
    train = cavs.Dataset.load(data / "train.txt", "ptb-tree", spec, vocab, grow=True, dims={"C": 5})
    dev = cavs.Dataset.load(data / "dev.txt", "ptb-tree", spec, vocab, dims={"C": 5})
    return spec, vocab, train, dev


def test_abi_is_the_headers():
    text = open(os.path.join(TOP, "runtime", "cavs_abi.h")).read()
    assert int(re.search(r"#define CAVS_ABI_VERSION (\d+)", text).group(1)) == _capi.ABI_VERSION
    assert int(re.search(r"CAVS_MAX_DIMS = (\d+)", text).group(1)) == _capi.MAX_DIMS


def test_spec(data):
    spec = cavs.compile(model_path("treelstm.vf"))
    assert spec.name == "treelstm" and spec.precision == "float"
    assert spec.dims == ["E", "H", "C", "V"] and spec.params[:2] == ["emb", "Wi"]
    assert spec.inputs == ["word", "label"] and spec.default_dims()["H"] == 256
    assert cavs.compile(model_path("treefc.vf"), precision="double").dtype == np.float64


def test_training_is_cavs_trains(data, tmp_path):
    """Two epochs with a dev set: every number of cavs train --log's records, the same;
    the checkpoint saved here evaluates in cavs eval as here."""
    spec, vocab, train, dev = treefc(data)
    model = cavs.Model(spec, dims={"H": 8, "C": 5}, vocab=vocab, seed=3)
    seen = []
    hist = cavs.train(model, train, dev, epochs=2, batch=16, lr=0.01, clip=1.0, weight_decay=1e-4, seed=3,
                      warmup=5, callback=seen.append)
    assert seen == hist and len(hist) == 2
    cavs_cli("train", model_path("treefc.vf"), "--format", "ptb-tree", "--train", data / "train.txt", "--dev",
             data / "dev.txt", "--dim", "H=8", "--dim", "C=5", "--epochs", 2, "--batch", 16, "--lr", 0.01, "--clip", 1,
             "--weight-decay", 1e-4, "--seed", 3, "--warmup", 5, "--threads", 1, "--quiet", "--log", tmp_path / "log")
    logged = [json.loads(line) for line in open(tmp_path / "log")]
    for mine, theirs in zip(hist, logged):
        for key in ("epoch", "train_loss", "train_acc", "dev_loss", "dev_acc", "dev_root_acc", "lr", "grad_norm_mean",
                    "grad_norm_max"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-12, abs=1e-15), key
    model.save(tmp_path / "py.ckpt", epoch=np.int64(2), format="ptb-tree")
    saved = (tmp_path / "py.ckpt").read_bytes()
    # a state no reader would take is refused, the checkpoint saved before left whole
    for epoch, fmt, error in [(-1, "", ValueError), (2**32 + 2, "", ValueError), (2.0, "", ValueError),
                              (True, "", ValueError), (2**31 - 1, "", cavs.Error),
                              (2, "a" * 32, ValueError), (2, "sst", cavs.Error), (2, "text-bptt:0", cavs.Error)]:
        with pytest.raises(error):
            model.save(tmp_path / "py.ckpt", epoch=epoch, format=fmt)
        assert (tmp_path / "py.ckpt").read_bytes() == saved, (epoch, fmt)
    # nor over the model's own source (a copy of it: a failure would not touch the tree's)
    vf = tmp_path / "own.vf"
    vf.write_bytes(open(model_path("treefc.vf"), "rb").read())
    own = cavs.Model(cavs.compile(vf), dims={"H": 8, "C": 5}, vocab=vocab)
    with pytest.raises(ValueError, match="would overwrite the model"):
        own.save(vf)
    assert vf.read_bytes() == open(model_path("treefc.vf"), "rb").read()
    _, out, _ = cavs_cli("eval", tmp_path / "py.ckpt", "--data", data / "dev.txt", "--json", "--threads", 1)
    ev, mine = json.loads(out), cavs.evaluate(model, dev)
    assert ev["loss"] == pytest.approx(mine["loss"], rel=1e-12)
    assert ev["accuracy"] == pytest.approx(mine["accuracy"]) and ev["root_accuracy"] == pytest.approx(mine["root_accuracy"])


@pytest.mark.parametrize("state", ["carry", "reset", "vary"])
def test_language_model_is_cavs_trains(tmp_path, state):
    """text-bptt as cavs train reads it: the state carried from chunk to chunk (streams
    side by side), the chunks cut afresh each epoch too (--bptt-vary), or each chunk from
    zeros, shuffled; the same --log numbers each way, and cavs eval's loss of the saved
    model."""
    vary = 2.5 if state == "vary" else 0.0
    state = "carry" if state == "vary" else state
    text = "".join(f"w{i % 7} a w{i % 3} b c\n" for i in range(60))
    (tmp_path / "lm.txt").write_text(text)
    spec = cavs.compile(model_path("lstm_lm.vf"))
    vocab = cavs.Vocab()
    train = cavs.Dataset.load(tmp_path / "lm.txt", "text-bptt:7", spec, vocab, grow=True)
    model = cavs.Model(spec, dims={"E": 6, "H": 6}, vocab=vocab, seed=2)
    hist = cavs.train(model, train, train, epochs=2, batch=4, lr=0.02, seed=2, bptt_state=state, bptt_vary=vary)
    cavs_cli("train", model_path("lstm_lm.vf"), "--format", "text-bptt:7", "--train", tmp_path / "lm.txt", "--dev",
             tmp_path / "lm.txt", "--dim", "E=6", "--dim", "H=6", "--epochs", 2, "--batch", 4, "--lr", 0.02, "--seed",
             2, "--bptt-state", state, "--bptt-vary", vary, "--threads", 1, "--quiet", "--log", tmp_path / "log")
    logged = [json.loads(line) for line in open(tmp_path / "log")]
    for mine, theirs in zip(hist, logged):
        for key in ("train_loss", "dev_loss", "dev_acc", "grad_norm_max"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-12, abs=1e-15), key
    model.save(tmp_path / "lm.ckpt", epoch=2, format="text-bptt:7")
    _, out, _ = cavs_cli("eval", tmp_path / "lm.ckpt", "--data", tmp_path / "lm.txt", "--batch", 3, "--bptt-state",
                         state, "--json", "--threads", 1)
    assert json.loads(out)["loss"] == pytest.approx(cavs.evaluate(model, train, 3, state)["loss"], rel=1e-12)
    # untold, cavs eval and evaluate (of the model, and of the checkpoint loaded) read
    # the chunks as the model was trained, which the checkpoint keeps
    _, untold, _ = cavs_cli("eval", tmp_path / "lm.ckpt", "--data", tmp_path / "lm.txt", "--batch", 3, "--json",
                            "--threads", 1)
    assert json.loads(untold)["loss"] == json.loads(out)["loss"]
    loaded = cavs.load(tmp_path / "lm.ckpt")
    assert loaded.bptt_state == state
    assert cavs.evaluate(loaded, train, 3)["loss"] == pytest.approx(json.loads(out)["loss"], rel=1e-12)
    assert cavs.evaluate(model, train, 3)["loss"] == cavs.evaluate(model, train, 3, state)["loss"]
    if not vary:  # trained on, untold, it goes on as it was trained, as --resume does
        cavs.train(loaded, train, epochs=1, batch=4, lr=0.02, seed=2)
        assert loaded.bptt_state == state
    with pytest.raises(cavs.Error, match="not carry or reset"):
        cavs.evaluate(model, train, 3, "keep")
    if vary:  # another cut than chunks of one length: another run
        assert hist[-1]["train_loss"] != cavs.train(cavs.Model(spec, dims={"E": 6, "H": 6}, vocab=vocab, seed=2), train,
                                                    epochs=2, batch=4, lr=0.02, seed=2)[-1]["train_loss"]
        with pytest.raises(cavs.Error, match="state carried"):
            cavs.train(model, train, epochs=1, bptt_state="reset", bptt_vary=vary)


def test_patience_and_callback_stop(data, tmp_path):
    spec, vocab, train, dev = treefc(data)
    model = cavs.Model(spec, dims={"H": 8, "C": 5}, vocab=vocab)
    assert len(cavs.train(model, train, epochs=5, callback=lambda r: r["epoch"] < 2)) == 2
    model = cavs.Model(spec, dims={"H": 8, "C": 5}, vocab=vocab)
    hist = cavs.train(model, train, dev, epochs=6, lr=1e-9, patience=1, optimizer="sgd")
    cavs_cli("train", model_path("treefc.vf"), "--format", "ptb-tree", "--train", data / "train.txt", "--dev",
             data / "dev.txt", "--dim", "H=8", "--dim", "C=5", "--epochs", 6, "--lr", 1e-9, "--optimizer", "sgd",
             "--patience", 1, "--threads", 1, "--quiet", "--log", tmp_path / "log")
    assert len(hist) == len(open(tmp_path / "log").readlines()) < 6
    assert model.best_epoch == 1 and set(model.best) == set(spec.params)


def test_checkpoint_from_cavs_train(data, tmp_path):
    cavs_cli("train", model_path("treefc.vf"), "--format", "ptb-tree", "--train", data / "train.txt", "--dim", "H=8",
             "--dim", "C=5", "--epochs", 1, "--threads", 1, "--quiet", "--save", tmp_path / "c.ckpt")
    model = cavs.load(tmp_path / "c.ckpt")
    assert model.spec.name == "treefc" and model.dims["H"] == 8 and model.format == "ptb-tree"
    dev = cavs.Dataset.load(data / "dev.txt", "ptb-tree", model.spec, model.vocab, dims=model)
    _, out, _ = cavs_cli("eval", tmp_path / "c.ckpt", "--data", data / "dev.txt", "--json", "--threads", 1)
    assert json.loads(out)["loss"] == pytest.approx(cavs.evaluate(model, dev)["loss"], rel=1e-12)
    _, out, _ = cavs_cli("predict", tmp_path / "c.ckpt", "--data", data / "dev.txt", "--threads", 1)
    assert [int(x) for x in out.split()] == list(model.predict(dev))


def test_double_checkpoint(data, tmp_path):
    # cavs.load compiles the source in the checkpoint's precision (it compiled float,
    # and refused every double checkpoint, its own saves included)
    cavs_cli("train", model_path("treefc.vf"), "--format", "ptb-tree", "--train", data / "train.txt", "--dim", "H=8",
             "--dim", "C=5", "--epochs", 1, "--threads", 1, "--quiet", "--precision", "double", "--save",
             tmp_path / "d.ckpt")
    model = cavs.load(tmp_path / "d.ckpt")
    assert model.spec.precision == "double" and model.param("W").dtype == np.float64
    dev = cavs.Dataset.load(data / "dev.txt", "ptb-tree", model.spec, model.vocab, dims=model)
    _, out, _ = cavs_cli("eval", tmp_path / "d.ckpt", "--data", data / "dev.txt", "--json", "--threads", 1)
    assert json.loads(out)["loss"] == pytest.approx(cavs.evaluate(model, dev)["loss"], rel=1e-12)
    model.save(tmp_path / "again.ckpt")
    assert cavs.load(tmp_path / "again.ckpt").spec.precision == "double"


def test_parameters_are_the_models_memory(data):
    spec, vocab, train, _ = treefc(data)
    model = cavs.Model(spec, dims={"H": 8, "C": 5}, vocab=vocab)
    W = model.param("W")
    assert W.shape == (16, 8) and W.dtype == np.float32 and model.param("b").shape == (8,)
    assert np.shares_memory(W, model.param("W"))
    before = model.forward(list(train)[:8])["loss"]
    W[...] = 0
    assert model.forward(list(train)[:8])["loss"] != before
    model.backward()
    assert np.abs(model.grad("Wc")).sum() > 0
    state = model.state_dict()
    assert not np.shares_memory(state["W"], W) and (state["W"] == 0).all()
    emb = model.param("emb")
    del model
    emb += 1  # the view keeps the model alive
    assert emb.shape == (len(vocab), 8)


def test_graphs_from_lists_are_the_files(data):
    """A tree built from lists runs as the same tree read from text."""
    spec = cavs.compile(model_path("treelstm.vf"))
    vocab = cavs.Vocab()
    parsed = cavs.Dataset.parse("(3 (1 good) (2 (4 not) (0 bad)))\n", "ptb-tree", spec, vocab, grow=True)
    w = {x: vocab.id(x) for x in ("good", "not", "bad")}
    child, types = parsed.graph(0)
    words = parsed.input(spec, "word")[0]
    labels = parsed.input(spec, "label")[0]
    built = cavs.Dataset.from_graphs([cavs.Graph(spec, children=[list(c) for c in child], types=list(types),
                                                 inputs={"word": words, "label": labels})])
    assert sorted(words[words >= 0]) == sorted(w.values())
    model = cavs.Model(spec, dims={"E": 6, "H": 5}, vocab=vocab)
    a, b = model.forward(parsed), model.forward(built)
    assert a == b
    assert np.array_equal(model.outputs(parsed)[0], model.outputs(built)[0], equal_nan=True)
    assert list(parsed.input(spec, "label", roots=True)) == [3]


def test_per_vertex_values(data):
    spec = cavs.compile(model_path("treelstm.vf"))
    vocab = cavs.Vocab()
    dev = cavs.Dataset.load(data / "dev.txt", "ptb-tree", spec, vocab, grow=True)
    model = cavs.Model(spec, dims={"E": 6, "H": 5}, vocab=vocab)
    h = model.outputs(dev, roots=True)
    assert h.shape == (len(dev), 5)
    assert np.allclose(model.values(dev, "h", roots=True), h)
    c = model.values(dev, "c")
    assert len(c) == len(dev) and c[0].shape == (dev.graph(0)[0].shape[0], 5)
    p = model.probs(dev, roots=True)
    assert np.allclose(p.sum(axis=1), 1) and list(p.argmax(axis=1)) == list(model.predict(dev))
    every = model.predict(dev, all_nodes=True)
    assert len(every[0]) == dev.graph(0)[0].shape[0]


def test_errors_carry_the_message(data, tmp_path):
    bad = tmp_path / "bad.vf"
    bad.write_text("model bad;\nparam W[3, 3];\nvertex v (children 0) { x = W @ y; }\n")
    with pytest.raises(cavs.Error, match=r"bad\.vf:\d+:\d+: error"):
        cavs.compile(bad)
    spec, vocab, _, _ = treefc(data)
    (tmp_path / "broken.txt").write_text("(3 (1 a) (2 b)\n")
    with pytest.raises(cavs.Error, match=r"broken\.txt:1: error"):
        cavs.Dataset.load(tmp_path / "broken.txt", "ptb-tree", spec, vocab)
    model = cavs.Model(spec, dims={"H": 8, "C": 5}, vocab=vocab)
    with pytest.raises(cavs.Error, match="no parameter 'Wx'"):
        model.param("Wx")
    with pytest.raises(cavs.Error, match="no dim 'Q'"):
        cavs.Model(spec, dims={"Q": 3}, vocab=vocab)
    with pytest.raises(cavs.Error, match=r"parameter W of model treefc is \[16, 8\]"):
        model.load_state_dict({**model.state_dict(), "W": np.zeros((8, 8))})
    with pytest.raises(cavs.Error, match="unknown optimizer"):
        model.step("lion")
    with pytest.raises(cavs.Error):
        cavs.load(tmp_path / "nothing.ckpt")


def test_weights_out_and_in(data, tmp_path):
    """cavs export's .npz is the model's parameters to the bit; arrays saved by NumPy
    start a cavs train run (--init-all) and come back out the same."""
    spec, vocab, train, _ = treefc(data)
    model = cavs.Model(spec, dims={"H": 8, "C": 5}, vocab=vocab, seed=5)
    cavs.train(model, train, epochs=1)
    model.save(tmp_path / "m.ckpt", format="ptb-tree")
    cavs_cli("export", tmp_path / "m.ckpt", "-o", tmp_path / "m.npz")
    z = np.load(tmp_path / "m.npz")
    assert set(z.files) == set(spec.params) | {"__metadata__.json"}
    meta = json.loads(z["__metadata__.json"])
    assert meta["model"] == "treefc" and json.loads(meta["dims"]) == model.dims
    for name, a in model.state_dict().items():
        assert z[name].dtype == a.dtype and np.array_equal(z[name], a)
    # changed in NumPy (float64, compressed), into a new run, frozen, and out again
    doubled = {n: z[n].astype(np.float64) * 2 for n in spec.params}
    np.savez_compressed(tmp_path / "d.npz", **doubled)
    freeze = [w for n in spec.params for w in ("--freeze", n)]
    cavs_cli("train", model_path("treefc.vf"), "--format", "ptb-tree", "--train", data / "train.txt", "--dim", "H=8",
             "--dim", "C=5", "--epochs", 1, "--quiet", "--init-all", tmp_path / "d.npz", *freeze, "--save",
             tmp_path / "d.ckpt")
    back = cavs.load(tmp_path / "d.ckpt")
    for n in spec.params:
        assert np.array_equal(back.param(n), doubled[n].astype(np.float32))
    other = cavs.Model(spec, dims={"H": 8, "C": 5}, vocab=vocab, seed=9)
    other.load_state_dict(np.load(tmp_path / "m.npz"))
    assert all(np.array_equal(other.param(n), model.param(n)) for n in spec.params)


def test_safetensors(data, tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    from safetensors import safe_open
    spec, vocab, train, _ = treefc(data)
    model = cavs.Model(spec, dims={"H": 8, "C": 5}, vocab=vocab, seed=5)
    model.save(tmp_path / "m.ckpt")
    cavs_cli("export", tmp_path / "m.ckpt", "-o", tmp_path / "m.safetensors")
    loaded = st.load_file(str(tmp_path / "m.safetensors"))
    assert set(loaded) == set(spec.params)
    assert all(np.array_equal(loaded[n], model.param(n)) for n in spec.params)
    with safe_open(str(tmp_path / "m.safetensors"), "np") as f:
        assert f.metadata()["model"] == "treefc" and f.metadata()["precision"] == "float"
    st.save_file({n: a + 1 for n, a in loaded.items()}, str(tmp_path / "p.safetensors"))
    freeze = [w for n in spec.params for w in ("--freeze", n)]
    cavs_cli("train", model_path("treefc.vf"), "--format", "ptb-tree", "--train", data / "train.txt", "--dim", "H=8",
             "--dim", "C=5", "--epochs", 1, "--quiet", "--init-all", tmp_path / "p.safetensors", *freeze, "--save",
             tmp_path / "p.ckpt")
    back = cavs.load(tmp_path / "p.ckpt")
    assert all(np.array_equal(back.param(n), loaded[n] + 1) for n in spec.params)


def test_expert_load(data):
    """A mixture of experts from Python: a forward pass routes every vertex to K = 2
    experts, expert_load() counts them (reset_expert_load() starts again), and the
    load-balancing loss comes back beside the loss (0 with the option at 0)."""
    spec = cavs.compile(model_path("moe_tree.vf"))
    vocab = cavs.Vocab()
    train = cavs.Dataset.load(data / "train.txt", "ptb-tree", spec, vocab, grow=True, dims={"C": 5})
    model = cavs.Model(spec, dims={"E": 8, "H": 8, "F": 4, "X": 4, "C": 5}, vocab=vocab, seed=4)
    assert model.expert_load() == []
    graphs = [train[i] for i in range(8)]
    out = model.forward(graphs)
    load = model.expert_load()
    assert len(load) == 4 and sum(load) == 2 * sum(train.graph(i)[0].shape[0] for i in range(8))
    assert out["aux_loss"] > 0
    model.reset_expert_load()
    assert model.expert_load() == [0, 0, 0, 0]
    model.set_option("balance", 0)
    assert model.forward(graphs)["aux_loss"] == 0
    assert sum(model.expert_load()) == sum(load)


def test_dropout_options(data, tmp_path):
    """A model's options from Python: read, set (as --dropout and --option), kept by a
    checkpoint both ways; training with dropout set here is cavs train --dropout's,
    record for record; a value that is not a probability, or a name the model lacks, is
    an error that says so."""
    spec = cavs.compile(model_path("treelstm.vf"))
    vocab = cavs.Vocab()
    train = cavs.Dataset.load(data / "train.txt", "ptb-tree", spec, vocab, grow=True, dims={"C": 5})
    model = cavs.Model(spec, dims={"E": 8, "H": 8, "C": 5}, vocab=vocab, seed=4)
    assert model.options == {"p_drop": 0.0}
    model.set_dropout(0.3)
    assert model.options == {"p_drop": 0.3}
    hist = cavs.train(model, train, epochs=2, batch=16, seed=4)
    cavs_cli("train", model_path("treelstm.vf"), "--format", "ptb-tree", "--train", data / "train.txt", "--dim", "E=8",
             "--dim", "H=8", "--dim", "C=5", "--epochs", 2, "--batch", 16, "--seed", 4, "--dropout", 0.3, "--threads",
             1, "--quiet", "--log", tmp_path / "log", "--save", tmp_path / "d.ckpt")
    logged = [json.loads(line) for line in open(tmp_path / "log")]
    assert len(logged) == 2
    for mine, theirs in zip(hist, logged):
        assert mine["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-12), mine["epoch"]
    back = cavs.load(tmp_path / "d.ckpt")
    assert back.options == {"p_drop": pytest.approx(0.3)}
    back.set_option("p_drop", 0.25)
    back.save(tmp_path / "e.ckpt", format="ptb-tree")
    _, out, _ = cavs_cli("info", tmp_path / "e.ckpt")
    assert "p_drop=0.25" in out
    assert cavs.load(tmp_path / "e.ckpt").options == {"p_drop": 0.25}
    with pytest.raises(cavs.Error, match="not in \\[0, 1\\)"):
        back.set_option("p_drop", 1.5)
    with pytest.raises(cavs.Error, match="no option 'nope'"):
        back.set_option("nope", 0.1)
    fc = cavs.Model(cavs.compile(model_path("treefc.vf")), dims={"H": 8, "C": 5}, vocab=vocab)
    with pytest.raises(cavs.Error, match="no dropout option"):
        fc.set_dropout(0.5)


def test_model_clip_is_cavs_trains(data, tmp_path):
    """A model's own gradient-norm clip (`option clip = N;`): cavs.train without clip=
    clips at it as cavs train without --clip does, record for record; clip=0 turns it
    off (another run: 0.05 clips this model's gradients)."""
    text = open(model_path("treefc.vf")).read()
    vf = tmp_path / "fclip.vf"
    vf.write_text(re.sub(r"(?m)^(model treefc;)$", r"\1\noption clip = 0.05;", text, count=1))
    assert "option clip = 0.05;" in vf.read_text()
    spec = cavs.compile(str(vf))
    vocab = cavs.Vocab()
    train = cavs.Dataset.load(data / "train.txt", "ptb-tree", spec, vocab, grow=True, dims={"C": 5})
    runs = []
    for clip in (None, 0):
        model = cavs.Model(spec, dims={"H": 8, "C": 5}, vocab=vocab, seed=3)
        assert model.options == {"clip": 0.05}
        runs.append(cavs.train(model, train, epochs=2, batch=16, lr=0.01, seed=3, clip=clip))
    cavs_cli("train", vf, "--format", "ptb-tree", "--train", data / "train.txt", "--dim", "H=8", "--dim", "C=5",
             "--epochs", 2, "--batch", 16, "--lr", 0.01, "--seed", 3, "--threads", 1, "--quiet", "--log",
             tmp_path / "log")
    logged = [json.loads(line) for line in open(tmp_path / "log")]
    assert len(logged) == 2
    for mine, theirs in zip(runs[0], logged):
        assert mine["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-12), mine["epoch"]
    assert runs[1][1]["train_loss"] != pytest.approx(runs[0][1]["train_loss"], rel=1e-6)


@pytest.mark.parametrize("schedule,lr,args,flags", [
    ("step", 0.05, {"lr_decay": 0.5, "lr_decay_start": 2}, ["--lr-decay", 0.5, "--lr-decay-start", 2]),
    ("cosine", 0.05, {"lr_min": 0.001}, ["--lr-min", 0.001]),
    ("plateau", 0.5, {"plateau_patience": 0, "plateau_factor": 0.5, "select": "loss"},
     ["--plateau-patience", 0, "--plateau-factor", 0.5, "--select", "loss"]),
])
def test_schedules_are_cavs_trains(data, tmp_path, schedule, lr, args, flags):
    """The step (its first decay after epoch 2), cosine and plateau schedules: every
    epoch's rate and losses the same as cavs train --schedule's --log records (the
    plateau cuts at least once here: checked)."""
    spec, vocab, train, dev = treefc(data)
    model = cavs.Model(spec, dims={"H": 8, "C": 5}, vocab=vocab, seed=3)
    hist = cavs.train(model, train, dev, epochs=4, batch=32, lr=lr, seed=3, schedule=schedule, **args)
    cavs_cli("train", model_path("treefc.vf"), "--format", "ptb-tree", "--train", data / "train.txt", "--dev",
             data / "dev.txt", "--dim", "H=8", "--dim", "C=5", "--epochs", 4, "--batch", 32, "--lr", lr, "--seed", 3,
             "--threads", 1, "--quiet", "--schedule", schedule, *flags, "--log", tmp_path / "log")
    logged = [json.loads(line) for line in open(tmp_path / "log")]
    assert len(hist) == len(logged) == 4
    for mine, theirs in zip(hist, logged):
        assert mine["schedule"] == theirs["schedule"] == schedule
        for key in ("lr", "train_loss", "dev_loss"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-12), (mine["epoch"], key)
    rates = [r["lr"] for r in hist]
    assert rates[-1] < rates[0], rates  # the rate went down (cosine's floor; a plateau's cut)


def test_schedule_settings_checked(data):
    spec, vocab, train, dev = treefc(data)
    model = cavs.Model(spec, dims={"H": 8, "C": 5}, vocab=vocab, seed=3)
    for kwargs, msg in (({"schedule": "linear"}, "not one of"), ({"schedule": "plateau"}, "needs a dev set"),
                        ({"schedule": "cosine", "plateau_factor": 0.5}, "go with schedule plateau"),
                        ({"schedule": "cosine", "lr_min": 1.0, "lr": 0.1}, "not below the rate")):
        with pytest.raises(cavs.Error, match=msg):
            cavs.train(model, train, epochs=1, **kwargs)


def test_reserve_optimizer(data, tmp_path):
    """The state an optimizer keeps, made before any step, is what a checkpoint then holds:
    none, then Adagrad's one block (cavs info reads it back)."""
    spec, vocab, train, dev = treefc(data)
    model = cavs.Model(spec, dims={"H": 8, "C": 5}, vocab=vocab, seed=3)
    model.reserve_optimizer("sgd")
    model.save(tmp_path / "none.ckpt", format="ptb-tree")
    model.reserve_optimizer("adagrad")
    model.save(tmp_path / "one.ckpt", format="ptb-tree")
    for name, state in (("none", "state none\n"), ("one", "state one block of moments")):
        _, out, _ = cavs_cli("info", tmp_path / f"{name}.ckpt")
        assert "optimizer   0 steps, " + state in out, out
    with pytest.raises(cavs.Error):
        model.reserve_optimizer("rmsprop")


def test_out_of_memory_is_a_memoryerror(data):
    """A minibatch past the memory limit raises OutOfMemoryError (a cavs.Error and a
    MemoryError), and so does the step after it; the model is as it was: its parameters
    unchanged, and the same minibatch goes through once the limit is raised, its loss
    the one a model never refused gives. The limit's bytes are the model's own
    (Model.memory): twice the model and two graphs' vertices (room for their edges),
    far from the whole set's; a minibatch under it runs though its buffers' capacity,
    rounded up to 256 rows, would not fit."""
    spec, vocab, train, _ = treefc(data)
    graphs = [train[i] for i in range(len(train))]
    small, fresh = (cavs.Model(spec, dims={"H": 8, "C": 5}, vocab=vocab, seed=3) for _ in range(2))
    need = small.memory(sum(g.contents.n for g in graphs[:2]))
    assert need["per_row"] > 0 and need["total"] == need["model"] + sum(g.contents.n for g in graphs[:2]) * need["per_row"]
    before = small.state_dict()
    old = cavs.memory_limit()
    limit = 2 * need["total"]
    assert old > limit and small.memory(256)["total"] > limit and small.memory(train.vertices())["total"] > 10 * limit
    try:
        cavs.set_memory_limit(limit)
        assert cavs.memory_limit() == limit
        small.forward(graphs[:2])
        with pytest.raises(cavs.OutOfMemoryError, match="memory") as e:
            small.forward(graphs)
        assert isinstance(e.value, MemoryError) and isinstance(e.value, cavs.Error)
        small.backward()
        with pytest.raises(cavs.OutOfMemoryError):
            small.step("adam", lr=0.1)
    finally:
        cavs.set_memory_limit(None)
    assert cavs.memory_limit() == old
    for n, a in small.state_dict().items():
        assert np.array_equal(a, before[n]), n
    assert small.forward(graphs)["loss"] == fresh.forward(graphs)["loss"]
    with pytest.raises(ValueError):
        cavs.set_memory_limit(-1)
