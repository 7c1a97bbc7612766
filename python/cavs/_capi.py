"""_capi.py: libcavs through ctypes. The types of cavs.h and cavs_abi.h that Python
reads (the model descriptor as cavsc writes it, graphs, statistics, optimizer
settings), the prototypes of the functions the package calls, and where libcavs and
the cavs command are found. No compiled extension: the library is loaded as it is
installed (or built), with RTLD_GLOBAL, since the models the cavs command compiles
resolve their calls into libcavs when they are loaded.

The descriptor's layout is the one of CAVS_ABI_VERSION below; a model compiled against
another is refused (and tests/check_python.sh holds this number to cavs_abi.h's)."""

import ctypes
import ctypes.util
import os
import shutil

ABI_VERSION = 26
MAX_DIMS = 16

c_int, c_long, c_double, c_char_p, c_void_p, c_size_t = (
    ctypes.c_int, ctypes.c_long, ctypes.c_double, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)


class Lin(ctypes.Structure):
    """cavs_lin: k + sum c[i] * dims[i]"""
    _fields_ = [("k", c_int), ("c", c_int * MAX_DIMS)]

    def eval(self, dims):
        return self.k + sum(self.c[i] * dims[i] for i in range(len(dims)))


class DimDesc(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("kind", c_int), ("value", c_long), ("input", c_int), ("a", c_int), ("b", c_int)]


OPTION_DROPOUT, OPTION_CLIP, OPTION_BALANCE = 0, 1, 2  # enum cavs_option_kind


class OptionDesc(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("kind", c_int), ("value", c_double)]


class InputDesc(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("kind", c_int), ("width", Lin), ("slot", c_int)]


class ParamDesc(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("rank", c_int), ("rows", Lin), ("cols", Lin), ("group", c_int),
                ("col_off", Lin), ("init", c_int), ("a", c_double), ("b", c_double)]


class VertexDesc(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("children", c_int), ("pushes", c_int)] + \
        [(s, c_void_p) for s in ("fwd_eager", "fwd_path", "fwd_lazy", "bwd_lazy", "bwd_path", "bwd_eager")] + \
        [("eager_apart", c_int), ("ngathers", c_int), ("gathers", c_void_p), ("state", c_int),
         ("slot_names", ctypes.POINTER(c_char_p)), ("slot_types", ctypes.POINTER(c_int)), ("edges", c_int),
         ("edge_type", c_int), ("edge_state", c_int), ("homes", c_int), ("edge_buf", c_int), ("edge_off", Lin),
         ("bwd_grads", c_void_p * 3), ("reads_pull", c_int)]


class LossDesc(ctypes.Structure):
    _fields_ = [("kind", c_int), ("input", c_int)]


class ValueDesc(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("vertex", c_int), ("buf", c_int), ("off", Lin), ("width", Lin), ("kept", c_int)]


class Desc(ctypes.Structure):
    """cavs_desc, as far as Python reads it, every field before the last it reads."""
    _fields_ = [("abi", c_int), ("target", c_int), ("name", c_char_p), ("source", c_char_p),
                ("source_hash", c_char_p), ("source_text", c_char_p), ("precision", c_int),
                ("ndims", c_int), ("dims", ctypes.POINTER(DimDesc)),
                ("noptions", c_int), ("options", ctypes.POINTER(OptionDesc)),
                ("ninputs", c_int), ("nint", c_int), ("nreal", c_int), ("inputs", ctypes.POINTER(InputDesc)),
                ("nparams", c_int), ("params", ctypes.POINTER(ParamDesc)),
                ("npgroups", c_int), ("pgroups", c_void_p), ("nbufs", c_int), ("bufs", c_void_p),
                ("state_buf", c_int), ("push_buf", c_int), ("push_off", Lin), ("push_width", Lin), ("push_routes", c_int),
                ("nvertex", c_int), ("vertex", ctypes.POINTER(VertexDesc)),
                ("nlosses", c_int), ("losses", ctypes.POINTER(LossDesc)),
                ("pull_fwd", c_void_p), ("pull_bwd", c_void_p), ("push_fwd", c_void_p), ("push_bwd", c_void_p),
                ("nvalues", c_int), ("values", ctypes.POINTER(ValueDesc)),
                ("pull_grads", c_void_p), ("push_grads", c_void_p),
                ("naliases", c_int), ("aliases", c_void_p)]


DIM_FIXED, DIM_VOCAB, DIM_FREE, DIM_PRODUCT = range(4)
IN_INDEX, IN_CLASS, IN_REAL = range(3)
LOSS_SOFTMAX_XENT, LOSS_MSE = range(2)
FLOAT, DOUBLE = range(2)


class Graph(ctypes.Structure):
    _fields_ = [("n", c_int), ("maxc", c_int), ("child", ctypes.POINTER(c_int)), ("type", ctypes.POINTER(c_int)),
                ("feat", ctypes.POINTER(c_int)), ("real", ctypes.POINTER(ctypes.c_float)), ("slots", c_int)]


class Stats(ctypes.Structure):
    _fields_ = [("loss", c_double), ("count", c_long), ("correct", c_long), ("root_count", c_long),
                ("root_correct", c_long), ("tasks", c_int), ("lower_bound", c_int), ("aux_loss", c_double)]


class LossAcc(ctypes.Structure):
    _fields_ = [("sum", c_double), ("count", c_long), ("correct", c_long), ("root_count", c_long),
                ("root_correct", c_long)]


class Optim(ctypes.Structure):
    _fields_ = [("kind", c_int), ("lr", c_double), ("clip", c_double), ("weight_decay", c_double),
                ("beta1", c_double), ("beta2", c_double), ("eps", c_double), ("momentum", c_double)]


class ModelOpts(ctypes.Structure):
    _fields_ = [("backend", c_char_p), ("threads", c_int), ("one_stream", c_int), ("graphs", c_int), ("blas", c_int)]


class TrainState(ctypes.Structure):
    _fields_ = [("epoch", c_int), ("rng", ctypes.c_uint64), ("best", c_double), ("seed", ctypes.c_uint64),
                ("threads", c_int), ("batch", c_int), ("format", ctypes.c_char * 32), ("optim", Optim),
                ("graphs_done", c_long), ("select", c_int), ("lr_decay", c_double), ("lr_step", c_int),
                ("warmup", c_int), ("patience", c_int), ("since_best", c_int), ("best_epoch", c_int),
                ("schedule", c_int), ("lr_min", c_double), ("cosine_epochs", c_int), ("plateau_factor", c_double),
                ("plateau_patience", c_int), ("lr_now", c_double), ("plateau_best", c_double),
                ("plateau_bad", c_int), ("lr_decay_start", c_int), ("bptt_vary", c_double), ("bptt_state", c_int)]


BPTT_CARRY, BPTT_RESET = 1, 2  # cavs.h's CAVS_BPTT_CARRY and CAVS_BPTT_RESET


P = ctypes.POINTER
_PROTOS = {
    "cavs_version": (c_char_p, []),
    "cavs_dims_default": (None, [P(Desc), P(c_long)]),
    "cavs_dims_derive": (None, [P(Desc), P(c_long)]),
    "cavs_model_new_opts": (c_void_p, [P(Desc), P(c_long), P(ModelOpts), c_char_p, c_size_t]),
    "cavs_model_free": (None, [c_void_p]),
    "cavs_model_init": (None, [c_void_p, ctypes.c_uint64]),
    "cavs_model_set_inference": (None, [c_void_p, c_int]),
    "cavs_model_forward": (c_int, [c_void_p, P(P(Graph)), c_int, P(Stats)]),
    "cavs_model_backward": (None, [c_void_p]),
    "cavs_model_step": (c_int, [c_void_p, P(Optim)]),
    "cavs_model_reserve_optimizer": (c_int, [c_void_p, c_int]),
    "cavs_model_track_grad_norm": (c_int, [c_void_p, c_int]),
    "cavs_model_grad_norm": (c_double, [c_void_p]),
    "cavs_model_expert_load": (c_int, [c_void_p, c_int, ctypes.POINTER(c_long), c_int]),
    "cavs_model_expert_load_reset": (None, [c_void_p]),
    "cavs_model_carry_state": (c_int, [c_void_p, c_int]),
    "cavs_model_reset_state": (None, [c_void_p]),
    "cavs_model_freeze": (c_int, [c_void_p, c_int, c_int]),
    "cavs_model_error": (c_char_p, [c_void_p]),
    "cavs_model_backend": (c_char_p, [c_void_p]),
    "cavs_model_dim": (c_long, [c_void_p, c_int]),
    "cavs_model_set_option": (c_int, [c_void_p, c_char_p, c_double]),
    "cavs_model_option": (c_double, [c_void_p, c_int]),
    "cavs_model_param": (c_void_p, [c_void_p, c_int, P(c_long), P(c_long), P(c_long)]),
    "cavs_model_grad": (c_void_p, [c_void_p, c_int, P(c_long), P(c_long), P(c_long)]),
    "cavs_model_read": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t]),
    "cavs_model_write": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t]),
    "cavs_model_losses": (P(LossAcc), [c_void_p, P(c_int)]),
    "cavs_model_root_class": (c_int, [c_void_p, c_int]),
    "cavs_model_vertex_class": (c_int, [c_void_p, c_int, c_int]),
    "cavs_model_vertex_output": (c_long, [c_void_p, c_int, c_int, P(c_double), c_long]),
    "cavs_model_vertex_probs": (c_long, [c_void_p, c_int, c_int, P(c_double), c_long]),
    "cavs_model_vertex_value": (c_long, [c_void_p, c_int, c_int, c_char_p, P(c_double), c_long]),
    "cavs_optim_kind": (c_int, [c_char_p]),
    "cavs_optim_default_lr": (c_double, [c_int]),
    "cavs_vocab_new": (c_void_p, []),
    "cavs_vocab_free": (None, [c_void_p]),
    "cavs_vocab_size": (c_int, [c_void_p]),
    "cavs_vocab_id": (c_int, [c_void_p, c_char_p, c_size_t, c_int]),
    "cavs_vocab_word": (c_char_p, [c_void_p, c_int]),
    "cavs_model_load_vectors": (c_int, [c_void_p, c_int, c_char_p, c_void_p, P(c_long), c_char_p, c_size_t]),
    "cavs_dataset_load": (c_void_p, [c_char_p, c_char_p, P(Desc), P(c_long), c_void_p, c_int, c_char_p, c_size_t]),
    "cavs_dataset_parse": (c_void_p, [c_char_p, c_size_t, c_char_p, c_char_p, P(Desc), P(c_long), c_void_p, c_int,
                                      c_char_p, c_size_t]),
    "cavs_dataset_count": (c_int, [c_void_p]),
    "cavs_dataset_graph": (P(Graph), [c_void_p, c_int]),
    "cavs_dataset_vertices": (c_long, [c_void_p]),
    "cavs_dataset_max_feature": (c_int, [c_void_p, c_int]),
    "cavs_dataset_free": (None, [c_void_p]),
    "cavs_ckpt_save": (c_int, [c_char_p, c_void_p, c_char_p, c_void_p, P(TrainState), c_char_p, c_size_t]),
    "cavs_ckpt_read": (c_void_p, [c_char_p, c_char_p, c_size_t]),
    "cavs_ckpt_free": (None, [c_void_p]),
    "cavs_ckpt_model": (c_char_p, [c_void_p]),
    "cavs_ckpt_source": (c_char_p, [c_void_p]),
    "cavs_ckpt_precision": (c_int, [c_void_p]),
    "cavs_ckpt_dims": (c_int, [c_void_p, P(Desc), P(c_long), c_char_p, c_size_t]),
    "cavs_ckpt_state": (P(TrainState), [c_void_p]),
    "cavs_ckpt_vocab": (c_void_p, [c_void_p]),
    "cavs_ckpt_apply": (c_int, [c_void_p, c_void_p, c_char_p, c_size_t]),
    "cavs_set_memory_limit": (None, [c_size_t]),
    "cavs_memory_limit": (c_size_t, []),
    "cavs_model_memory": (c_int, [c_void_p, c_long, P(c_size_t), P(c_size_t)]),
}


class _Lib:
    """libcavs's functions, each called with errno cleared first: a failure's errno then
    says what failed (cavs.h: ENOMEM for memory, EIO for a device that failed), and
    ctypes.get_errno() reads it after the call."""

    def __init__(self, handle):
        self._handle = handle
        for name in _PROTOS:
            setattr(self, name, _clearing(getattr(handle, name)))

    def __getattr__(self, name):  # (what no prototype names: the library's own symbol)
        return getattr(self._handle, name)


def _clearing(f):
    def call(*args):
        ctypes.set_errno(0)
        return f(*args)
    call.__name__ = f.__name__
    return call


def _candidates():
    """Where libcavs may be: $CAVS_LIB; beside the cavs command (a build tree's .libs/,
    an install's PREFIX/lib); the loader's search path."""
    env = os.environ.get("CAVS_LIB")
    if env:
        yield env
        return
    exe = cavs_command()
    if exe:
        bindir = os.path.dirname(os.path.realpath(exe))
        for d in (os.path.join(bindir, ".libs"), os.path.join(bindir, "..", ".libs"),
                  os.path.join(bindir, "..", "lib"), os.path.join(bindir, "..", "lib64")):
            for name in ("libcavs.so.2", "libcavs.so"):
                if os.path.exists(os.path.join(d, name)):
                    yield os.path.join(d, name)
    found = ctypes.util.find_library("cavs")
    if found:
        yield found
    yield "libcavs.so.2"


def cavs_command():
    """The cavs command: $CAVS, else the first on PATH (None: not found)."""
    return os.environ.get("CAVS") or shutil.which("cavs")


_lib = None


def lib():
    """libcavs, loaded once, its prototypes set."""
    global _lib
    if _lib is not None:
        return _lib
    errors = []
    for path in _candidates():
        try:
            handle = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL, use_errno=True)
            break
        except OSError as e:
            errors.append(str(e))
    else:
        raise OSError("cannot load libcavs (set CAVS_LIB to its path, or put cavs on PATH): " + "; ".join(errors))
    for name, (res, args) in _PROTOS.items():
        f = getattr(handle, name)
        f.restype, f.argtypes = res, args
    _lib = _Lib(handle)
    return _lib
