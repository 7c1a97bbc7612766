"""cavs from Python: compile a .vf model, load data or build graphs, train, evaluate,
predict, and read and write parameters and per-vertex values as NumPy arrays.

    import cavs
    spec = cavs.compile("dsl-examples/treelstm.vf")     # through the cavs compile cache
    vocab = cavs.Vocab()
    train = cavs.Dataset.load("train.txt", "ptb-tree", spec, vocab, grow=True)
    model = cavs.Model(spec, dims={"E": 64, "H": 64}, vocab=vocab, seed=1)
    cavs.train(model, train, epochs=3, lr=0.005)
    h = model.values(train, "h", roots=True)             # [graphs, H]

A thin layer over libcavs (ctypes, no compiled extension; _capi.py): every failure of
the library is raised as cavs.Error with its message; running out of memory as
cavs.OutOfMemoryError (also a MemoryError), a device's own failure as
cavs.DeviceError. Parameters and gradients are NumPy views of the model's own memory
(the cpu backend), valid as long as the model, which each view keeps alive.
python/README is the tutorial."""

import ctypes
import errno
import hashlib
import json
import math
import operator
import os
import re
import stat
import subprocess
import tempfile

import numpy as np

from . import _capi as C

__all__ = ["Error", "OutOfMemoryError", "DeviceError", "set_memory_limit", "memory_limit", "Spec", "Vocab", "Graph",
           "Dataset", "Model", "compile", "load", "train", "evaluate", "version"]


class Error(Exception):
    """A failure libcavs or the cavs command reported, with its message."""


class OutOfMemoryError(Error, MemoryError):
    """libcavs ran out of memory, the host's or the device's, or would have past the
    memory limit (set_memory_limit). The model is as it was before the pass: the next
    forward pass starts afresh, and goes through once the memory is there (a smaller
    minibatch, memory freed, the limit raised)."""


class DeviceError(Error):
    """The device failed (a kernel's fault, a lost GPU): the model can only be freed."""


def _failed(msg, e, device="cpu"):
    """The exception for a failure libcavs just returned: by the errno it set, e (read
    with ctypes.get_errno() before any other call of the library, which clears it); an
    EIO the device's only where a model on a device made it."""
    if e == errno.ENOMEM:
        return OutOfMemoryError(msg)
    if e == errno.EIO and device != "cpu":
        return DeviceError(msg)
    return Error(msg)


def set_memory_limit(nbytes=None):
    """What models may take, together (cavs_set_memory_limit): a model refuses to be
    made, and a minibatch to be run, past it, with OutOfMemoryError. None (or 0): the
    default, 90% of the machine's physical memory. For the whole process, as
    cavs train's --max-memory."""
    if nbytes is not None and (not isinstance(nbytes, int) or nbytes < 0):
        raise ValueError(f"memory limit {nbytes!r}: a number of bytes, or None")
    C.lib().cavs_set_memory_limit(nbytes or 0)


def memory_limit():
    """The memory limit in bytes (set_memory_limit's, or the default)."""
    return C.lib().cavs_memory_limit()


def _s(b):
    return b.decode() if isinstance(b, bytes) else b


def _b(s):
    return s.encode() if isinstance(s, str) else s


def version():
    """libcavs's version, as cavs_version() says it."""
    return _s(C.lib().cavs_version())


# ---- models: compiled by the cavs command into its cache, loaded here ----

_META = re.compile(rb"cavs cache entry 1\nname ([A-Za-z_][A-Za-z0-9_]{0,254})\nsha256 ([0-9a-f]{64})\n")


def _checked(st, path):
    """A cache file or directory is ours and written by nobody else, as cavs requires."""
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Error(f"refusing to load '{path}': not yours, or writable by others")


_loaded_fds = []


def _load_entry(so):
    """The model.so of a cache entry, loaded only after its bytes match the SHA-256 the
    entry recorded (the very descriptor that was hashed is the one loaded), and the name
    of the model it holds."""
    entry = os.path.dirname(so)
    dfd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        _checked(os.fstat(dfd), entry)
        mfd = os.open("meta", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
        with os.fdopen(mfd, "rb") as f:
            _checked(os.fstat(f.fileno()), entry + "/meta")
            m = _META.fullmatch(f.read(4096))
        if not m:
            raise Error(f"'{entry}/meta' is not a cache entry's record")
        ofd = os.open("model.so", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
        try:
            st = os.fstat(ofd)
            _checked(st, so)
            if not stat.S_ISREG(st.st_mode):
                raise Error(f"'{so}' is not a regular file")
            h = hashlib.sha256()
            while True:
                chunk = os.read(ofd, 1 << 20)
                if not chunk:
                    break
                h.update(chunk)
            if h.hexdigest().encode() != m.group(2):
                raise Error(f"'{so}' is not the object its cache entry recorded")
            C.lib()  # libcavs first, globally: the model's calls resolve into it
            handle = ctypes.CDLL(f"/proc/self/fd/{ofd}", mode=ctypes.RTLD_LOCAL)
            # the descriptor stays open while the process lives: the loader knows the
            # object by this name, and a later model loaded through a reused descriptor
            # number would be taken for it
            _loaded_fds.append(ofd)
        except BaseException:
            os.close(ofd)
            raise
    finally:
        os.close(dfd)
    return handle, m.group(1).decode()


class Spec:
    """A compiled model: its descriptor (what cavsc wrote) and what it names. Made by
    cavs.compile."""

    def __init__(self, handle, name, path=None):
        self._handle = handle
        self.desc = ctypes.pointer(C.Desc.from_address(ctypes.addressof(ctypes.c_char.in_dll(handle, name + "_desc"))))
        d = self.desc.contents
        if d.abi != C.ABI_VERSION:
            raise Error(f"model '{name}' was compiled for ABI {d.abi}; this package reads ABI {C.ABI_VERSION}")
        self.name = _s(d.name)
        self.path = path
        self.precision = "double" if d.precision == C.DOUBLE else "float"
        self.dtype = np.float64 if d.precision == C.DOUBLE else np.float32
        self.dims = [_s(d.dims[i].name) for i in range(d.ndims)]
        self.params = [_s(d.params[i].name) for i in range(d.nparams)]
        self.vertex_types = [_s(d.vertex[i].name) for i in range(d.nvertex)]
        self.inputs = [_s(d.inputs[i].name) for i in range(d.ninputs)]
        self.source_text = _s(d.source_text) if d.source_text else None

    def default_dims(self):
        """The model's dims as declared ({"E": 256, "V": 0, ...}: 0 for one the data binds)."""
        dims = (ctypes.c_long * C.MAX_DIMS)()
        C.lib().cavs_dims_default(self.desc, dims)
        return {n: dims[i] for i, n in enumerate(self.dims)}

    def _dims(self, given, bound=None):
        """dims[] from the defaults, the bound vocabulary dims and the given ones (products
        derived after; unknown names and products are errors), or a Model's."""
        if isinstance(given, Model):
            return given.dims_c
        d = self.desc.contents
        dims = (ctypes.c_long * C.MAX_DIMS)()
        C.lib().cavs_dims_default(self.desc, dims)
        for name, value in list((bound or {}).items()) + list((given or {}).items()):
            if name not in self.dims:
                raise Error(f"model '{self.name}' has no dim '{name}' (its dims: {', '.join(self.dims)})")
            j = self.dims.index(name)
            if d.dims[j].kind == C.DIM_PRODUCT:
                raise Error(f"dim {name} is a product of two others; set its factors instead")
            dims[j] = int(value)
        C.lib().cavs_dims_derive(self.desc, dims)
        return dims

    def __repr__(self):
        return f"<cavs.Spec {self.name}: dims {', '.join(self.dims)}; params {', '.join(self.params)}>"


def compile(path, precision="float", target="c"):
    """A .vf model compiled by `cavs build --cached` (cavsc and the C compiler, through
    the compile cache the cavs command keeps: a model compiled before is not compiled
    again) and loaded. target "cuda": its CUDA code through nvcc, for a Model on
    device "cuda"."""
    exe = C.cavs_command()
    if not exe:
        raise Error("cannot find the cavs command (set CAVS to its path, or put it on PATH)")
    if precision not in ("float", "double"):
        raise Error(f"precision '{precision}' is not float or double")
    if target not in ("c", "cuda"):
        raise Error(f"target '{target}' is not c or cuda")
    r = subprocess.run([exe, "build", "--cached", "--precision", precision, "--target", target, os.fspath(path)],
                       capture_output=True, text=True)
    if r.returncode:
        raise Error(r.stderr.strip() or f"cavs build failed (exit {r.returncode})")
    handle, name = _load_entry(r.stdout.strip())
    return Spec(handle, name, os.fspath(path))


# ---- vocabularies and data ----

class Vocab:
    """Token <-> id (0 is <unk>, 1 <eos>): what data files' words are numbered by."""

    def __init__(self, _ptr=None):
        self._ptr = _ptr or C.lib().cavs_vocab_new()
        if not self._ptr:
            raise OutOfMemoryError("out of memory")

    def __del__(self):
        if getattr(self, "_ptr", None):
            C.lib().cavs_vocab_free(self._ptr)

    def __len__(self):
        return C.lib().cavs_vocab_size(self._ptr)

    def id(self, word, add=False):
        """The id of a word (0, <unk>, for an unknown one unless add)."""
        w = _b(word)
        i = C.lib().cavs_vocab_id(self._ptr, w, len(w), int(add))
        if i < 0:
            raise _failed(f"cannot add '{word}' to the vocabulary", ctypes.get_errno())
        return i

    def word(self, i):
        w = C.lib().cavs_vocab_word(self._ptr, int(i))
        if w is None:
            raise IndexError(i)
        return _s(w)

    def words(self):
        return [self.word(i) for i in range(len(self))]


class Graph:
    """A graph made in Python: vertex types (names or indices), each vertex's children
    (vertex numbers in this graph; a missing slot -1) and its inputs by name (an index or
    class input a list of integers, -1 for none; a real input a list of rows). Vertices
    are numbered as the lists are."""

    def __init__(self, spec, children, types=None, inputs=None):
        d = spec.desc.contents
        n = len(children)
        maxc = max([len(c) for c in children] + [1])
        child = np.full((n, maxc), -1, dtype=np.int32)
        for v, cs in enumerate(children):
            child[v, :len(cs)] = cs
        if types is None:
            types = [0] * n
        ty = np.array([spec.vertex_types.index(t) if isinstance(t, str) else int(t) for t in types], dtype=np.int32)
        feat = np.full((n, max(d.nint, 1)), -1, dtype=np.int32)
        reals = []
        if len(ty) != n:
            raise Error(f"{len(ty)} types for {n} vertices")
        for name, values in (inputs or {}).items():
            if name not in spec.inputs:
                raise Error(f"model '{spec.name}' has no input '{name}' (its inputs: {', '.join(spec.inputs)})")
            inp = d.inputs[spec.inputs.index(name)]
            a = np.asarray(values, dtype=np.float32 if inp.kind == C.IN_REAL else np.int32)
            if len(a) != n:
                raise Error(f"input '{name}' has {len(a)} entries for {n} vertices")
            if inp.kind == C.IN_REAL:
                reals.append((inp.slot, a.reshape(n, -1)))
            else:
                feat[:, inp.slot] = a
        # real inputs side by side in slot order (their widths are the model's: checked there)
        real = np.ascontiguousarray(np.concatenate([r for _, r in sorted(reals, key=lambda x: x[0])], axis=1)) \
            if reals else None
        self._arrays = (child, ty, feat, real)
        self.n = n
        self._c = C.Graph(n=n, maxc=maxc, child=child.ctypes.data_as(ctypes.POINTER(ctypes.c_int)),
                          type=ty.ctypes.data_as(ctypes.POINTER(ctypes.c_int)),
                          feat=feat.ctypes.data_as(ctypes.POINTER(ctypes.c_int)),
                          real=real.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if real is not None else None,
                          slots=0)
        self.ptr = ctypes.pointer(self._c)


class Dataset:
    """Graphs: a file in one of cavs-data(5)'s formats (load), text in memory (parse), or
    Graphs made in Python (from_graphs). len() and iteration give the graphs (as the C
    structures libcavs reads)."""

    def __init__(self, ptr=None, graphs=None, fmt=None, owner=None):
        self._ptr = ptr
        self._graphs = graphs
        self.format = fmt
        self._owner = owner
        if ptr:
            n = C.lib().cavs_dataset_count(ptr)
            self._gptrs = [C.lib().cavs_dataset_graph(ptr, i) for i in range(n)]
        else:
            self._gptrs = [g.ptr for g in graphs]

    def __del__(self):
        if getattr(self, "_ptr", None):
            C.lib().cavs_dataset_free(self._ptr)

    def __len__(self):
        return len(self._gptrs)

    def __iter__(self):
        return iter(self._gptrs)

    def __getitem__(self, i):
        return self._gptrs[i]

    def graph(self, i):
        """Graph i as libcavs holds it: (children [n, maxc], types [n], inputs [n, nint]) copies."""
        g = self._gptrs[i].contents
        child = np.ctypeslib.as_array(g.child, (g.n * g.maxc,)).reshape(g.n, g.maxc).copy()
        types = np.ctypeslib.as_array(g.type, (g.n,)).copy() if g.type else np.zeros(g.n, np.int32)
        return child, types

    def input(self, spec, name, roots=False):
        """An index or class input's values (a label, a word id): an array per graph, -1
        where a vertex has none; with roots, each graph's root's (its last vertex that is
        no vertex's child, as libcavs picks it), as one array."""
        d = spec.desc.contents
        inp = d.inputs[spec.inputs.index(name)]
        if inp.kind == C.IN_REAL:
            raise Error(f"input '{name}' is real: not kept as integers")
        out = []
        for p in self._gptrs:
            g = p.contents
            feat = np.ctypeslib.as_array(g.feat, (g.n * d.nint,)).reshape(g.n, d.nint)[:, inp.slot]
            if not roots:
                out.append(feat.copy())
                continue
            child = np.ctypeslib.as_array(g.child, (g.n * g.maxc,))
            is_child = np.zeros(g.n, dtype=bool)
            is_child[child[child >= 0]] = True
            out.append(int(feat[np.nonzero(~is_child)[0][-1]]))
        return np.array(out, dtype=np.int64) if roots else out

    def vertices(self):
        return sum(p.contents.n for p in self._gptrs)

    def max_feature(self, spec, input_name):
        """The largest value of an index or class input over the data, or -1."""
        slot = spec.desc.contents.inputs[spec.inputs.index(input_name)].slot
        if self._ptr:
            return C.lib().cavs_dataset_max_feature(self._ptr, slot)
        return max([int(g._arrays[2][:, slot].max(initial=-1)) for g in self._graphs] + [-1])

    @staticmethod
    def load(path, format, spec, vocab=None, grow=False, dims=None):
        """A data file: format "ptb-tree", "text", "text-bptt" (or "text-bptt:N", chunks
        of N tokens) or "cgf"; new words added
        to vocab when grow (training data), else <unk>; dims bound the labels: the
        model's defaults with those a dict changes, or a Model's own."""
        err = ctypes.create_string_buffer(1024)
        v = vocab or Vocab()
        p = C.lib().cavs_dataset_load(_b(os.fspath(path)), _b(format), spec.desc, spec._dims(dims), v._ptr, int(grow),
                                      err, len(err))
        if not p:
            raise _failed(_s(err.value), ctypes.get_errno())
        return Dataset(p, fmt=format, owner=v)

    @staticmethod
    def parse(text, format, spec, vocab=None, grow=False, dims=None, name="<string>"):
        """The same from text in memory."""
        err = ctypes.create_string_buffer(1024)
        v = vocab or Vocab()
        t = _b(text)
        p = C.lib().cavs_dataset_parse(t, len(t), _b(name), _b(format), spec.desc, spec._dims(dims), v._ptr, int(grow),
                                       err, len(err))
        if not p:
            raise _failed(_s(err.value), ctypes.get_errno())
        return Dataset(p, fmt=format, owner=v)

    @staticmethod
    def from_graphs(graphs):
        return Dataset(graphs=list(graphs))


# ---- the model ----

def _view(owner, addr, rows, cols, ld, dtype):
    """rows x cols of the model's memory at addr (rows ld apart) as an array that keeps
    owner alive."""
    ctype = ctypes.c_double if dtype == np.float64 else ctypes.c_float
    buf = (ctype * (rows * ld)).from_address(addr)
    buf._owner = owner
    return np.ctypeslib.as_array(buf).reshape(rows, ld)[:, :cols]


class Model:
    """A model with its parameters, made from a Spec: dims by name (the vocabulary dims
    from vocab, or for data whose inputs are numbers already, from `data`), parameters
    from `seed` (as cavs train's --seed), `threads` for its products, on `device` "cpu"
    or "cuda" (a Spec compiled with target="cuda"; its parameters are then copies, not
    views: see param)."""

    def __init__(self, spec, dims=None, vocab=None, data=(), seed=1, threads=1, init=True, device="cpu"):
        self.spec = spec
        self.vocab = vocab
        # how text-bptt training read the chunks ("carry", "reset"; None: not said), as
        # train sets it, save keeps it and load reads it back: evaluate's default
        self.bptt_state = None
        d = spec.desc.contents
        bound = {}
        for j in range(d.ndims):
            if d.dims[j].kind != C.DIM_VOCAB or (dims and spec.dims[j] in dims):
                continue
            inp = spec.inputs[d.dims[j].input]
            if vocab is not None and not any(ds._ptr is None or ds.format == "cgf" for ds in data):
                bound[spec.dims[j]] = len(vocab)
            elif data:
                bound[spec.dims[j]] = max(1, max(ds.max_feature(spec, inp) for ds in data) + 1)
        self.dims_c = spec._dims(dims, bound)
        missing = [n for i, n in enumerate(spec.dims) if self.dims_c[i] <= 0]
        if missing:
            raise Error(f"dims {', '.join(missing)} are bound by the data: give vocab=, data= or dims=")
        err = ctypes.create_string_buffer(1024)
        if device not in ("cpu", "cuda"):
            raise Error(f"device '{device}' is not cpu or cuda")
        opts = C.ModelOpts(backend=_b(device), threads=int(threads))
        self._ptr = C.lib().cavs_model_new_opts(spec.desc, self.dims_c, ctypes.byref(opts), err, len(err))
        if not self._ptr:
            raise _failed(_s(err.value), ctypes.get_errno(), device)
        self.threads = threads
        self._optim = None
        if init:
            self.init(seed)

    def __del__(self):
        if getattr(self, "_ptr", None):
            C.lib().cavs_model_free(self._ptr)
            self._ptr = None

    def _check(self, rc):
        if rc:
            e = ctypes.get_errno()  # (before cavs_model_error, which clears it)
            raise _failed(_s(C.lib().cavs_model_error(self._ptr)), e, self.device)

    @property
    def dims(self):
        return {n: C.lib().cavs_model_dim(self._ptr, i) for i, n in enumerate(self.spec.dims)}

    def init(self, seed=1):
        """Parameters from a seed, as the model's init clauses say."""
        C.lib().cavs_model_init(self._ptr, ctypes.c_uint64(seed))

    @property
    def options(self):
        """The model's options (`option NAME = P;` in its .vf: a dropout's probability,
        or `clip`, its default gradient-norm clip for training) by name, their values
        now: the .vf's defaults, what set_option set, or what the checkpoint load()
        read kept."""
        d = self.spec.desc.contents
        return {_s(d.options[k].name): C.lib().cavs_model_option(self._ptr, k) for k in range(d.noptions)}

    def set_option(self, name, value):
        """Sets option `name` to `value`, a probability from 0 to below 1, or for `clip`
        a norm, 0 or more (cavs train's --option NAME=V); save() keeps it."""
        self._check(C.lib().cavs_model_set_option(self._ptr, _b(name), float(value)))

    def set_dropout(self, p):
        """Every dropout option to p (cavs train's --dropout P); an error for a model
        without one, whose dropouts, if any, have a fixed probability."""
        d = self.spec.desc.contents
        names = [_s(d.options[k].name) for k in range(d.noptions) if d.options[k].kind == C.OPTION_DROPOUT]
        if not names:
            raise Error(f"model '{self.spec.name}' has no dropout option")
        for n in names:
            self.set_option(n, p)

    # parameters and gradients: the model's memory

    @property
    def device(self):
        """"cpu" or "cuda": where the model's memory is."""
        return _s(C.lib().cavs_model_backend(self._ptr))

    def _array(self, getter, i):
        rows, cols, ld = ctypes.c_long(), ctypes.c_long(), ctypes.c_long()
        addr = getter(self._ptr, i, ctypes.byref(rows), ctypes.byref(cols), ctypes.byref(ld))
        if self.device == "cpu":
            a = _view(self, addr, rows.value, cols.value, ld.value, self.spec.dtype)
        else:  # device memory: a copy, its rows ld apart as they are there
            host = np.empty((rows.value, ld.value), dtype=self.spec.dtype)
            self._check(C.lib().cavs_model_read(self._ptr, host.ctypes.data, addr, host.nbytes))
            a = host[:, :cols.value]
        return a[0] if self.spec.desc.contents.params[i].rank == 1 else a

    def param(self, name):
        """Parameter `name` as an array over the model's own memory (no copy): writing it
        changes the model. A vector [H] is shape (H,), a matrix (R, C). On the cuda
        backend a copy: set_param writes one back."""
        return self._array(C.lib().cavs_model_param, self._index(name))

    def set_param(self, name, value):
        """Parameter `name` set from an array of its shape (on any device)."""
        i = self._index(name)
        rows, cols, ld = ctypes.c_long(), ctypes.c_long(), ctypes.c_long()
        addr = C.lib().cavs_model_param(self._ptr, i, ctypes.byref(rows), ctypes.byref(cols), ctypes.byref(ld))
        a = np.asarray(value, dtype=self.spec.dtype).reshape(rows.value, cols.value)
        host = np.empty((rows.value, ld.value), dtype=self.spec.dtype)  # (what lies past cols kept)
        self._check(C.lib().cavs_model_read(self._ptr, host.ctypes.data, addr, host.nbytes))
        host[:, :cols.value] = a
        self._check(C.lib().cavs_model_write(self._ptr, addr, host.ctypes.data, host.nbytes))

    def grad(self, name):
        """Its gradient after backward(), the same way."""
        return self._array(C.lib().cavs_model_grad, self._index(name))

    @property
    def params(self):
        return {n: self.param(n) for n in self.spec.params}

    def _index(self, name):
        try:
            return self.spec.params.index(name)
        except ValueError:
            raise Error(f"model '{self.spec.name}' has no parameter '{name}' "
                        f"(its parameters: {', '.join(self.spec.params)})") from None

    def state_dict(self):
        """Copies of every parameter, by name (what numpy.savez or safetensors write)."""
        return {n: a.copy() for n, a in self.params.items()}

    def load_state_dict(self, arrays):
        """Every parameter from arrays by name, names and shapes exactly the model's (as
        cavs train --init-all requires); nothing is written unless all fit."""
        names = set(arrays.keys()) if hasattr(arrays, "keys") else set(arrays.files)
        extra = sorted(names - set(self.spec.params) - {"__metadata__.json"})
        if extra:
            raise Error(f"'{extra[0]}' is no parameter of model {self.spec.name}")
        vals = {}
        for n, dst in self.params.items():
            if n not in names:
                raise Error(f"no array '{n}' (parameter {n} {list(dst.shape)} of model {self.spec.name})")
            a = np.asarray(arrays[n])
            if a.shape != dst.shape:
                raise Error(f"array '{n}' is {list(a.shape)}; parameter {n} of model {self.spec.name} is "
                            f"{list(dst.shape)}")
            if not np.all(np.isfinite(a)):
                raise Error(f"array '{n}' holds a NaN or an infinity")
            vals[n] = a
        for n in self.spec.params:
            self.set_param(n, vals[n])

    def freeze(self, name, frozen=True):
        """Parameter `name` left as it is by every step (or updated again)."""
        self._check(C.lib().cavs_model_freeze(self._ptr, self._index(name), int(frozen)))

    def load_vectors(self, name, path, vocab=None):
        """Pre-trained vectors (GloVe, word2vec text; gzip or not) into lookup table
        `name`, rows by the vocabulary's ids: how many rows were written."""
        found, err = ctypes.c_long(), ctypes.create_string_buffer(1024)
        v = vocab or self.vocab
        if C.lib().cavs_model_load_vectors(self._ptr, self._index(name), _b(os.fspath(path)), v._ptr,
                                           ctypes.byref(found), err, len(err)):
            raise Error(_s(err.value))
        return found.value

    # passes

    def _batch(self, graphs):
        ptrs = [g.ptr if isinstance(g, Graph) else g for g in graphs]
        return (ctypes.POINTER(C.Graph) * len(ptrs))(*ptrs), len(ptrs)

    def forward(self, graphs, inference=False):
        """One forward pass over a minibatch (Graphs, or a Dataset's entries): a dict of
        the loss (the mean over labeled rows, summed over the losses), count and correct
        (labeled vertices and those predicted right), root_count and root_correct."""
        arr, k = self._batch(graphs)
        C.lib().cavs_model_set_inference(self._ptr, int(inference))
        st = C.Stats()
        rc = C.lib().cavs_model_forward(self._ptr, arr, k, ctypes.byref(st))
        self._check(rc)
        self._last = arr
        return {"loss": st.loss, "count": st.count, "correct": st.correct, "root_count": st.root_count,
                "root_correct": st.root_correct, "aux_loss": st.aux_loss}

    def losses(self):
        """After a forward pass: each loss of the model, (sum, count, correct)."""
        n = ctypes.c_int()
        p = C.lib().cavs_model_losses(self._ptr, ctypes.byref(n))
        return [(p[i].sum, p[i].count, p[i].correct) for i in range(n.value)]

    def backward(self):
        C.lib().cavs_model_backward(self._ptr)

    def step(self, optimizer="adam", lr=None, clip=0.0, weight_decay=0.0, momentum=0.0):
        """One optimizer update ("sgd", "adagrad", "adam", "momentum", "nesterov" or
        "adamw"; lr by default the optimizer's, as cavs train's; momentum 0: 0.9)."""
        kind = _optim_kind(optimizer)
        o = C.Optim(kind=kind, lr=lr if lr is not None else C.lib().cavs_optim_default_lr(kind), clip=clip,
                    weight_decay=weight_decay, momentum=momentum)
        self._check(C.lib().cavs_model_step(self._ptr, ctypes.byref(o)))

    def reserve_optimizer(self, optimizer="adam"):
        """The state that optimizer keeps made now, against the memory limit, as its first
        step would (SGD none, Adagrad, momentum and Nesterov one block as large as the
        parameters, Adam and AdamW two): an Error now rather than at the first step."""
        self._check(C.lib().cavs_model_reserve_optimizer(self._ptr, _optim_kind(optimizer)))

    def memory(self, rows=0):
        """What the model takes, in bytes (cavs_model_memory): "model", its parameters,
        gradients and the optimizer state it holds; "per_row", what each vertex of a
        minibatch adds; "total", the model with a minibatch of `rows` vertices: what a
        pass of that many is held to, against memory_limit()."""
        if int(rows) < 0:
            raise ValueError(f"rows {rows!r}: a number of vertices")
        mb, rb = ctypes.c_size_t(), ctypes.c_size_t()
        if C.lib().cavs_model_memory(self._ptr, 1, ctypes.byref(mb), ctypes.byref(rb)):
            raise OverflowError("a minibatch's row: its size overflows")
        return {"model": mb.value, "per_row": rb.value, "total": mb.value + int(rows) * rb.value}

    def track_grad_norm(self, on=True):
        """Have every step keep the gradients' global norm: grad_norm() reads it."""
        C.lib().cavs_model_track_grad_norm(self._ptr, 1 if on else 0)

    def grad_norm(self):
        """The last step's global gradient norm (before the clip), or None when it kept
        none (see track_grad_norm)."""
        n = C.lib().cavs_model_grad_norm(self._ptr)
        return n if n >= 0 else None

    def expert_load(self, route=0):
        """A mixture of experts' load (cavs_model_expert_load): how many slots each expert
        of the model's route-th moe block received in the forward passes since
        reset_expert_load(), a list; [] before it has run."""
        n = C.lib().cavs_model_expert_load(self._ptr, route, None, 0)
        self._check(-1 if n < 0 else 0)
        counts = (ctypes.c_long * max(n, 1))()
        C.lib().cavs_model_expert_load(self._ptr, route, counts, n)
        return list(counts[:n])

    def reset_expert_load(self):
        C.lib().cavs_model_expert_load_reset(self._ptr)

    def carry_state(self, on=True):
        """Stateful truncated BPTT (cavs_model_carry_state): each forward pass's graph g
        starts, where its first vertex has no children, from the state the last pass's
        graph g ended in, with no gradient into that pass. False forgets it."""
        self._check(C.lib().cavs_model_carry_state(self._ptr, 1 if on else 0))

    def reset_state(self):
        """The carried state forgotten: the next pass starts from zeros."""
        C.lib().cavs_model_reset_state(self._ptr)

    # what a pass computed, per vertex

    def _batches(self, data, batch):
        gs = list(data._gptrs if isinstance(data, Dataset) else data)
        for b in range(0, len(gs), batch):
            yield b, gs[b:b + batch]

    def _per_vertex(self, data, batch, get, roots, width_of, inference=True):
        out = []
        for b, gs in self._batches(data, batch):
            self.forward(gs, inference=inference)
            for g, gp in enumerate(gs):
                n = gp.contents.n
                verts = [self._root(g, n, get)] if roots else range(n)
                w = width_of(g, verts)
                a = np.full((len(verts), max(w, 0)), np.nan)
                for row, v in enumerate(verts):
                    if v >= 0 and get(self._ptr, g, v, a[row].ctypes.data_as(ctypes.POINTER(ctypes.c_double)), w) < 0:
                        a[row] = np.nan
                out.append(a[0] if roots else a)
        return np.array(out) if roots else out

    def _root(self, g, n, get):
        """The graph's last vertex that has the value (cavs predict's choice)."""
        v = n - 1
        while v > 0 and get(self._ptr, g, v, None, 0) < 0:
            v -= 1
        return v

    def _values_of(self, getter, data, batch, roots, inference=True):
        def width_of(g, verts):
            ws = [getter(self._ptr, g, v, None, 0) for v in verts]
            w = max(ws + [-1])
            if w < 0:
                self._check(-1)
            return w
        return self._per_vertex(data, batch, getter, roots, width_of, inference)

    def values(self, data, name, roots=False, batch=64):
        """The value the .vf names `name` at every vertex (a list of [n, width] arrays, one
        a graph; NaN rows where a vertex has none), or with roots each graph's root's (an
        array [graphs, width])."""
        lib = C.lib()
        nm = _b(name)

        def get(m, g, v, out, n):
            return lib.cavs_model_vertex_value(m, g, v, nm, out, n)
        return self._values_of(get, data, batch, roots, inference=False)

    def outputs(self, data, roots=False, batch=64):
        """What each vertex pushed (a Tree-LSTM's h), as values() gives them."""
        return self._values_of(C.lib().cavs_model_vertex_output, data, batch, roots)

    def probs(self, data, roots=False, batch=64):
        """The class probabilities at each vertex (or root)."""
        return self._values_of(C.lib().cavs_model_vertex_probs, data, batch, roots)

    def predict(self, data, all_nodes=False, batch=64):
        """Each graph's root class (an array), or with all_nodes every vertex's (a list of
        arrays; -1 where a vertex has no prediction)."""
        out = []
        for b, gs in self._batches(data, batch):
            self.forward(gs, inference=True)
            for g, gp in enumerate(gs):
                if all_nodes:
                    out.append(np.array([C.lib().cavs_model_vertex_class(self._ptr, g, v)
                                         for v in range(gp.contents.n)], dtype=np.int64))
                else:
                    out.append(C.lib().cavs_model_root_class(self._ptr, g))
        return out if all_nodes else np.array(out, dtype=np.int64)

    def save(self, path, epoch=0, format=""):
        """A checkpoint, as cavs train writes them (cavs eval, predict, info and export
        read it): the model's source, dims, vocabulary and parameters. epoch (the epochs
        done) and format (the training data's format, as --format names it) are checked
        before anything is written (ValueError; libcavs refuses the rest, as Error), so
        that a checkpoint saved over an earlier one always reads back."""
        fmt = _b(format or "")
        # (never over the model's own .vf, which cavs train --save refuses too)
        src = self.spec.path
        if src and os.path.exists(path) and os.path.exists(src) and os.path.samefile(path, src):
            raise ValueError(f"{os.fspath(path)}: would overwrite the model {os.fspath(src)}")
        try:  # (any integer, NumPy's too; not a bool, nor a float that ctypes would take)
            n = None if isinstance(epoch, bool) else operator.index(epoch)
        except TypeError:
            n = None
        if n is None or not 0 <= n < 2**31:
            raise ValueError(f"epoch {epoch!r}: an epoch count is an integer from 0 to 2**31 - 1")
        epoch = n
        if len(fmt) >= C.TrainState.format.size:
            raise ValueError(f"format {format!r}: a data format's name is shorter than "
                             f"{C.TrainState.format.size} bytes")
        err = ctypes.create_string_buffer(1024)
        ts = C.TrainState(epoch=epoch, best=-1.0, format=fmt,
                          bptt_state={"carry": C.BPTT_CARRY, "reset": C.BPTT_RESET}.get(self.bptt_state, 0))
        v = self.vocab._ptr if self.vocab else None
        if C.lib().cavs_ckpt_save(_b(os.fspath(path)), self._ptr, None, v, ctypes.byref(ts), err, len(err)):
            # (EIO: the device's, or the disk's: an Error)
            raise _failed(_s(err.value), ctypes.get_errno())


def load(path, threads=1):
    """A checkpoint's model: its embedded source compiled (the model it names, or an
    error), its dims, parameters and optimizer state, its vocabulary (model.vocab)."""
    lib = C.lib()
    err = ctypes.create_string_buffer(1024)
    k = lib.cavs_ckpt_read(_b(os.fspath(path)), err, len(err))
    if not k:
        raise _failed(_s(err.value), ctypes.get_errno())
    try:
        src, name = lib.cavs_ckpt_source(k), _s(lib.cavs_ckpt_model(k))
        if not src:
            raise Error(f"{path}: the checkpoint was trained from a built model library")
        with tempfile.TemporaryDirectory() as tmp:
            vf = os.path.join(tmp, name + ".vf")
            with open(vf, "wb") as f:
                f.write(src)
            # (in the checkpoint's precision: compile's default, float, refused a
            # double one, even one this package saved)
            spec = compile(vf, precision="double" if lib.cavs_ckpt_precision(k) == C.DOUBLE else "float")
        if spec.name != name:
            raise Error(f"{path}: the checkpoint's source defines model '{spec.name}', not '{name}'")
        dims = (ctypes.c_long * C.MAX_DIMS)()
        if lib.cavs_ckpt_dims(k, spec.desc, dims, err, len(err)):
            raise Error(f"{path}: {_s(err.value)}")
        v = lib.cavs_ckpt_vocab(k)
        if not v:
            e = ctypes.get_errno()
            raise _failed(f"{path}: " + ("out of memory" if e == errno.ENOMEM else "damaged vocabulary"), e)
        vocab = Vocab(v)
        model = Model(spec, dims={n: dims[i] for i, n in enumerate(spec.dims)
                                  if spec.desc.contents.dims[i].kind != C.DIM_PRODUCT},
                      vocab=vocab, threads=threads, init=False)
        if lib.cavs_ckpt_apply(k, model._ptr, err, len(err)):
            raise _failed(f"{path}: {_s(err.value)}", ctypes.get_errno(), model.device)
        model.carry_state(False)  # (a state carried when it was saved: not until asked)
        model.format = _s(lib.cavs_ckpt_state(k).contents.format)
        model.bptt_state = {C.BPTT_CARRY: "carry", C.BPTT_RESET: "reset"}.get(lib.cavs_ckpt_state(k).contents.bptt_state)
        return model
    finally:
        lib.cavs_ckpt_free(k)


# ---- training, as cavs train runs it ----

def _splitmix(state):
    """cavs train's shuffling generator (train.c rng_next): the next state and number."""
    state = (state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return state, z ^ (z >> 31)


def _carries(model, data, bptt_state):
    """cavs train's carries(): text-bptt's chunks carry the state unless bptt_state is
    "reset" (the model then carrying: True), "carry" on another format or on a model
    that cannot (several states) an error; by default such a model does not carry."""
    if bptt_state not in (None, "carry", "reset"):
        raise Error(f"bptt_state '{bptt_state}': not carry or reset")
    fmt = getattr(data, "format", None) or ""
    bptt = fmt == "text-bptt" or fmt.startswith("text-bptt:")
    if bptt_state == "carry" and not bptt:
        raise Error(f"bptt_state carry: the graphs of format {fmt or '(in memory)'} do not continue one another "
                    "(text-bptt's chunks do)")
    if bptt and bptt_state != "reset":
        try:
            model.carry_state(True)
            model.reset_state()
            return True
        except Error:
            if bptt_state == "carry":
                raise
    model.carry_state(False)  # (what a loaded checkpoint carried, not used)
    return False


def stream_order(n, batch):
    """driver/util.c stream_order: n chunks of one stream as `batch` streams side by
    side; minibatch j (order[j * batch:...]) is the j-th chunk of every stream."""
    per, extra = divmod(n, batch)
    order, start = [0] * n, 0
    for s in range(min(batch, n)):
        length = per + (s < extra)
        for j in range(length):
            order[j * batch + s] = start + j
        start += length
    return order


def _unit_open(rng):
    rng, z = _splitmix(rng)
    return rng, ((z >> 11) + 0.5) * 2.0 ** -53


def bptt_draw(rng, n, sd):
    """driver/bptt.c bptt_draw: a chunk length around n as AWD-LSTM draws it (n, or n / 2
    one time in 20, plus a normal deviate of sd, truncated, at least min(5, n), at most
    100000) from cavs train's generator: the next state and the length."""
    rng, u = _unit_open(rng)
    base = n if u < 0.95 else n / 2.0
    rng, u1 = _unit_open(rng)
    rng, u2 = _unit_open(rng)
    x = base + sd * math.sqrt(-2 * math.log(u1)) * math.cos(6.283185307179586 * u2)
    lo = min(n, 5)
    return rng, (lo if not x >= lo else 100000 if x >= 100000 else int(x))


def _bptt_cut(gs, nint, batch, sd, rng):
    """driver/bptt.c bptt_cut: text-bptt's chunks (chains back to back) as `batch` streams of
    as many tokens, cut into minibatches of one drawn length each. Returns the next
    generator state, the chunks (Graph structures pointing into the data's arrays, and
    what keeps them alive), each minibatch's length and N, the data's chunk length."""
    heads = [g.contents for g in gs]
    total, base, at = sum(h.n for h in heads), max([h.n for h in heads] + [0]), 0
    if not heads:
        return rng, [], [], 0
    t0, f0 = ctypes.addressof(heads[0].type.contents), ctypes.addressof(heads[0].feat.contents)
    for i, h in enumerate(heads):
        if (h.real or ctypes.addressof(h.type.contents) != t0 + 4 * at
                or ctypes.addressof(h.feat.contents) != f0 + 4 * at * nint
                or any(h.child[k * h.maxc + c] != (k - 1 if c == 0 else -1) for k in range(h.n) for c in range(h.maxc))):
            raise Error(f"bptt_vary: graph {i} of the data is not a chain that goes on from the one before "
                        "(text-bptt's are)")
        at += h.n
    per, extra = divmod(total, batch)
    cuts, lens, off, maxc = [], [], 0, heads[0].maxc
    while off < per + (extra > 0):
        rng, length = bptt_draw(rng, base, sd)
        lens.append(length)
        for s in range(batch):
            start, have = s * per + min(s, extra), per + (s < extra) - off
            if have > 0:
                cuts.append((start + off, min(have, length)))
        off += length
    longest = max(lens)
    chain = np.full((longest, maxc), -1, dtype=np.int32)
    chain[:, 0] = np.arange(-1, longest - 1, dtype=np.int32)
    ip = ctypes.POINTER(ctypes.c_int)
    graphs = [C.Graph(n=n, maxc=maxc, child=chain.ctypes.data_as(ip), type=ctypes.cast(t0 + 4 * v, ip),
                      feat=ctypes.cast(f0 + 4 * v * nint, ip), real=None, slots=heads[0].slots) for v, n in cuts]
    return rng, (graphs, chain, gs), lens, base


def evaluate(model, data, batch=64, bptt_state=None):
    """One pass over data in inference: loss (each loss's mean over its rows, summed),
    accuracy over labeled vertices and at the roots, as cavs eval counts them. text-bptt
    data is read as `batch` streams whose state is carried (bptt_state "reset": each
    chunk from zeros), as cavs eval reads it; by default as the model was trained
    (model.bptt_state "reset": from zeros)."""
    sums, counts = {}, {}
    tot = {"count": 0, "correct": 0, "root_count": 0, "root_correct": 0, "graphs": 0}
    if bptt_state is None and getattr(model, "bptt_state", None) == "reset":
        bptt_state = "reset"
    carry = _carries(model, data, bptt_state)
    batches = model._batches(data, batch)
    if carry:
        gp = list(data._gptrs)
        order = stream_order(len(gp), batch)
        batches = ((b, [gp[i] for i in order[b:b + batch]]) for b in range(0, len(gp), batch))
    for b, gs in batches:
        st = model.forward(gs, inference=True)
        for key in ("count", "correct", "root_count", "root_correct"):
            tot[key] += st[key]
        tot["graphs"] += len(gs)
        for i, (s, c, _) in enumerate(model.losses()):
            sums[i], counts[i] = sums.get(i, 0.0) + s, counts.get(i, 0) + c
    C.lib().cavs_model_set_inference(model._ptr, 0)
    if carry:
        model.reset_state()
    loss = sum(sums[i] / counts[i] for i in sums if counts[i])
    return {"loss": loss, "accuracy": tot["correct"] / tot["count"] if tot["count"] else 0.0,
            "root_accuracy": tot["root_correct"] / tot["root_count"] if tot["root_count"] else 0.0, **tot}


def _optim_kind(name):
    kind = C.lib().cavs_optim_kind(_b(name))
    if kind < 0:
        raise Error(f"unknown optimizer '{name}' (sgd, adagrad, adam, momentum, nesterov, adamw)")
    return kind


_SCHEDULES = ("constant", "step", "cosine", "plateau")


def _schedule(schedule, lr_decay, lr_step, lr_min, cosine_epochs, plateau_factor, plateau_patience, base_lr, epochs,
              dev, lr_decay_start=None):
    """cavs train's choose_schedule: the schedule's name and its settings, each held to
    the schedule it belongs to."""
    s = schedule or ("step" if lr_decay else "constant")
    if s not in _SCHEDULES:
        raise Error(f"schedule '{s}': not one of {', '.join(_SCHEDULES)}")
    if lr_decay and s != "step":
        raise Error(f"lr_decay goes with schedule step, not {s}")
    if s == "step" and not (lr_decay and 0 < lr_decay < 1):
        raise Error("schedule step needs an lr_decay between 0 and 1")
    if lr_decay_start is not None and s != "step":
        raise Error(f"lr_decay_start goes with schedule step, not {s}")
    if cosine_epochs is not None and s != "cosine":
        raise Error(f"cosine_epochs goes with schedule cosine, not {s}")
    if (plateau_factor is not None or plateau_patience is not None) and s != "plateau":
        raise Error(f"plateau_factor and plateau_patience go with schedule plateau, not {s}")
    if lr_min and s not in ("cosine", "plateau"):
        raise Error(f"lr_min goes with schedule cosine or plateau, not {s}")
    if lr_min and lr_min >= base_lr:
        raise Error(f"lr_min {lr_min} is not below the rate, {base_lr}")
    if s == "plateau" and dev is None:
        raise Error("schedule plateau needs a dev set to watch")
    return {"name": s, "decay": lr_decay or 0.0, "step": max(lr_step, 1), "start": lr_decay_start or max(lr_step, 1),
            "min": lr_min or 0.0,
            "T": max(cosine_epochs or epochs, 1), "factor": plateau_factor or 0.1,
            "patience": 10 if plateau_patience is None else plateau_patience, "now": 0.0, "best": -1.0, "bad": 0}


def _epoch_lr(sch, base_lr, epoch):
    """driver/schedule.c sched_lr: the rate of an epoch (before the warm-up's ramp)."""
    if sch["name"] == "step":  # the first decay after epoch "start", then every "step" epochs
        n = (epoch - 1 - sch["start"]) // sch["step"] + 1 if epoch > sch["start"] else 0
        return base_lr * sch["decay"] ** n
    if sch["name"] == "cosine":  # PyTorch's CosineAnnealingLR stepped once an epoch, held at the floor past T
        e = min(epoch - 1, sch["T"])
        return sch["min"] + (base_lr - sch["min"]) * (1 + math.cos(math.pi * e / sch["T"])) / 2
    if sch["name"] == "plateau":
        return sch["now"] if sch["now"] > 0 else base_lr
    return base_lr


def _plateau(sch, base_lr, metric, higher):
    """driver/schedule.c sched_plateau: ReduceLROnPlateau with threshold 0, no cool-down."""
    if sch["best"] < 0 or (metric > sch["best"] if higher else metric < sch["best"]):
        sch["best"], sch["bad"] = metric, 0
        return
    sch["bad"] += 1
    if sch["bad"] <= sch["patience"]:
        return
    sch["bad"] = 0
    lr = _epoch_lr(sch, base_lr, 0)
    cut = max(lr * sch["factor"], sch["min"])
    if cut < lr:
        sch["now"] = cut


def train(model, data, dev=None, epochs=10, batch=64, optimizer="adam", lr=None, clip=None, weight_decay=0.0,
          seed=1, lr_decay=None, lr_step=1, warmup=0, patience=0, select=None, callback=None, momentum=0.0,
          schedule=None, lr_min=0.0, cosine_epochs=None, plateau_factor=None, plateau_patience=None,
          bptt_state=None, lr_decay_start=None, bptt_vary=0.0):
    """Trains as `cavs train` does, minibatch for minibatch (the same shuffling from
    seed, the same schedule of the rate: `schedule` "constant", "step" (lr times
    lr_decay every lr_step epochs, the first time after epoch lr_decay_start, by default
    lr_step; the default when lr_decay is given), "cosine" (to
    lr_min over cosine_epochs, by default the run's epochs) or "plateau" (cut by
    plateau_factor, 0.1, after plateau_patience, 10, epochs without a better dev
    metric, not below lr_min), ramped over the first warmup minibatches; with dev, the
    best epoch by select ("all", "root" or "loss"; accuracy for a classifier, else
    loss), and a stop after `patience` epochs without a better one). clip, the
    gradient-norm clip, is by default the model's `clip` option, where it has one, as
    in cavs train, else none. text-bptt data carries the LSTM state from chunk to chunk
    as cavs train does (`batch` streams side by side, unshuffled, from zeros at each
    epoch and evaluation; bptt_state "reset": every chunk from zeros, shuffled, which is
    the default for a model whose model.bptt_state says it was trained so), and with
    bptt_vary > 0 cuts the chunks afresh each epoch, each minibatch's length drawn as
    cavs train --bptt-vary draws it (the rate scaled by length / N).
    callback(record)
    after each epoch, a dict with the keys of cavs train --log's records; returning
    False stops. Returns the records; with dev, model.best holds copies of the best
    epoch's parameters (model.best_epoch its number)."""
    kind = _optim_kind(optimizer)
    base_lr = lr if lr is not None else C.lib().cavs_optim_default_lr(kind)
    if clip is None:
        clip = model.options.get("clip", 0.0)
    sch = _schedule(schedule, lr_decay, lr_step, lr_min, cosine_epochs, plateau_factor, plateau_patience, base_lr,
                    epochs, dev, lr_decay_start)
    has_acc = any(model.spec.desc.contents.losses[i].kind == C.LOSS_SOFTMAX_XENT
                  for i in range(model.spec.desc.contents.nlosses))
    select = select or ("all" if has_acc else "loss")
    if select not in ("all", "root", "loss") or (select != "loss" and not has_acc):
        raise Error(f"select '{select}': not all, root or loss (all and root need a classifier)")
    if patience and dev is None:
        raise Error("patience needs a dev set to watch")
    rng = (seed * 0x9E3779B97F4A7C15 + 1) & 0xFFFFFFFFFFFFFFFF
    gs = list(data._gptrs if isinstance(data, Dataset) else [g.ptr for g in data])
    if bptt_state is None and getattr(model, "bptt_state", None) == "reset":
        bptt_state = "reset"  # (a model loaded from such a checkpoint goes on so, as --resume does)
    carry = _carries(model, data, bptt_state)
    fmt = getattr(data, "format", None) or ""
    if fmt == "text-bptt" or fmt.startswith("text-bptt:"):
        model.bptt_state = "carry" if carry else "reset"
    if not (0 <= bptt_vary <= 1e6):
        raise Error(f"bptt_vary {bptt_vary}: not a number from 0 to 10^6")
    if bptt_vary and not carry:
        raise Error("bptt_vary: the chunks vary on text-bptt with the state carried (bptt_state carry)")
    nint = model.spec.desc.contents.nint
    model.reserve_optimizer(optimizer)  # (as cavs train: before the first minibatch)
    n, nbatches, history, since = len(gs), (len(gs) + batch - 1) // batch, [], 0
    best = None
    for epoch in range(1, epochs + 1):
        lens = None
        if carry and bptt_vary:
            rng, (cut, _chain, _data), lens, base = _bptt_cut(gs, nint, batch, bptt_vary, rng)
            model.reset_state()
            epoch_gs, order = [ctypes.pointer(g) for g in cut], list(range(len(cut)))
        elif carry:
            epoch_gs, order = gs, stream_order(n, batch)
            model.reset_state()
        else:
            epoch_gs, order = gs, list(range(n))
            for i in range(n - 1, 0, -1):
                rng, r = _splitmix(rng)
                j = r % (i + 1)
                order[i], order[j] = order[j], order[i]
        tl, tb, count, correct, step_lr = 0.0, 0, 0, 0, base_lr
        norms = []
        model.track_grad_norm(True)
        for b in range(0, len(order), batch):
            st = model.forward([epoch_gs[i] for i in order[b:b + batch]])
            if not np.isfinite(st["loss"]):
                raise Error(f"epoch {epoch}: the loss is {st['loss']} (diverged); try a smaller lr or clip")
            model.backward()
            step = (epoch - 1) * nbatches + b // batch
            step_lr = _epoch_lr(sch, base_lr, epoch)
            if warmup > 0 and step < warmup:
                step_lr *= (step + 1) / warmup
            # (a chunk of another length than N: the rate scaled by it, as cavs train does)
            model.step(optimizer, step_lr * lens[b // batch] / base if lens else step_lr, clip, weight_decay, momentum)
            norms.append(model.grad_norm())
            tl, tb, count, correct = tl + st["loss"], tb + 1, count + st["count"], correct + st["correct"]
        rec = {"epoch": epoch, "train_loss": tl / max(tb, 1), "train_acc": correct / count if has_acc and count else None,
               "dev_loss": None, "dev_acc": None, "dev_root_acc": None, "lr": step_lr,
               "optimizer": optimizer, "schedule": sch["name"],
               "grad_norm_mean": sum(norms) / len(norms) if norms else None, "grad_norm_max": max(norms, default=None)}
        better = False
        if dev is not None:
            ev = evaluate(model, dev, batch, "carry" if carry else "reset")
            rec.update(dev_loss=ev["loss"], dev_acc=ev["accuracy"] if has_acc else None,
                       dev_root_acc=ev["root_accuracy"] if has_acc else None)
            metric = {"all": ev["accuracy"], "root": ev["root_accuracy"], "loss": ev["loss"]}[select]
            better = best is None or (metric < best if select == "loss" else metric > best)
            if better:
                best, since = metric, 0
                model.best, model.best_epoch = model.state_dict(), epoch
            else:
                since += 1
            if sch["name"] == "plateau":
                _plateau(sch, base_lr, metric, select != "loss")
        history.append(rec)
        if callback is not None and callback(rec) is False:
            break
        if patience and since >= patience:
            break
    return history
