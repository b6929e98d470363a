"""stof: Python binding over the stof C library (ctypes), taking torch tensors.

    import torch, stof
    ctx = stof.Context()
    mask = ctx.mask("bigbird:64:3:2:3:1", 4096, 4096)
    plan = ctx.attention_plan(q, k, v, mask)      # warm-up (compile / load)
    plan.run(q, k, v, out)                        # on torch's current stream

Score modifiers (planned once, applied by the kernel):

    plan = ctx.attention_plan(q, k, v, mask, softcap=50.0,   # tanh soft-capping
                              alibi_slopes=stof.alibi_slopes(q.shape[1]))  # ALiBi
    plan = ctx.attention_plan(q, k, v, mask, bias=bias)  # additive, e.g. (1, H, Sq, Sk)
    plan.run(q, k, v, out, bias=bias)  # a bias of the plan's shape and strides

Masks that change every batch (mask families, stof_mask_family in stof.h):

    fam = ctx.mask_family("causal&docs")           # or "dense", "causal|prefix"
    plan = ctx.attention_plan_family(q, k, v, fam)  # warm-up, once
    plan.run(q, k, v, out, doc_id=ids, q_len=lens, k_len=lens)  # each batch:
    # int32 CUDA tensors; the formats are built on the GPU, nothing is tuned

Transformer layers (stof_layer_* in stof.h):

    layer = ctx.layer_plan(batch, seq, 768, 12, 3072, torch.float16,
                           "gelu_tanh", "layer", False, mask, eps=1e-5)
    layer.run(weights, x, y)                      # one layer, x -> y
    layer.stack_run([weights] * 12, x, y)         # a stack, as a CUDA graph
    layer.describe()                              # the fusion scheme (JSON)
    llama = ctx.layer_plan(batch, seq, 2048, 32, 5632, torch.bfloat16, "silu",
                           "rms", True, mask, kv_heads=4, bias=False,
                           gated=True, rope_theta=10000.0)  # Llama: RoPE

weights: a dict of CUDA tensors named like stof_layer_weights' fields
(w_qkv, b_qkv, w_o, b_o, w_ffn1, b_ffn1, w_ffn2, b_ffn2, norm1_gamma,
norm1_beta, norm2_gamma, norm2_beta), contiguous, in the layer's dtype, laid
out like nn.Linear (weight [out][in]). x, y: contiguous (batch, seq, hidden)
or (batch * seq, hidden) tensors.

q, k, v, out: CUDA tensors of shape (batch, heads, seq, head_dim) in
torch.float16 or torch.bfloat16 whose last dimension is contiguous (any other
strides work, e.g. a (batch, seq, heads, dim) tensor transposed to BHSD).
The library is found through $STOF_LIBRARY, else inside this package (pip
install .), else next to this package in a meson build directory, else by
the system loader (libstof.so.0).
"""
import ctypes
import sys
import weakref
import json
import math
import operator
import os

__all__ = ["Context", "Mask", "MaskFamily", "Plan", "FamilyPlan", "Layer",
           "StofError", "library_path", "alibi_slopes", "pad_bias", "pack_bits",
           "rope_args", "qkv_weight",
           "LAYER_WEIGHT_NAMES"]


def __getattr__(name):
    """stof.__version__: the loaded library's version (stof_version_string),
    read when first asked for, so importing stof loads nothing.
    stof.attention: the PyTorch operator (stof.ops, imported on first use:
    it needs PyTorch)."""
    if name == "__version__":
        return _load().stof_version_string().decode()
    if name in ("attention", "ops"):
        _torch("stof." + name)
        # (not "from . import ops": that asks this function for "ops")
        import importlib
        ops = importlib.import_module(__name__ + ".ops")
        return ops if name == "ops" else ops.attention
    raise AttributeError("module 'stof' has no attribute %r" % name)

_STATUS_BUFFER_TOO_SMALL = 10
_STATUS_UNSUPPORTED = 6
_STATUS_INVALID = 1
_STACK_GRAPH = 1  # STOF_STACK_GRAPH


def _torch(what=None):
    """PyTorch, or an ImportError naming what needs it (default: the
    calling function; masks, mask families and the tuning database work
    without it)."""
    try:
        import torch
    except ImportError:
        what = what or sys._getframe(1).f_code.co_name + "()"
        raise ImportError(
            f"stof: {what} needs PyTorch, which is not installed (pip "
            f"install torch, or pip install 'stof[torch]'); masks, mask "
            f"families and the tuning database work without it") from None
    return torch


class StofError(RuntimeError):
    """A stof call failed; .status is the stof_status code."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


# C integer types as (lowest, highest, what): Python's ints cross into C
# through _c_int, which refuses one out of range (ctypes would wrap it).
_C_INT = (-2 ** 31, 2 ** 31 - 1, "a C int")
_C_INT64 = (-2 ** 63, 2 ** 63 - 1, "a C int64_t")
_C_PTR = (0, 2 ** (8 * ctypes.sizeof(ctypes.c_void_p)) - 1, "a pointer-sized handle")
# A 32-bit bitmap word, signed (pack_bitmap) or not; a seed, int64 or uint64.
_C_WORD = (-2 ** 31, 2 ** 32 - 1, "a 32-bit word, signed or not")
_C_SEED = (-2 ** 63, 2 ** 64 - 1, "a 64-bit seed, signed or not")


def _arg_name(name, index):
    return name + "".join("[%d]" % i for i in index)


# The largest finite C float (FLT_MAX).
_FLT_MAX = 3.4028234663852886e38


def _c_float(value, name):
    """value as a Python float for a C float argument or struct field:
    refuses anything but a real number (a bool, a string: TypeError) and a
    finite value beyond a float's range (ValueError: ctypes would make it
    infinite), naming the argument. Whether the value is valid for its
    field is the library's to say (it names the field too)."""
    if isinstance(value, (bool, str, bytes)) or \
            type(value).__name__ in ("bool_", "bool") or \
            not hasattr(type(value), "__float__"):
        raise TypeError("%s must be a number, not %s %r"
                        % (name, type(value).__name__, value))
    v = float(value)
    if math.isfinite(v) and abs(v) > _FLT_MAX:
        raise ValueError("%s = %r is out of range: a C float holds at most %g"
                         % (name, v, _FLT_MAX))
    return v


def _c_int(value, name, c_type=_C_INT, index=()):
    """value as a Python int in the range of c_type (lowest, highest, what),
    for an argument or struct field that goes to C: ctypes silently wraps an
    int out of range (2**32 + 8 becomes 8). Refuses anything that is not an
    integer (a bool, a float: int() would truncate it; a string) with a
    TypeError and an integer out of range with a ValueError, naming the
    argument (name, followed by [i] for each of index) and the range."""
    if type(value) is int:
        v = value
    else:
        if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool") or \
                not hasattr(type(value), "__index__"):
            raise TypeError("%s must be an integer, not %s %r"
                            % (_arg_name(name, index), type(value).__name__, value))
        v = operator.index(value)
        if isinstance(v, bool):
            raise TypeError("%s must be an integer, not a bool" % _arg_name(name, index))
    lo, hi, what = c_type
    if not lo <= v <= hi:
        raise ValueError("%s = %d is out of range: it must be in %d..%d (%s)"
                         % (_arg_name(name, index), v, lo, hi, what))
    return v


def _c_str(value, name):
    """A str argument (or a path, os.PathLike) as the bytes of a C string: a
    str only (TypeError otherwise, bytes included), without a NUL character (ValueError: C
    would read the string only up to it)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError("%s must be a str, not %s %r" % (name, type(value).__name__,
                                                         value))
    if "\0" in value:
        raise ValueError("%s contains a NUL character (at index %d), where C would "
                         "cut it: %r" % (name, value.index("\0"), value))
    return value.encode()


def library_path():
    env = os.environ.get("STOF_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    # Installed by pip: the library sits in the package.
    p = os.path.join(here, "libstof.so")
    if os.path.exists(p):
        return p
    root = os.path.dirname(os.path.dirname(here))
    for d in ("build", "build-dev", "build-release", ".carry/lib"):
        p = os.path.join(root, d, "src", "libstof.so")
        if os.path.exists(p):
            return p
        p = os.path.join(root, d, "libstof.so")
        if os.path.exists(p):
            return p
    return "libstof.so.0"


# stof_log_fn: (user, level, message).
_LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)
_LOG_LEVELS = {"error": 0, "warn": 1, "info": 2, "debug": 3}


class _Settings(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_int),
        ("require_device", ctypes.c_int),
        ("user_db", ctypes.c_char_p),
        ("system_dbs", ctypes.c_void_p),
        ("tuning_mode", ctypes.c_int),
        ("tuning_budget_s", ctypes.c_double),
        ("compile_threads", ctypes.c_int),
        ("log_fn", ctypes.c_void_p),
        ("log_user", ctypes.c_void_p),
        ("log_level", ctypes.c_int),
        ("tuning_top_k", ctypes.c_int),
        ("tuning_reps", ctypes.c_int),
        ("tuning_seed", ctypes.c_uint64),
        ("reserved", ctypes.c_uint8 * 112),
    ]


class _Desc(ctypes.Structure):
    _fields_ = [
        ("batch", ctypes.c_int),
        ("heads", ctypes.c_int),
        ("seq_q", ctypes.c_int),
        ("seq_k", ctypes.c_int),
        ("head_dim", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("scale", ctypes.c_float),
        ("layout", ctypes.c_int),
        ("q_stride", ctypes.c_int64 * 3),
        ("k_stride", ctypes.c_int64 * 3),
        ("v_stride", ctypes.c_int64 * 3),
        ("o_stride", ctypes.c_int64 * 3),
        ("kv_heads", ctypes.c_int),
        ("softcap", ctypes.c_float),
        ("alibi_slopes", ctypes.POINTER(ctypes.c_float)),
        ("bias_stride", ctypes.c_int64 * 3),
        ("bias", ctypes.c_int),
        ("reserved", ctypes.c_uint8 * 20),
    ]


class _LayerDesc(ctypes.Structure):
    """stof_layer_desc."""
    _fields_ = [
        ("batch", ctypes.c_int),
        ("seq", ctypes.c_int),
        ("hidden", ctypes.c_int),
        ("heads", ctypes.c_int),
        ("ffn", ctypes.c_int),
        ("dtype", ctypes.c_int),      # stof_dtype
        ("act", ctypes.c_int),        # stof_activation
        ("norm", ctypes.c_int),       # stof_norm_kind
        ("pre_norm", ctypes.c_int),
        ("norm_eps", ctypes.c_float),
        ("kv_heads", ctypes.c_int),   # grouped-query attention (0 = heads)
        ("no_bias", ctypes.c_int),    # 1: no projection biases
        ("gated", ctypes.c_int),      # 1: gated FFN (SwiGLU, GeGLU)
        ("rope_theta", ctypes.c_float),  # RoPE base (0 = none)
        ("rope_dim", ctypes.c_int),   # rotated channels a head (0 = head_dim)
        ("rope_scale", ctypes.c_float),  # cos and sin multiplied (0 = 1)
        ("rope_freq", ctypes.POINTER(ctypes.c_float)),  # own frequencies
        ("qk_norm", ctypes.c_int),    # 1: Q and K RMS-normalised per head
        ("head_dim", ctypes.c_int),   # 0: hidden / heads
        ("reserved", ctypes.c_uint8 * 24),
    ]


# The fields of stof_layer_weights, in order.
LAYER_WEIGHT_NAMES = ("w_qkv", "b_qkv", "w_o", "b_o", "w_ffn1", "b_ffn1",
                      "w_ffn2", "b_ffn2", "norm1_gamma", "norm1_beta",
                      "norm2_gamma", "norm2_beta")


class _LayerWeights(ctypes.Structure):
    """stof_layer_weights: device pointers."""
    _fields_ = [(n, ctypes.c_void_p) for n in LAYER_WEIGHT_NAMES]


# sizeof of the C structs on LP64 (x86-64, aarch64 Linux); a mismatch means
# the mirrors above drifted from stof.h.
_C_SIZES = {_Settings: 200, _Desc: 192, _LayerDesc: 104, _LayerWeights: 96}
if ctypes.sizeof(ctypes.c_void_p) == 8:
    for _t, _n in _C_SIZES.items():
        if ctypes.sizeof(_t) != _n:
            raise ImportError("stof binding: sizeof(%s) is %d, stof.h says %d"
                              % (_t.__name__, ctypes.sizeof(_t), _n))
    if (_Desc.softcap.offset, _Desc.alibi_slopes.offset, _Desc.bias_stride.offset,
            _Desc.bias.offset) != (132, 136, 144, 168):
        raise ImportError("stof binding: stof_attention_desc's softcap, alibi_slopes, "
                          "bias_stride, bias offsets differ from stof.h's (132, 136, "
                          "144, 168)")

_ACTS = {"none": 0, "gelu_tanh": 1, "gelu": 1, "gelu_erf": 2, "erf": 2,
         "relu": 3, "silu": 4}
_NORMS = {"layer": 0, "layernorm": 0, "ln": 0, "rms": 1, "rmsnorm": 1}

_lib = None


class _MaskData(ctypes.Structure):
    # stof_mask_data in stof.h
    _fields_ = [("q_len", ctypes.c_void_p), ("k_len", ctypes.c_void_p),
                ("q_offset", ctypes.c_void_p), ("prefix", ctypes.c_void_p),
                ("doc_id", ctypes.c_void_p), ("doc_stride", ctypes.c_int64),
                ("seed", ctypes.c_void_p),
                ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p),
                ("total_q", ctypes.c_int32), ("total_k", ctypes.c_int32),
                ("bitmap", ctypes.c_void_p), ("bitmap_stride", ctypes.c_int64),
                ("bitmap_words", ctypes.c_int32), ("head", ctypes.c_int32),
                ("head_window", ctypes.c_void_p), ("reserved", ctypes.c_uint8 * 8)]


class _RunArgs(ctypes.Structure):
    """stof_run_args (stof_attention_run_ex): device pointers."""
    _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p),
                ("v", ctypes.c_void_p), ("o", ctypes.c_void_p),
                ("data", ctypes.POINTER(_MaskData)), ("lse", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("reserved_u", ctypes.c_uint32), ("reserved", ctypes.c_void_p * 4)]


# stof_run_args.flags (stof.h)
RUN_SAME_DATA = 1


if ctypes.sizeof(ctypes.c_void_p) == 8 and ctypes.sizeof(_RunArgs) != 96:
    raise ImportError("stof binding: sizeof(_RunArgs) is %d, stof.h says 96"
                      % ctypes.sizeof(_RunArgs))


_DATA_FIELDS = ("q_len", "k_len", "q_offset", "prefix", "doc_id", "seed",
                "cu_seqlens_q", "cu_seqlens_k", "bitmap", "head_window")


def pack_bitmap(allowed):
    """The words of a `bitmap` leaf from a boolean tensor (rows, keys) or
    (batch, rows, keys), True = may attend: int32 (.., rows, ceil(keys /
    32)), bit k % 32 of word k / 32, on the tensor's device (give it to a
    plan's run as bitmap=...)."""
    torch = _torch()
    if allowed.dim() not in (2, 3):
        raise ValueError("pack_bitmap: (rows, keys) or (batch, rows, keys)")
    n = allowed.shape[-1]
    pad = (-n) % 32
    a = torch.nn.functional.pad(allowed.to(torch.int64), (0, pad))
    a = a.view(*a.shape[:-1], (n + pad) // 32, 32)
    w = (a << torch.arange(32, device=a.device, dtype=torch.int64)).sum(-1)
    w = torch.where(w >= 2 ** 31, w - 2 ** 32, w)
    return w.to(torch.int32).contiguous()


def pack_bits(allowed, chunk=1 << 24):
    """A 2-D tensor (rows, keys), nonzero = allowed, packed to the rows of
    Context.mask_from_bits: uint8 (rows, ceil(keys / 8)), bit k % 8 (least
    significant first) of byte k // 8, on the tensor's device, working
    through about `chunk` elements at a time (no full-size temporaries)."""
    torch = _torch()
    if allowed.dim() != 2:
        raise ValueError("pack_bits: a 2-D (rows, keys) tensor, not %d-D"
                         % allowed.dim())
    rows, n = allowed.shape
    nb = (n + 7) // 8
    out = torch.empty((rows, nb), dtype=torch.uint8, device=allowed.device)
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8,
                           device=allowed.device)
    step = max(1, chunk // max(8 * nb, 1))
    for r0 in range(0, rows, step):
        part = allowed[r0:r0 + step]
        z = torch.zeros((part.shape[0], 8 * nb), dtype=torch.uint8,
                        device=allowed.device)
        z[:, :n] = part != 0
        out[r0:r0 + step] = (z.view(-1, nb, 8) * weights).sum(-1, dtype=torch.int32)
    return out


def _check_out_strides(out):
    """Each element of out needs its own memory: no stride of 0 (an
    expanded tensor, whose blocks would overwrite each other's rows)."""
    if any(s == 0 and n > 1 for n, s in zip(out.shape, out.stride())):
        raise ValueError("out has a stride of 0 (an expanded tensor): each "
                         "element needs its own memory")


def _list_shape(v):
    """The shape of nested lists (by their first elements)."""
    shape = []
    while isinstance(v, (list, tuple)):
        shape.append(len(v))
        v = v[0] if v else None
    return tuple(shape)


def _flat_nested(v, name="value", c_type=_C_INT, index=()):
    """The ints of nested lists, in order, each in c_type's range
    (_c_int; name and index name an element that is not)."""
    if not isinstance(v, (list, tuple)):
        return [_c_int(v, name, c_type, index)]
    return [x for i, e in enumerate(v) for x in _flat_nested(e, name, c_type,
                                                              index + (i,))]


def _bitmap_field(d, val, device, keep, batch, seq_q, seq_k):
    """Set d's bitmap from (rows, words) (shared) or (batch, rows, words)
    int32 words (pack_bitmap): a CUDA tensor for runs, a host tensor, numpy
    array or nested lists for samples. It must cover the problem: at least
    `batch` sequences (3-D), seq_q rows (None: not checked, a packed
    problem's sequences have rows of their own) and ceil(seq_k / 32) words
    a row."""
    shape = tuple(int(x) for x in val.shape) if hasattr(val, "shape") \
        else _list_shape(val)
    if len(shape) not in (2, 3):
        raise ValueError("bitmap must be (rows, words) or (batch, rows, words)")
    if len(shape) == 3 and shape[0] < batch:
        raise ValueError("bitmap holds %d sequences, the problem has %d"
                         % (shape[0], batch))
    if seq_q is not None and shape[-2] < seq_q:
        raise ValueError("bitmap has %d rows a sequence, the problem %d"
                         % (shape[-2], seq_q))
    if shape[-1] < (seq_k + 31) // 32:
        raise ValueError("bitmap has %d words a row; %d keys need %d"
                         % (shape[-1], seq_k, (seq_k + 31) // 32))
    d.bitmap_words = _c_int(shape[-1], "bitmap's words a row")
    d.bitmap_stride = _c_int(0 if len(shape) == 2 else shape[1] * shape[2],
                             "bitmap's words a sequence", _C_INT64)
    if device is not None:
        torch = _torch()
        if not isinstance(val, torch.Tensor) or not val.is_cuda or \
                val.dtype != torch.int32 or not val.is_contiguous():
            raise ValueError("bitmap must be a contiguous int32 CUDA tensor (pack_bitmap)")
        if val.device != device:
            raise ValueError("bitmap is on %s, the tensors on %s" % (val.device, device))
        keep.append(val)
        d.bitmap = val.data_ptr()
        return
    if hasattr(val, "dtype") and str(val.dtype) in (
            "int32", "uint32", "torch.int32", "torch.uint32"):
        # (an array of words as they are: no Python list of every word)
        import numpy as np
        a = val.detach().cpu().numpy() if hasattr(val, "detach") else np.asarray(val)
        a = np.ascontiguousarray(a).view(np.uint32)
        keep.append(a)
        d.bitmap = a.ctypes.data
        return
    ints = _flat_ints(val.reshape(-1), "bitmap", _C_WORD) if hasattr(val, "reshape") \
        else _flat_nested(val, "bitmap", _C_WORD)
    n = 1
    for x in shape:
        n *= x
    if len(ints) != n:
        raise ValueError("bitmap rows must all have %d words" % shape[-1])
    t = (ctypes.c_uint32 * max(len(ints), 1))(*[x & 0xffffffff for x in ints])
    keep.append(t)
    d.bitmap = ctypes.addressof(t)


def _flat_ints(val, name="value", c_type=_C_INT):
    """A list of ints from a list, a nested list or anything with tolist(),
    each in c_type's range (_c_int: name[i] or name[i][j] is named where
    one is not)."""
    if hasattr(val, "tolist"):
        val = val.tolist()
    out = []
    for i, x in enumerate(val):
        if isinstance(x, (list, tuple)):
            out.extend(_c_int(y, name, c_type, (i, j)) for j, y in enumerate(x))
        else:
            out.append(_c_int(x, name, c_type, (i,)))
    return out


def _mask_data(fields, device, batch, seq_k, keep, packed=False, heads=None,
               seq_q=None):
    """A _MaskData from a dict of per-sequence values: int32 CUDA tensors on
    `device` (seed: int64, read as uint64), or (device None: host data)
    tensors, numpy arrays or lists. doc_id is (batch, >= seq_k) or flat
    (batch * seq_k); packed (cu_seqlens_q/k: batch + 1 offsets), doc_id is
    flat over the seq_k packed keys. `keep` collects the buffers that must
    outlive the call."""
    d = _MaskData()
    for name, val in fields.items():
        if name not in _DATA_FIELDS:
            raise ValueError("unknown instance field %r (expected one of %s)"
                             % (name, ", ".join(_DATA_FIELDS)))
        if val is None:
            continue
        if name == "bitmap":
            _bitmap_field(d, val, device, keep, batch,
                          None if packed else seq_q, seq_k)
            continue
        if name.startswith("cu_seqlens") and not packed:
            raise ValueError("%s is for packed plans (Context.attention_plan_packed)" % name)
        want = (seq_k if packed else batch * seq_k) if name == "doc_id" else \
            batch + 1 if name.startswith("cu_seqlens") else \
            heads if name == "head_window" else batch
        wide = name == "seed"
        if device is not None:
            torch = _torch()
            t = val
            dt = torch.int64 if wide else torch.int32
            if not isinstance(t, torch.Tensor) or not t.is_cuda or \
                    t.dtype != dt or not t.is_contiguous():
                raise ValueError("%s must be a contiguous %s CUDA tensor"
                                 % (name, "int64" if wide else "int32"))
            if t.device != device:
                raise ValueError("%s is on %s, the tensors on %s" % (name, t.device, device))
            n, ptr = t.numel(), t.data_ptr()
            if name == "doc_id" and t.dim() == 2 and not packed:
                if t.shape[0] != batch or t.shape[1] < seq_k:
                    raise ValueError("doc_id must be (batch, >= seq_k)")
                d.doc_stride, n = t.shape[1], want
            if name == "doc_id" and packed and n >= want:
                n = want
        else:
            ints = _flat_ints(val, name, _C_SEED if wide else _C_INT)
            n = len(ints)
            if name == "doc_id" and not packed and n > want and n % batch == 0:
                d.doc_stride = n // batch
                n = want
            if name == "doc_id" and packed and n >= want:
                n = want
            if wide:
                t = (ctypes.c_uint64 * max(len(ints), 1))(*[x & (2**64 - 1) for x in ints])
            else:
                t = (ctypes.c_int32 * max(len(ints), 1))(*ints)
            ptr = ctypes.addressof(t)
        if want is None:  # head_window without the plan's heads at hand
            want = n
        if n != want:
            raise ValueError("%s has %d elements, expected %d" % (name, n, want))
        keep.append(t)
        setattr(d, name, ptr)
    return d


def alibi_slopes(heads):
    """The standard ALiBi slopes of `heads` heads (Press et al.'s reference
    construction), a list of floats for attention_plan(alibi_slopes=...).
    For a power of two n, head i gets 2 ** (-8 * (i + 1) / n). Otherwise n
    is the largest power of two below `heads`: its n slopes come first, then
    every other slope of the 2n set (its indices 0, 2, 4, ...) until there
    are `heads`; e.g. 12 heads: the 8-head slopes, then 2 ** -0.5, 2 ** -1.5,
    2 ** -2.5, 2 ** -3.5."""
    heads = int(heads)
    if heads < 1:
        raise ValueError("alibi_slopes: heads must be at least 1, not %d" % heads)

    def power_of_two(n):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    n = 1 << (heads.bit_length() - 1)
    if n == heads:
        return power_of_two(n)
    return power_of_two(n) + power_of_two(2 * n)[0::2][:heads - n]


def qkv_weight(q, k, v, q_norm=None, k_norm=None):
    """A layer's w_qkv from its projections' weights (q_proj.weight,
    k_proj.weight, v_proj.weight: [out][hidden] each): their rows stacked,
    (qd + 2 kvd, hidden), qd = heads * head_dim; with a QK norm
    (layer_plan(qk_norm=True)) the
    flat buffer of those rows followed by q_norm's and k_norm's weights
    (head_dim each), as stof_layer_weights wants it. A new contiguous
    tensor."""
    torch = _torch()
    rows = torch.cat([q, k, v], dim=0)
    if q_norm is None and k_norm is None:
        return rows.contiguous()
    if q_norm is None or k_norm is None:
        raise ValueError("qkv_weight: give both q_norm and k_norm, or neither")
    if q_norm.shape != k_norm.shape or q_norm.dim() != 1:
        raise ValueError("qkv_weight: q_norm and k_norm are two vectors of "
                         "head_dim, not %s and %s"
                         % (tuple(q_norm.shape), tuple(k_norm.shape)))
    return torch.cat([rows.reshape(-1), q_norm.to(rows.dtype),
                      k_norm.to(rows.dtype)]).contiguous()


def rope_args(config, seq):
    """Context.layer_plan's RoPE keywords for a Hugging Face model
    configuration (LlamaConfig, MistralConfig, Qwen2Config, Phi3Config, ...)
    and sequences of `seq` tokens, a dict: the default rope type gives
    rope_theta (and rope_dim for a partial rotary); a scaled one (llama3,
    linear, yarn, longrope, dynamic, ...) its frequencies and attention
    scaling, rope_freq and rope_scale, from transformers' own
    ROPE_INIT_FUNCTIONS at seq_len=seq: dynamic and longrope give what a
    freshly built model uses for sequences of that length. Raises
    ValueError for a configuration without RoPE or with a rope per layer
    type (Gemma 3's local and global layers: give one layer's own)."""
    params = getattr(config, "rope_parameters", None)  # (transformers 5)
    if not isinstance(params, dict) or not params:
        params = dict(getattr(config, "rope_scaling", None) or {})
        if getattr(config, "rope_theta", None) is not None:
            params.setdefault("rope_theta", config.rope_theta)
    if "rope_theta" not in params:
        raise ValueError("rope_args: the configuration has no single "
                         "rope_theta (no RoPE, or one per layer type: %s)"
                         % sorted(params)[:4])
    rope_type = params.get("rope_type", params.get("type", "default"))
    head_dim = (getattr(config, "head_dim", None)
                or config.hidden_size // config.num_attention_heads)
    partial = params.get("partial_rotary_factor",
                         getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    dim = int(head_dim * partial)
    out = {"rope_dim": 0 if dim == head_dim else dim}
    if rope_type == "default":
        out["rope_theta"] = float(params["rope_theta"])
        return out
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError("rope_args: transformers knows no rope type %r"
                         % (rope_type,))
    seq_len = int(seq)
    if "dynamic" in rope_type and seq_len > getattr(
            config, "max_position_embeddings", seq_len):
        # (as a model's forward gives it, a tensor: the scaled base in fp32)
        import torch
        seq_len = torch.tensor(seq_len)
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, None,
                                                     seq_len=seq_len)
    out["rope_freq"] = inv_freq.detach().float().cpu().reshape(-1).tolist()
    out["rope_scale"] = float(scale)
    return out


def _score_mods(d, softcap, slopes, heads):
    """Set d's softcap and alibi_slopes (`heads` finite floats: a sequence,
    a CPU tensor or anything iterable; None = no ALiBi). Returns the ctypes
    array d points to, which must stay referenced until the plan call
    returned (the library copies it)."""
    try:
        cap = float(softcap)
    except (TypeError, ValueError):
        raise ValueError("softcap must be a number, not %r" % (softcap,))
    if not math.isfinite(cap) or cap < 0:
        raise ValueError("softcap must be finite and >= 0 (0 = none), not %r" % cap)
    d.softcap = cap
    if slopes is None:
        return None
    if hasattr(slopes, "tolist"):
        slopes = slopes.tolist()
    try:
        vals = [float(x) for x in slopes]
    except (TypeError, ValueError):
        raise ValueError("alibi_slopes must be a flat sequence of %d floats" % heads)
    if len(vals) != heads:
        raise ValueError("alibi_slopes has %d values, expected one per query head (%d)"
                         % (len(vals), heads))
    for i, x in enumerate(vals):
        if not math.isfinite(x):
            raise ValueError("alibi_slopes[%d] = %r is not finite" % (i, x))
    arr = (ctypes.c_float * heads)(*vals)
    d.alibi_slopes = ctypes.cast(arr, ctypes.POINTER(ctypes.c_float))
    return arr


_BIAS_DIMS = ("batch", "head", "query row")
_BHSD = ("batch", "heads", "seq", "head_dim")


def _bias_descriptor(bias):
    """(shape, strides) of a plan's bias given without a tensor: a shape
    (a contiguous tensor of it) or a pair (shape, strides), in elements."""
    try:
        if len(bias) == 2 and all(isinstance(x, (tuple, list)) for x in bias):
            shape = tuple(int(x) for x in bias[0])
            strides = tuple(int(x) for x in bias[1])
        else:
            shape = tuple(int(x) for x in bias)
            strides, n = [], 1
            for size in reversed(shape):
                strides.insert(0, n)
                n *= size
            strides = tuple(strides)
    except (TypeError, ValueError):
        raise ValueError("bias must be a tensor, a shape or a pair (shape, strides), "
                         "not %r" % (bias,))
    return shape, strides


def _bias_layout(shape, strides, size):
    """The 4-D shape and the bias_stride {batch, head, query row} of an
    additive bias of `shape` and `strides` (elements; 2-D (seq_q, seq_k),
    3-D (heads, seq_q, seq_k) or 4-D) that broadcasts to `size` = (batch,
    heads, seq_q, seq_k) by torch's rules: a dimension of size 1 (and a
    missing leading one) broadcasts, stride 0; an expanded one (stride 0)
    too. The key dimension is seq_k, contiguous. Raises ValueError for a
    layout stof refuses."""
    shape, strides = tuple(int(x) for x in shape), tuple(int(x) for x in strides)
    size = tuple(int(x) for x in size)
    if len(shape) != len(strides) or not 2 <= len(shape) <= 4:
        raise ValueError("bias must be 2-D (seq_q, seq_k), 3-D (heads, seq_q, seq_k) "
                         "or 4-D (batch, heads, seq_q, seq_k), not of shape %s"
                         % (shape,))
    lead = 4 - len(shape)
    shape, strides = (1,) * lead + shape, (0,) * lead + strides
    if shape[3] != size[3] or any(n not in (1, w) for n, w in zip(shape[:3], size[:3])):
        raise ValueError("bias of shape %s does not broadcast to (batch, heads, seq_q, "
                         "seq_k) = %s: each of the first dimensions must be its size "
                         "or 1, the last one seq_k" % (shape[lead:], size))
    if size[3] > 1 and strides[3] != 1:
        raise ValueError("the bias's key (last) dimension must be contiguous (stride "
                         "1), not stride %d" % strides[3])
    out = tuple(0 if n == 1 else st for n, st in zip(shape[:3], strides[:3]))
    bad = ["%s %d" % (name, st) for name, st in zip(_BIAS_DIMS, out)
           if st < 0 or st % 8]
    if bad:
        raise ValueError("the bias's strides must be multiples of 8 elements and >= 0, "
                         "not (%s); stof.pad_bias(bias) makes a copy whose rows are "
                         "stored padded to a multiple of 8 keys (plan and run with "
                         "it)" % ", ".join(bad))
    return shape, out


def _set_bias(d, bias, q, seq_k):
    """Set d's bias and bias_stride from a plan's bias argument (None: no
    bias): a tensor of q's dtype and device, or a shape or (shape, strides)
    pair (_bias_descriptor) of a tensor of q's dtype. q: anything with
    shape, dtype and device. Returns the layout (_bias_layout) or None."""
    if bias is None:
        return None
    size = (int(q.shape[0]), int(q.shape[1]), int(q.shape[2]), int(seq_k))
    if hasattr(bias, "stride") and hasattr(bias, "dtype"):
        if bias.dtype != q.dtype:
            raise ValueError("bias is %s, q is %s: the bias must have q's dtype"
                             % (bias.dtype, q.dtype))
        if bias.device != q.device:
            raise ValueError("bias is on %s, q on %s" % (bias.device, q.device))
        layout = _bias_layout(tuple(bias.shape), tuple(bias.stride()), size)
    else:
        layout = _bias_layout(*_bias_descriptor(bias), size)
    d.bias = 1
    for i in range(3):
        d.bias_stride[i] = _c_int(layout[1][i], "the bias's %s stride" % _BIAS_DIMS[i],
                                  _C_INT64)
    return layout


def pad_bias(bias):
    """A copy of an additive bias tensor (same values, dtype, device and
    shape) whose rows are stored padded to a multiple of 8 keys, sliced
    back: its strides are multiples of 8 elements, as attention_plan(bias=
    ...) needs. Dimensions of size 1 and broadcast ones (stride 0, e.g. from
    expand) stay broadcast, not materialised. Always a new tensor: make it
    once and write later biases into it (plans take the layout only)."""
    torch = _torch()
    if bias.dim() < 1:
        raise ValueError("pad_bias: the bias must have a key dimension")
    shape = tuple(bias.shape)
    base = bias
    for i in range(bias.dim() - 1):
        if bias.stride(i) == 0 and shape[i] > 1:
            base = base.narrow(i, 0, 1)
    n = shape[-1]
    store = torch.zeros(*base.shape[:-1], n + (-n) % 8, dtype=bias.dtype,
                        device=bias.device)
    view = store[..., :n]
    view.copy_(base)
    return view.expand(shape)


def _lse_ptr(lse, n):
    """The device pointer of an LSE output tensor of n float32 elements."""
    torch = _torch()
    if not isinstance(lse, torch.Tensor) or not lse.is_cuda or \
            lse.dtype != torch.float32 or not lse.is_contiguous() or lse.numel() != n:
        raise ValueError("lse must be a contiguous float32 CUDA tensor of %d elements" % n)
    return lse.data_ptr()


def _load():
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        if os.environ.get("STOF_LIBRARY"):
            raise OSError("stof: cannot load the library %r named by the STOF_LIBRARY "
                          "environment variable: %s" % (path, e)) from e
        raise OSError("stof: cannot load the library %r (found without STOF_LIBRARY, "
                      "which can name it): %s" % (path, e)) from e
    vp, cp, i, u64 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint64
    sz = ctypes.c_size_t
    sigs = {
        "stof_default_settings": (None, [ctypes.POINTER(_Settings)]),
        "stof_open": (i, [ctypes.POINTER(vp), ctypes.POINTER(_Settings)]),
        "stof_close": (None, [ctypes.POINTER(vp)]),
        "stof_errmsg": (cp, [vp]),
        "stof_status_str": (cp, [i]),
        "stof_has_device": (i, [vp]),
        "stof_version_string": (cp, []),
        "stof_device_describe": (i, [vp, cp, sz, ctypes.POINTER(sz)]),
        "stof_mask_from_spec": (i, [vp, cp, i, i, ctypes.POINTER(vp)]),
        "stof_mask_from_dense": (i, [vp, vp, i, i, ctypes.POINTER(vp)]),
        "stof_mask_from_bits": (i, [vp, vp, sz, i, i, ctypes.POINTER(vp)]),
        "stof_mask_free": (None, [ctypes.POINTER(vp)]),
        "stof_mask_density": (ctypes.c_double, [vp]),
        "stof_mask_seq_q": (i, [vp]),
        "stof_mask_seq_k": (i, [vp]),
        "stof_mask_digest": (None, [vp, ctypes.POINTER(u64), cp]),
        "stof_mask_to_dense": (None, [vp, vp]),
        "stof_attention_plan": (i, [vp, ctypes.POINTER(_Desc), vp, ctypes.POINTER(vp)]),
        "stof_attention_run": (i, [vp, vp, vp, vp, vp, vp]),
        "stof_plan_describe": (i, [vp, cp, sz, ctypes.POINTER(sz)]),
        "stof_plan_errmsg": (cp, [vp]),
        "stof_plan_free": (None, [ctypes.POINTER(vp)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    # Mask pictures, mask families and the general run: optional, so that an
    # older library still loads.
    md = ctypes.POINTER(_MaskData)
    family_sigs = {
        "stof_mask_family_create": (i, [vp, cp, ctypes.POINTER(vp)]),
        "stof_mask_family_free": (None, [ctypes.POINTER(vp)]),
        "stof_mask_family_spec": (cp, [vp]),
        "stof_mask_family_eval": (i, [vp, vp, i, i, md, i, ctypes.POINTER(vp)]),
        "stof_attention_plan_family": (i, [vp, ctypes.POINTER(_Desc), vp, md,
                                           ctypes.POINTER(vp)]),
        "stof_attention_run_family": (i, [vp, md, vp, vp, vp, vp, vp]),
        "stof_attention_run_lse": (i, [vp, md, vp, vp, vp, vp, vp, vp]),
        "stof_attention_run_ex": (i, [vp, ctypes.POINTER(_RunArgs), vp]),
        "stof_mask_png": (i, [vp, vp, i, i, i, vp, sz, ctypes.POINTER(sz)]),
    }
    for name, (res, args) in family_sigs.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = res
            fn.argtypes = args
    # The layer API: optional, so that a library without it still loads.
    lw = ctypes.POINTER(_LayerWeights)
    layer_sigs = {
        "stof_layer_plan": (i, [vp, ctypes.POINTER(_LayerDesc), vp, ctypes.POINTER(vp)]),
        "stof_layer_run": (i, [vp, lw, vp, vp, vp]),
        "stof_layer_stack_run": (i, [vp, i, lw, vp, vp, vp, ctypes.c_uint]),
        "stof_layer_describe": (i, [vp, cp, sz, ctypes.POINTER(sz)]),
        "stof_layer_errmsg": (cp, [vp]),
        "stof_layer_free": (None, [ctypes.POINTER(vp)]),
        "stof_layer_plan_family": (i, [vp, ctypes.POINTER(_LayerDesc), vp, md,
                                       ctypes.POINTER(vp)]),
        "stof_layer_run_family": (i, [vp, md, lw, vp, vp, vp]),
        "stof_layer_stack_run_family": (i, [vp, md, i, lw, vp, vp, vp,
                                            ctypes.c_uint]),
        "stof_preload": (i, [vp, i, ctypes.POINTER(i)]),
    }
    for name, (res, args) in layer_sigs.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = res
            fn.argtypes = args
    _lib = lib
    return lib


def _json_out(fn, handle):
    need = ctypes.c_size_t(0)
    st = fn(handle, None, 0, ctypes.byref(need))
    if st not in (0, _STATUS_BUFFER_TOO_SMALL):
        raise StofError(st, "describe failed: %s" % _status_str(st))
    buf = ctypes.create_string_buffer(need.value + 1)
    st = fn(handle, buf, need.value + 1, None)
    if st != 0:
        raise StofError(st, "describe failed: %s" % _status_str(st))
    return json.loads(buf.value.decode())


def _status_str(st):
    try:
        return _load().stof_status_str(st).decode()
    except Exception:
        return "status %d" % st


def _dtype_code(dtype):
    """stof_dtype from a torch dtype, "fp16"/"bf16" or the enum value."""
    if isinstance(dtype, bool):
        raise TypeError("dtype must be a torch dtype, \"fp16\"/\"bf16\" or 0/1, "
                        "not a bool")
    if isinstance(dtype, int):
        if dtype not in (0, 1):
            raise ValueError("dtype must be 0 (fp16) or 1 (bf16)")
        return dtype
    if isinstance(dtype, str):
        codes = {"fp16": 0, "float16": 0, "half": 0, "bf16": 1, "bfloat16": 1}
        if dtype.lower() not in codes:
            raise ValueError("dtype must be fp16 or bf16, not %r" % dtype)
        return codes[dtype.lower()]
    torch = _torch()
    if dtype == torch.float16:
        return 0
    if dtype == torch.bfloat16:
        return 1
    raise ValueError("dtype must be torch.float16 or torch.bfloat16, not %s" % dtype)


def _enum_code(value, table, what):
    if isinstance(value, int) and not isinstance(value, bool):
        if value not in table.values():
            raise ValueError("bad %s %d" % (what, value))
        return value
    key = str(value).lower()
    if key not in table:
        raise ValueError("%s must be one of %s, not %r" % (what, sorted(table), value))
    return table[key]


def _adopt(ctx, obj):
    """Register obj with the context it was made from (Context.close frees
    it first); a stand-in context (tests) has no registry."""
    reg = getattr(ctx, "_adopt", None)
    if reg is not None:
        reg(obj)


def _stream_handle(stream, device=None):
    """A cudaStream_t as an int: torch's current stream (of `device`, else
    the current device) when None, a torch.cuda.Stream / ExternalStream, or
    a raw handle (int)."""
    if stream is None:
        torch = _torch()
        return torch.cuda.current_stream(device).cuda_stream
    if isinstance(stream, int):
        return _c_int(stream, "stream", _C_PTR)
    return stream.cuda_stream


class Context:
    """A stof context on one CUDA device (default: torch's current one).

    Opening one needs a GPU unless require_device=False: without a GPU (or
    without PyTorch) Context(require_device=False) opens a context whose
    masks, mask families, mask pictures and tuning database work on the
    host (plans and runs need the GPU):

        ctx = stof.Context(require_device=False)
        png = ctx.mask("causal", 1024, 1024).to_png()

    After close() every method raises StofError("stof: the context is
    closed"), as do the objects made from it."""

    def __init__(self, device=None, require_device=True, user_db=None,
                 system_dbs=(), tuning_mode=None, budget_s=0.0, log=None,
                 log_level="info"):
        """user_db: tuning database path (None: the default location, "":
        none); system_dbs: read-only databases under it; tuning_mode:
        "default" (tune misses), "cache-only" (never tune; record misses) or
        "force" (always re-tune); None: $STOF_TUNING_MODE, else "default";
        budget_s: tuning budget per problem. log: None ($STOF_LOG then
        sends messages to stderr), or a callable log(level, message) that
        receives the library's messages up to log_level ("error", "warn",
        "info", "debug"): a cold plan's progress (candidates ranked,
        compiled, each timed, the winner) comes at "info".
        require_device: True (the default) fails without a usable GPU;
        False opens a context for the host-side calls (masks, mask
        families, pictures, the tuning database) whatever the machine."""
        lib = _load()
        s = _Settings()
        lib.stof_default_settings(ctypes.byref(s))
        if device is None:
            try:
                torch = _torch()
                device = torch.cuda.current_device() if torch.cuda.is_available() else 0
            except ImportError:
                device = 0
        device = _c_int(device, "device")
        s.device = device
        self._device = device
        # What was made from this context (masks, families, plans, layers):
        # close() frees them first (the library needs them gone, and a
        # plan freed after its context would read freed memory).
        self._children = weakref.WeakSet()
        s.require_device = 1 if require_device else 0
        modes = {"default": 0, "cache-only": 1, "force": 2}
        if tuning_mode is not None:  # None: the library's ($STOF_TUNING_MODE)
            if tuning_mode not in modes:
                raise ValueError("tuning_mode must be one of %s"
                                 % sorted(modes))
            s.tuning_mode = modes[tuning_mode]
        s.tuning_budget_s = float(budget_s)
        self._log_cb = None  # the C callback lives as long as the context
        if log is not None:
            if not callable(log):
                raise TypeError("log must be a callable log(level, message)")
            if log_level not in _LOG_LEVELS:
                raise ValueError("log_level must be one of %s"
                                 % sorted(_LOG_LEVELS, key=_LOG_LEVELS.get))
            names = {v: k for k, v in _LOG_LEVELS.items()}

            def forward(user, level, msg):
                log(names.get(level, str(level)),
                    msg.decode(errors="replace") if msg else "")
            self._log_cb = _LOG_FN(forward)
            s.log_fn = ctypes.cast(self._log_cb, ctypes.c_void_p)
            s.log_level = _LOG_LEVELS[log_level]
        # Keep the encoded strings alive for the duration of stof_open.
        self._db_bytes = _c_str(user_db, "user_db") if user_db is not None else None
        s.user_db = self._db_bytes
        sys_list = [_c_str(p, "system_dbs[%d]" % i) for i, p in enumerate(system_dbs)]
        arr = (ctypes.c_char_p * (len(sys_list) + 1))(*sys_list, None)
        s.system_dbs = ctypes.cast(arr, ctypes.c_void_p) if sys_list else None
        self._h = ctypes.c_void_p()
        st = lib.stof_open(ctypes.byref(self._h), ctypes.byref(s))
        if st != 0:
            msg = lib.stof_errmsg(self._h).decode()
            lib.stof_close(ctypes.byref(self._h))
            raise StofError(st, msg)
        self._lib = lib

    def _live(self):
        """The context's handle; raises StofError once it is closed."""
        h = getattr(self, "_h", None)
        if not h:
            raise StofError(_STATUS_INVALID, "stof: the context is closed")
        return h

    def _check(self, st):
        if st != 0:
            raise StofError(st, self._lib.stof_errmsg(self._h).decode())

    def _adopt(self, obj):
        self._children.add(obj)
        return obj

    def _check_device(self, **tensors):
        """Each tensor a CUDA tensor on this context's device: the library
        launches there, on that device's stream, with their pointers."""
        for name, t in tensors.items():
            if t is None:
                continue
            if not getattr(t, "is_cuda", False):
                raise ValueError("%s must be a CUDA tensor" % name)
            idx = t.device.index
            if idx is None:
                idx = _torch().cuda.current_device()
            if idx != self._device:
                raise ValueError("%s is on cuda:%d; this context (and its plans) "
                                 "is on cuda:%d" % (name, idx, self._device))

    def close(self):
        """Free everything made from this context (after waiting for the
        device: runs may still be in flight), then the context. Objects made
        from it raise on use afterwards."""
        if not getattr(self, "_h", None):
            return
        kids = list(getattr(self, "_children", ()))
        if kids:
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_initialized():
                torch.cuda.synchronize(self._device)
            # plans and layers before the masks and families they use
            kids.sort(key=lambda o: isinstance(o, (Mask, MaskFamily)))
            for o in kids:
                try:
                    o._release()
                except Exception:
                    pass
        self._lib.stof_close(ctypes.byref(self._h))

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def device(self):
        """The device's description (stof_device_describe) as a dict."""
        return _json_out(self._lib.stof_device_describe, self._live())

    def preload(self, max_modules=0):
        """Load the kernels the tuning databases hold for this GPU into the
        context, most used first (at most max_modules; 0: as many as its
        cache holds, 256), so that later plans from the database load no
        module: for a server, once after opening, before traffic. Returns
        how many modules it loaded."""
        h = self._live()
        fn = getattr(self._lib, "stof_preload", None)
        if fn is None:
            raise StofError(6, "this libstof has no stof_preload")
        max_modules = _c_int(max_modules, "max_modules", (0, 2 ** 31 - 1, "a C int >= 0"))
        n = ctypes.c_int(0)
        self._check(fn(h, max_modules, ctypes.byref(n)))
        return n.value

    def mask(self, spec, seq_q, seq_k):
        """A mask from a spec string (a str; see stof.h for the grammar)."""
        ch = self._live()
        spec_b = _c_str(spec, "spec")
        seq_q, seq_k = _c_int(seq_q, "seq_q"), _c_int(seq_k, "seq_k")
        h = ctypes.c_void_p()
        self._check(self._lib.stof_mask_from_spec(ch, spec_b, seq_q, seq_k,
                                                  ctypes.byref(h)))
        return Mask(self, h)

    def mask_from_dense(self, t):
        """A mask from a 2-D bool/uint8 tensor or numpy array (nonzero =
        allowed). A CUDA tensor is packed to bits on its GPU in bounded
        chunks (pack_bits), so an eighth of it crosses to the host."""
        self._live()
        import numpy as np
        if hasattr(t, "detach") and getattr(t, "is_cuda", False):
            if t.dim() != 2:
                raise ValueError("mask_from_dense: a 2-D (seq_q, seq_k) tensor, not "
                                 "%d-D %s" % (t.dim(), tuple(t.shape)))
            return self.mask_from_bits(pack_bits(t).cpu().numpy(), t.shape[1])
        a = t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)
        if a.ndim != 2:
            raise ValueError("mask_from_dense: a 2-D (seq_q, seq_k) array, not "
                             "%d-D %s" % (a.ndim, a.shape))
        return self.mask_from_bits(np.packbits(a != 0, axis=1, bitorder="little"),
                                   a.shape[1])

    def mask_from_bits(self, bits, seq_k):
        """A mask of seq_k keys from packed rows (stof_mask_from_bits): a 2-D
        uint8 numpy array (or CPU tensor) of shape (seq_q, >= ceil(seq_k/8)),
        key k of row q being bit k % 8, least significant first, of byte
        [q, k // 8]: numpy's packbits(m, axis=1, bitorder="little"), or
        stof.pack_bits(m) on a GPU."""
        ch = self._live()
        import numpy as np
        a = bits.detach().cpu().numpy() if hasattr(bits, "detach") else np.asarray(bits)
        if a.ndim != 2 or a.dtype != np.uint8:
            raise ValueError("mask_from_bits: a 2-D uint8 array of packed rows, not "
                             "%d-D %s" % (a.ndim, a.dtype))
        a = np.ascontiguousarray(a)
        rows = _c_int(a.shape[0], "the mask's rows")
        cols = _c_int(seq_k, "the mask's columns")
        h = ctypes.c_void_p()
        self._check(self._lib.stof_mask_from_bits(ch, a.ctypes.data, a.shape[1], rows,
                                                  cols, ctypes.byref(h)))
        return Mask(self, h)

    def attention_plan(self, q, k, v, mask, scale=0.0, out=None, softcap=0.0,
                       alibi_slopes=None, bias=None):
        """Plan attention for tensors shaped (batch, heads, seq, head_dim).
        softcap: 0 = none; > 0: every score s becomes softcap * tanh(s /
        softcap). alibi_slopes: None, or one float per query head (e.g.
        stof.alibi_slopes(heads)): head h's scores get slope[h] * (k - q).
        bias: None, or an additive bias added to every score (after the
        soft-cap and ALiBi; -inf masks a key, as does a bf16 value near
        torch.finfo(torch.bfloat16).min, which overflows once scaled): a CUDA tensor of q's dtype
        whose shape broadcasts to (batch, heads, seq_q, seq_k), e.g. (1,
        heads, seq_q, seq_k) or (batch, 1, seq_q, seq_k) or (seq_q, seq_k);
        the key dimension contiguous, the other strides multiples of 8
        (stof.pad_bias). Instead of a tensor: its shape (contiguous) or a
        pair (shape, strides). Every run then takes a bias tensor of that
        shape and those strides (Plan.run(bias=...))."""
        self._live()
        d, strides = self._desc(q, k, v, scale, out)
        slopes = _score_mods(d, softcap, alibi_slopes, q.shape[1])
        layout = self._bias(d, bias, q, k.shape[2])
        h = ctypes.c_void_p()
        self._check(self._lib.stof_attention_plan(self._h, ctypes.byref(d), mask._live(),
                                                  ctypes.byref(h)))
        del slopes  # copied by the plan
        return Plan(self, h, tuple(q.shape), tuple(k.shape), q.dtype, strides, layout)

    def _bias(self, d, bias, q, seq_k):
        """_set_bias, where the library has stof_attention_run_ex."""
        if bias is not None and not hasattr(self._lib, "stof_attention_run_ex"):
            raise StofError(_STATUS_UNSUPPORTED, "this libstof has no additive bias "
                            "(stof_attention_run_ex)")
        return _set_bias(d, bias, q, seq_k)

    def _desc(self, q, k, v, scale, out):
        torch = _torch()
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise ValueError("q, k, v must be 4-D (batch, heads, seq, head_dim)")
        self._check_device(q=q, k=k, v=v, out=out)
        if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
            raise ValueError("q, k, v must all be float16 or all bfloat16")
        if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] \
                or k.shape[1] < 1 or q.shape[1] % k.shape[1]:
            raise ValueError("shapes do not match: q %s, k %s, v %s (k and v may have "
                             "fewer heads than q, dividing them: grouped-query attention)"
                             % (tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        o = out if out is not None else q
        d = _Desc()
        d.batch, d.heads, d.seq_q, d.head_dim = (
            _c_int(n, "q's " + what) for n, what in zip(q.shape, _BHSD))
        d.seq_k = _c_int(k.shape[2], "k's seq")
        d.kv_heads = _c_int(k.shape[1], "k's heads") if k.shape[1] != q.shape[1] else 0
        d.dtype = 0 if q.dtype == torch.float16 else 1
        d.scale = float(scale)
        d.layout = 2
        for name, t in (("q_stride", q), ("k_stride", k), ("v_stride", v), ("o_stride", o)):
            if t.stride(3) != 1:
                raise ValueError("the last dimension must be contiguous")
            arr = getattr(d, name)
            for i in range(3):
                arr[i] = _c_int(t.stride(i), name, _C_INT64, (i,))
        return d, tuple(tuple(t.stride()) for t in (q, k, v, o))

    def mask_family(self, spec):
        """A mask family (stof_mask_family_create): a spec whose instances
        take per-sequence data on every run (lengths, query offsets,
        prefixes, document ids). spec: a str."""
        ch = self._live()
        if not hasattr(self._lib, "stof_mask_family_create"):
            raise StofError(_STATUS_UNSUPPORTED, "this libstof has no mask families")
        spec_b = _c_str(spec, "spec")
        h = ctypes.c_void_p()
        self._check(self._lib.stof_mask_family_create(ch, spec_b, ctypes.byref(h)))
        return MaskFamily(self, h)

    def attention_plan_family(self, q, k, v, family, sample=None, scale=0.0,
                              out=None, softcap=0.0, alibi_slopes=None, bias=None):
        """Plan attention over a mask family for tensors shaped (batch,
        heads, seq, head_dim): the largest batch and lengths. sample: a dict
        of host per-sequence data (q_len, k_len, q_offset, prefix: lists;
        doc_id: (batch, seq_k)) that the kernel is chosen on (sequence 0);
        None = the default instance. Runs take their own instance data
        (FamilyPlan.run). softcap, alibi_slopes, bias: score modifiers, as
        for attention_plan (runs then take bias=...)."""
        self._live()
        if not isinstance(family, MaskFamily):
            raise TypeError("family must be a stof.MaskFamily (Context.mask_family)")
        d, strides = self._desc(q, k, v, scale, out)
        slopes = _score_mods(d, softcap, alibi_slopes, q.shape[1])
        layout = self._bias(d, bias, q, k.shape[2])
        keep = []
        md = _mask_data(sample or {}, None, q.shape[0], k.shape[2], keep,
                        heads=q.shape[1], seq_q=q.shape[2])
        h = ctypes.c_void_p()
        self._check(self._lib.stof_attention_plan_family(
            self._h, ctypes.byref(d), family._live(),
            ctypes.byref(md) if sample else None, ctypes.byref(h)))
        del slopes  # copied by the plan
        return FamilyPlan(self, h, tuple(q.shape), tuple(k.shape), q.dtype, strides,
                          layout)

    def attention_plan_packed(self, q, k, v, family, cu_seqlens_q,
                              cu_seqlens_k=None, scale=0.0, out=None, softcap=0.0,
                              alibi_slopes=None, bias=None, **sample):
        """Plan attention over a mask family for packed sequences (the
        layout of flash-attn's varlen functions): q and out (total_q, heads,
        head_dim), k and v (total_k, heads, head_dim), the most rows any run
        will have; sequence b at rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1]
        - 1 (keys: cu_seqlens_k, default cu_seqlens_q). The offsets given
        here (host lists or tensors, batch + 1 each) and **sample (host
        per-sequence data: q_offset, prefix, seed; doc_id per packed key)
        are the instance the kernel is chosen on. Runs take their own
        offsets (PackedPlan.run). softcap, alibi_slopes: as for
        attention_plan (the library refuses ALiBi with the packed layout).
        bias: must be None (no additive bias with the packed layout)."""
        self._live()
        if bias is not None:
            raise ValueError("bias: an additive bias is not supported with the packed "
                             "layout; use attention_plan_family with (batch, heads, "
                             "seq, head_dim) tensors")
        torch = _torch()
        if not isinstance(family, MaskFamily):
            raise TypeError("family must be a stof.MaskFamily (Context.mask_family)")
        if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
            raise ValueError("q, k, v must be 3-D (total, heads, head_dim)")
        if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
            raise ValueError("q, k, v must all be float16 or all bfloat16")
        if k.shape != v.shape or q.shape[2] != k.shape[2] or k.shape[1] < 1 or \
                q.shape[1] % k.shape[1]:
            raise ValueError("shapes do not match: q %s, k %s, v %s (k and v may have "
                             "fewer heads than q, dividing them)"
                             % (tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        cu_q = _flat_ints(cu_seqlens_q, "cu_seqlens_q")
        batch = len(cu_q) - 1
        if batch < 1:
            raise ValueError("cu_seqlens_q needs at least 2 offsets")
        o = out if out is not None else q
        self._check_device(q=q, k=k, v=v, out=out)
        d = _Desc()
        d.batch = _c_int(batch, "the batch (len(cu_seqlens_q) - 1)")
        d.heads, d.head_dim = _c_int(q.shape[1], "q's heads"), _c_int(q.shape[2],
                                                                      "q's head_dim")
        d.seq_q, d.seq_k = _c_int(q.shape[0], "q's rows"), _c_int(k.shape[0], "k's rows")
        d.kv_heads = _c_int(k.shape[1], "k's heads") if k.shape[1] != q.shape[1] else 0
        d.dtype = 0 if q.dtype == torch.float16 else 1
        d.scale = float(scale)
        d.layout = 3
        slopes = _score_mods(d, softcap, alibi_slopes, q.shape[1])
        for name, t in (("q_stride", q), ("k_stride", k), ("v_stride", v), ("o_stride", o)):
            if t.stride(2) != 1:
                raise ValueError("the last dimension must be contiguous")
            arr = getattr(d, name)
            arr[0] = 0
            arr[1] = _c_int(t.stride(1), name, _C_INT64, (1,))
            arr[2] = _c_int(t.stride(0), name, _C_INT64, (2,))
        fields = dict(sample)
        fields["cu_seqlens_q"] = cu_q
        if cu_seqlens_k is not None:
            fields["cu_seqlens_k"] = cu_seqlens_k
        cu_k = _flat_ints(cu_seqlens_k, "cu_seqlens_k") if cu_seqlens_k is not None \
            else cu_q
        keep = []
        md = _mask_data(fields, None, batch, cu_k[-1] if cu_k else 0, keep, packed=True,
                        heads=q.shape[1])
        h = ctypes.c_void_p()
        self._check(self._lib.stof_attention_plan_family(
            self._h, ctypes.byref(d), family._live(), ctypes.byref(md), ctypes.byref(h)))
        del slopes  # copied by the plan
        # Every stride is the plan's (a row stride too: a slice of a packed
        # qkv tensor has its own).
        strides = tuple(tuple(t.stride()) for t in (q, k, v, o))
        return PackedPlan(self, h, tuple(q.shape), tuple(k.shape), q.dtype, strides,
                          batch)

    def layer_plan(self, batch, seq, hidden, heads, ffn, dtype, act, norm,
                   pre_norm, mask, eps=0.0, sample=None, kv_heads=0, bias=True,
                   gated=False, rope_theta=0.0, rope_dim=0, rope_freq=None,
                   rope_scale=0.0, qk_norm=False, head_dim=0):
        """Plan one Transformer layer (stof_layer_plan): the warm-up, which
        loads from the tuning database or tunes. dtype: torch.float16 /
        torch.bfloat16 (or "fp16"/"bf16"); act: "gelu_tanh", "gelu_erf",
        "relu", "silu" or "none"; norm: "layer" or "rms"; pre_norm: False for
        post-norm (BERT), True for pre-norm (GPT-2, ViT); mask: a seq x seq
        Mask, or a MaskFamily (stof_layer_plan_family: every run then takes
        its own instance, e.g. the batch's lengths, and nothing is planned
        again; sample: host instance data as for attention_plan_family);
        eps: the norm's epsilon (0: 1e-5); kv_heads: grouped-query attention,
        K/V heads dividing heads (0 = heads): w_qkv then has heads *
        head_dim + 2 * kv_heads * head_dim rows, Q's, then K's, then V's; bias:
        False for layers whose projections have no biases (Llama-style):
        the weights then leave b_qkv, b_o, b_ffn1 and b_ffn2 out; gated: a
        gated FFN (act="silu": SwiGLU as in Llama, a GELU: GeGLU): w_ffn1 is
        (2 ffn, hidden), the gate's rows then the up projection's
        (torch.cat([gate_proj.weight, up_proj.weight])), b_ffn1 (2 ffn,),
        and the FFN is w_ffn2 (act(gate) * up); rope_theta: rotary position
        embeddings on Q and K in Hugging Face's rotate-half form (Llama,
        Mistral, GPT-NeoX), 0 for none, else the base (config.rope_theta:
        10000 for Llama 2, 500000 for Llama 3; finite and > 1): the token at
        position p of its sequence rotates the channel pairs (i, i +
        rope_dim / 2) of each Q and K head by p * rope_theta ** (-2 i /
        rope_dim), on the projection plus its bias (before its rounding to
        dtype where the QKV GEMM fuses it, as the Hopper template does;
        else on the rounded projection); V is not rotated. Positions count
        from 0 in every sequence of the batch. w_qkv keeps the layout above,
        q_proj's, k_proj's and v_proj's weights stacked as they are (no
        permutation); rope_dim: the channels of each head that rotate, the
        first rope_dim (GPT-NeoX's partial rotary: int(head_dim *
        config.partial_rotary_factor)), 0 for all of them; a multiple of 4
        up to head_dim, only with RoPE; rope_freq: instead of rope_theta
        (then 0), the frequencies themselves, rope_dim / 2 (head_dim / 2
        for rope_dim 0) finite numbers >= 0 (a sequence or a tensor), pair
        i rotating by p * rope_freq[i] in fp32: Hugging Face's scaled rope
        types (llama3, linear, yarn, longrope, dynamic), whose inv_freq
        these are; rope_scale: cos and sin multiplied by it (Hugging Face's
        attention_scaling: yarn, longrope), 0 for 1. rope_args(config, seq)
        gives all four from a Hugging Face configuration. qk_norm: Q and K
        normalised per head (Qwen3's q_norm and k_norm: RMSNorm over each
        head's head_dim values with eps, one weight of head_dim for Q's
        heads and one for K's, which multiplies; for a norm multiplying
        by 1 + weight pass 1 + weight) before RoPE; w_qkv is then the
        flat buffer of the stacked projections followed by the two weights
        (qkv_weight(q, k, v, q_norm, k_norm) makes it). head_dim: 0 for
        hidden // heads, else each head's size when heads * head_dim is not
        hidden (Qwen3 0.6B and 4B: config.head_dim): w_qkv then
        has heads * head_dim + 2 * kv_heads * head_dim rows and w_o is
        (hidden, heads * head_dim)."""
        self._live()
        if not hasattr(self._lib, "stof_layer_plan"):
            raise StofError(_STATUS_UNSUPPORTED,
                            "this libstof has no layer API (stof_layer_plan)")
        family = isinstance(mask, MaskFamily)
        if family and not hasattr(self._lib, "stof_layer_plan_family"):
            raise StofError(_STATUS_UNSUPPORTED,
                            "this libstof has no family layers (stof_layer_plan_family)")
        if not family and not isinstance(mask, Mask):
            raise TypeError("mask must be a stof.Mask (Context.mask) or a "
                            "stof.MaskFamily (Context.mask_family)")
        if sample is not None and not family:
            raise ValueError("sample is for a MaskFamily")
        d = _LayerDesc()
        d.batch, d.seq, d.hidden, d.heads, d.ffn = (
            _c_int(batch, "batch"), _c_int(seq, "seq"), _c_int(hidden, "hidden"),
            _c_int(heads, "heads"), _c_int(ffn, "ffn"))
        d.dtype = _dtype_code(dtype)
        d.act = _enum_code(act, _ACTS, "act")
        d.norm = _enum_code(norm, _NORMS, "norm")
        d.pre_norm = 1 if pre_norm else 0
        d.norm_eps = float(eps)
        d.kv_heads = _c_int(kv_heads, "kv_heads")
        d.no_bias = 0 if bias else 1
        d.gated = 1 if gated else 0
        d.qk_norm = 1 if qk_norm else 0
        d.head_dim = _c_int(head_dim, "head_dim")
        d.rope_theta = _c_float(rope_theta, "rope_theta")
        d.rope_dim = _c_int(rope_dim, "rope_dim")
        d.rope_scale = _c_float(rope_scale, "rope_scale")
        freq = None
        if rope_freq is not None:
            # (the library reads rope_dim / 2 of them: exactly that many)
            if hasattr(rope_freq, "detach"):  # (a tensor)
                rope_freq = (rope_freq.detach().float().cpu().reshape(-1)
                             .tolist())
            elif hasattr(rope_freq, "reshape") and hasattr(rope_freq, "tolist"):
                rope_freq = rope_freq.reshape(-1).tolist()  # (an array)
            vals = [_c_float(v, "rope_freq[%d]" % i)
                    for i, v in enumerate(rope_freq)]
            hd = (d.head_dim if d.head_dim > 0
                  else d.hidden // d.heads if d.heads > 0 else 0)
            want = (d.rope_dim if d.rope_dim > 0 else hd) // 2
            if len(vals) != want:
                raise ValueError("rope_freq has %d values; rope_dim %d of "
                                 "heads of %d rotates %d pairs"
                                 % (len(vals), d.rope_dim, hd, want))
            freq = (ctypes.c_float * max(len(vals), 1))(*vals)
            d.rope_freq = ctypes.cast(freq, ctypes.POINTER(ctypes.c_float))
        h = ctypes.c_void_p()
        if family:
            keep = []
            md = _mask_data(sample or {}, None, d.batch, d.seq, keep, heads=d.heads,
                            seq_q=d.seq)
            self._check(self._lib.stof_layer_plan_family(
                self._h, ctypes.byref(d), mask._live(),
                ctypes.byref(md) if sample else None, ctypes.byref(h)))
        else:
            self._check(self._lib.stof_layer_plan(self._h, ctypes.byref(d), mask._live(),
                                                  ctypes.byref(h)))
        rf = tuple(freq[:len(freq)]) if freq is not None else None
        d.rope_freq = None  # (read by the plan, not kept)
        return Layer(self, h, d, mask, rope_freq=rf)


class Mask:
    def __init__(self, ctx, h):
        self._ctx, self._h = ctx, h
        _adopt(ctx, self)

    def _release(self):
        if self._h:
            self._ctx._lib.stof_mask_free(ctypes.byref(self._h))

    def _live(self):
        if not self._h:
            raise StofError(_STATUS_INVALID, "the mask was freed (its context "
                            "is closed)")
        return self._h

    @property
    def shape(self):
        lib = self._ctx._lib
        return (lib.stof_mask_seq_q(self._live()), lib.stof_mask_seq_k(self._h))

    @property
    def density(self):
        return self._ctx._lib.stof_mask_density(self._live())

    def digest(self):
        buf = ctypes.create_string_buffer(33)
        self._ctx._lib.stof_mask_digest(self._live(), None, buf)
        return buf.value.decode()

    def to_dense(self):
        """A (seq_q, seq_k) torch.bool tensor on the CPU."""
        torch = _torch()
        sq, sk = self.shape
        t = torch.empty((sq, sk), dtype=torch.uint8)
        self._ctx._lib.stof_mask_to_dense(self._live(), ctypes.c_void_p(t.data_ptr()))
        return t.bool()

    def to_png(self, block_m=128, block_n=128, max_side=1024):
        """The mask's picture as PNG bytes (stof_mask_png): keys left to
        right, queries top to bottom, block_m x block_n tiles coloured as the
        kernels see them (full blue, partial orange, empty white), at most
        max_side pixels a side (0 for block_m or block_n: 128). Needs no
        PyTorch."""
        lib = self._ctx._lib
        h = self._live()
        if not hasattr(lib, "stof_mask_png"):
            raise StofError(_STATUS_UNSUPPORTED, "this libstof has no stof_mask_png")
        block_m, block_n = _c_int(block_m, "block_m"), _c_int(block_n, "block_n")
        max_side = _c_int(max_side, "max_side")
        need = ctypes.c_size_t()
        st = lib.stof_mask_png(self._ctx._live(), h, block_m, block_n, max_side,
                               None, 0, ctypes.byref(need))
        if st != _STATUS_BUFFER_TOO_SMALL:
            self._ctx._check(st)
        buf = ctypes.create_string_buffer(need.value)
        self._ctx._check(lib.stof_mask_png(self._ctx._h, self._h, block_m, block_n,
                                           max_side, buf, need, ctypes.byref(need)))
        return buf.raw[:need.value]

    def to_image(self, path=None, block_m=128, block_n=128, max_side=1024):
        """The picture of to_png: written to `path` (returns path), else a
        PIL.Image when Pillow is installed, else the PNG bytes."""
        png = self.to_png(block_m, block_n, max_side)
        if path is not None:
            with open(path, "wb") as f:
                f.write(png)
            return path
        try:
            import io
            from PIL import Image
        except ImportError:
            return png
        return Image.open(io.BytesIO(png))

    def __del__(self):
        try:
            self._release()
        except Exception:
            pass


class MaskFamily:
    def __init__(self, ctx, h):
        self._ctx, self._h = ctx, h
        _adopt(ctx, self)

    def _release(self):
        if self._h:
            self._ctx._lib.stof_mask_family_free(ctypes.byref(self._h))

    def _live(self):
        if not self._h:
            raise StofError(_STATUS_INVALID, "the mask family was freed (its "
                            "context is closed)")
        return self._h

    @property
    def spec(self):
        """The canonical spec."""
        return self._ctx._lib.stof_mask_family_spec(self._live()).decode()

    def mask(self, seq_q, seq_k, b=0, head=0, **fields):
        """The seq_q x seq_k Mask of sequence b (and, for head_* leaves, head
        `head`) of an instance given as host per-sequence data (q_len=[...],
        doc_id=..., head_window=[...], ...)."""
        fh = self._live()
        seq_q, seq_k = _c_int(seq_q, "seq_q"), _c_int(seq_k, "seq_k")
        b, head = _c_int(b, "b"), _c_int(head, "head")
        batch = b + 1
        for name, val in fields.items():
            if val is not None and name not in ("doc_id", "head_window", "bitmap",
                                                "cu_seqlens_q", "cu_seqlens_k"):
                batch = max(batch, len(val))
        keep = []
        if head < 0:
            raise ValueError("head must be >= 0")
        hw = fields.get("head_window")
        if hw is not None and len(_flat_ints(hw, "head_window")) <= head:
            raise ValueError("head_window has %d entries; head %d reads entry %d"
                             % (len(_flat_ints(hw, "head_window")), head, head))
        md = _mask_data(fields, None, batch, seq_k, keep, seq_q=seq_q)
        md.head = head
        h = ctypes.c_void_p()
        self._ctx._check(self._ctx._lib.stof_mask_family_eval(
            self._ctx._live(), fh, seq_q, seq_k, ctypes.byref(md), b,
            ctypes.byref(h)))
        return Mask(self._ctx, h)

    def __del__(self):
        try:
            self._release()
        except Exception:
            pass


class Plan:
    def __init__(self, ctx, h, qshape, kshape, dtype, strides, bias=None):
        self._ctx, self._h = ctx, h
        _adopt(ctx, self)
        self._qshape, self._kshape, self._dtype = qshape, kshape, dtype
        self._strides = strides
        self._bias = bias  # _bias_layout of the plan's bias, None: none

    @property
    def has_bias(self):
        """Whether the plan was made with an additive bias (runs take one)."""
        return self._bias is not None

    def describe(self):
        """The plan as JSON (kernel, source, times: stof_plan_describe)."""
        if not self._h:
            raise StofError(_STATUS_INVALID, "the plan was freed (its context "
                            "is closed)")
        return _json_out(self._ctx._lib.stof_plan_describe, self._h)

    def _check_tensors(self, q, k, v, out, stream):
        torch = _torch()
        if not self._h:
            raise StofError(_STATUS_INVALID, "the plan was freed (its context "
                            "is closed)")
        if tuple(q.shape) != self._qshape or tuple(k.shape) != self._kshape or \
                tuple(v.shape) != self._kshape or tuple(out.shape) != self._qshape:
            raise ValueError("tensor shapes differ from the plan's")
        if tuple(tuple(t.stride()) for t in (q, k, v, out)) != self._strides:
            raise ValueError("tensor strides differ from the plan's")
        if any(t.dtype != self._dtype or not t.is_cuda for t in (q, k, v, out)):
            raise ValueError("tensors must be CUDA tensors of the plan's dtype")
        self._ctx._check_device(q=q, k=k, v=v, out=out)
        _check_out_strides(out)
        if stream is None:
            stream = torch.cuda.current_stream(q.device)
        return ctypes.c_void_p(stream.cuda_stream)

    def _bias_ptr(self, bias, q):
        """The device pointer of a run's bias, checked against the plan's."""
        if self._bias is None:
            raise ValueError("bias given to a plan made without one (make the plan "
                             "with attention_plan(..., bias=...))")
        if bias is None:
            raise ValueError("this plan was made with an additive bias: every run "
                             "takes one (run(..., bias=tensor))")
        if not hasattr(bias, "data_ptr") or not bias.is_cuda:
            raise ValueError("bias must be a CUDA tensor")
        if bias.dtype != self._dtype or bias.device != q.device:
            raise ValueError("bias is %s on %s; the plan's tensors are %s on %s"
                             % (bias.dtype, bias.device, self._dtype, q.device))
        size = self._qshape[:3] + self._kshape[2:3]
        layout = _bias_layout(tuple(bias.shape), tuple(bias.stride()), size)
        if layout != self._bias:
            raise ValueError("bias of shape %s and strides %s differs from the plan's "
                             "(shape %s, bias_stride %s)"
                             % (tuple(bias.shape), tuple(bias.stride()), self._bias[0],
                                self._bias[1]))
        if bias.data_ptr() % 16:
            raise ValueError("bias must be 16-byte aligned")
        return bias.data_ptr()

    def _run_ex(self, s, q, k, v, out, md, lse, bias, lse_n, flags=0):
        """stof_attention_run_ex (plans with a bias, runs with flags)."""
        a = _RunArgs()
        a.q, a.k, a.v, a.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
        if self._bias is not None or bias is not None:
            a.bias = self._bias_ptr(bias, q)
        a.flags = flags
        if md is not None:
            a.data = ctypes.pointer(md)
        if lse is not None:
            a.lse = _lse_ptr(lse, lse_n)
        st = self._ctx._lib.stof_attention_run_ex(self._h, ctypes.byref(a), s)
        if st != 0:
            raise StofError(st, self._ctx._lib.stof_plan_errmsg(self._h).decode())
        return out

    def _launch(self, q, k, v, out, s):
        """stof_attention_run without run()'s checks: q, k, v, out already
        known to match the plan (stof.ops keys its plans by exactly what
        run() checks); s: the stream handle (ctypes or int)."""
        st = self._ctx._lib.stof_attention_run(
            self._h, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), s)
        if st != 0:
            raise StofError(st, self._ctx._lib.stof_plan_errmsg(self._h).decode())
        return out

    def run(self, q, k, v, out, stream=None, lse=None, bias=None):
        """Enqueue on `stream` (a torch.cuda.Stream; default: the current one).
        The tensors must have the strides the plan was made with. lse: None,
        or a float32 CUDA tensor of (batch, heads, seq_q) that receives each
        row's log-sum-exp (-inf for rows with no key). bias: for plans made
        with one (and only for them), the bias tensor: the plan's dtype,
        shape (up to leading 1s) and strides (stof_attention_run_ex)."""
        s = self._check_tensors(q, k, v, out, stream)
        if self._bias is not None or bias is not None:
            return self._run_ex(s, q, k, v, out, None, lse, bias,
                                self._qshape[0] * self._qshape[1] * self._qshape[2])
        if lse is None:
            return self._launch(q, k, v, out, s)
        st = self._ctx._lib.stof_attention_run_lse(
            self._h, None, q.data_ptr(), k.data_ptr(), v.data_ptr(),
            out.data_ptr(), _lse_ptr(lse, self._qshape[0] * self._qshape[1] *
                                     self._qshape[2]), s)
        if st != 0:
            raise StofError(st, self._ctx._lib.stof_plan_errmsg(self._h).decode())
        return out

    def _release(self):
        if self._h:
            self._ctx._lib.stof_plan_free(ctypes.byref(self._h))

    def __del__(self):
        try:
            self._release()
        except Exception:
            pass


class FamilyPlan(Plan):
    """Attention over a mask family (Context.attention_plan_family)."""

    def run(self, q, k, v, out, stream=None, lse=None, bias=None, same_data=False,
            **instance):
        """Enqueue with this call's instance data: int32 CUDA tensors q_len,
        k_len, q_offset, prefix of shape (batch,), doc_id of shape (batch,
        seq_k) (or flat); missing = the default. The formats are built on
        the GPU on the same stream; nothing is tuned or compiled. lse, bias:
        as Plan.run. same_data=True: the instance tensors are this plan's
        previous run's, unchanged since (the layers of a model sharing one
        mask): that run's format is used again, not rebuilt (where a tensor
        differs from that run's, the format is built as usual)."""
        s = self._check_tensors(q, k, v, out, stream)
        keep = []
        md = _mask_data(instance, q.device, self._qshape[0], self._kshape[2], keep,
                        heads=self._qshape[1], seq_q=self._qshape[2])
        if self._bias is not None or bias is not None or same_data:
            return self._run_ex(s, q, k, v, out, md, lse, bias,
                                self._qshape[0] * self._qshape[1] * self._qshape[2],
                                RUN_SAME_DATA if same_data else 0)
        if lse is not None:
            st = self._ctx._lib.stof_attention_run_lse(
                self._h, ctypes.byref(md), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                out.data_ptr(), _lse_ptr(lse, self._qshape[0] * self._qshape[1] *
                                         self._qshape[2]), s)
        else:
            st = self._ctx._lib.stof_attention_run_family(
                self._h, ctypes.byref(md), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                out.data_ptr(), s)
        if st != 0:
            raise StofError(st, self._ctx._lib.stof_plan_errmsg(self._h).decode())
        return out

    def _launch_family(self, q, k, v, out, md, flags, s):
        """stof_attention_run_ex without run()'s checks (stof.ops keys its
        family plans by everything run() checks, and checks the instance
        tensors itself): md a _MaskData, flags STOF_RUN_* bits, s the
        stream handle."""
        a = _RunArgs()
        a.q, a.k, a.v, a.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
        a.data = ctypes.pointer(md)
        a.flags = flags
        st = self._ctx._lib.stof_attention_run_ex(self._h, ctypes.byref(a), s)
        if st != 0:
            raise StofError(st, self._ctx._lib.stof_plan_errmsg(self._h).decode())
        return out


class PackedPlan(Plan):
    """Attention over a mask family for packed sequences
    (Context.attention_plan_packed)."""

    def __init__(self, ctx, h, qshape, kshape, dtype, strides, batch):
        super().__init__(ctx, h, qshape, kshape, dtype, strides)
        self.batch = batch

    def run(self, q, k, v, out, cu_seqlens_q, cu_seqlens_k=None, stream=None,
            lse=None, bias=None, **instance):
        """Enqueue with this call's offsets (int32 CUDA tensors of batch + 1)
        and instance data (int32 CUDA tensors: q_offset, prefix of (batch,),
        doc_id with an entry for each of k's rows; seed: int64 (batch,)). q/out may hold fewer
        rows than the plan's (at most its), k/v likewise: the kernels read
        and write only these. Rows outside every sequence are zeros. bias:
        must be None (no additive bias with the packed layout)."""
        if bias is not None:
            raise ValueError("bias: an additive bias is not supported with the packed "
                             "layout")
        torch = _torch()
        if q.dim() != 3 or k.dim() != 3 or v.dim() != 3 or out.shape != q.shape or \
                k.shape != v.shape:
            raise ValueError("q, out (total_q, heads, dim) and k, v (total_k, heads, dim)")
        if q.shape[0] > self._qshape[0] or k.shape[0] > self._kshape[0] or \
                q.shape[1:] != self._qshape[1:] or k.shape[1:] != self._kshape[1:]:
            raise ValueError("tensor shapes exceed or differ from the plan's %s, %s"
                             % (self._qshape, self._kshape))
        if tuple(tuple(t.stride()) for t in (q, k, v, out)) != self._strides:
            raise ValueError("tensor strides differ from the plan's (rows, heads "
                             "and elements)")
        if any(t.dtype != self._dtype or not t.is_cuda for t in (q, k, v, out)):
            raise ValueError("tensors must be CUDA tensors of the plan's dtype")
        if not self._h:
            raise StofError(_STATUS_INVALID, "the plan was freed (its context "
                            "is closed)")
        self._ctx._check_device(q=q, k=k, v=v, out=out)
        if stream is None:
            stream = torch.cuda.current_stream(q.device)
        fields = dict(instance)
        fields["cu_seqlens_q"] = cu_seqlens_q
        if cu_seqlens_k is not None:
            fields["cu_seqlens_k"] = cu_seqlens_k
        keep = []
        md = _mask_data(fields, q.device, self.batch, k.shape[0], keep, packed=True,
                        heads=self._qshape[1])
        md.total_q, md.total_k = q.shape[0], k.shape[0]
        if lse is not None:  # (heads, total_q)
            st = self._ctx._lib.stof_attention_run_lse(
                self._h, ctypes.byref(md), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                out.data_ptr(), _lse_ptr(lse, q.shape[1] * q.shape[0]),
                ctypes.c_void_p(stream.cuda_stream))
        else:
            st = self._ctx._lib.stof_attention_run_family(
                self._h, ctypes.byref(md), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                out.data_ptr(), ctypes.c_void_p(stream.cuda_stream))
        if st != 0:
            raise StofError(st, self._ctx._lib.stof_plan_errmsg(self._h).decode())
        return out


class Layer:
    """A planned Transformer layer (Context.layer_plan)."""

    # Graph-keyed weight arrays whose tensors stay referenced (the newest).
    _KEEP_TENSORS = 4
    # Weight arrays kept at most (the oldest go: the library reads an array
    # during the call only, stof_layer_stack_run).
    _MAX_STACKS = 64
    # Weight lists whose checks are remembered (stack_run).
    _KEEP_WEIGHTS = 4

    def __init__(self, ctx, h, desc, mask, rope_freq=None):
        self._ctx, self._h, self._mask = ctx, h, mask
        _adopt(ctx, self)
        self.batch, self.seq = desc.batch, desc.seq
        self.hidden, self.heads, self.ffn = desc.hidden, desc.heads, desc.ffn
        self.kv_heads = desc.kv_heads if desc.kv_heads > 0 else desc.heads
        self.bias = not desc.no_bias
        self.gated = bool(desc.gated)
        # RoPE: the base (0.0 without) and the channels a head that rotate
        # (head_dim for desc.rope_dim 0; 0 without RoPE), as kv_heads says
        # the heads that 0 means.
        # rope_freq: the frequencies given (a tuple), else None; rope_scale
        # 1.0 for rope_scale 0.
        self.rope_theta = float(desc.rope_theta)
        self.rope_freq = rope_freq
        self.head_dim = desc.head_dim or desc.hidden // desc.heads
        rope = bool(desc.rope_theta) or rope_freq is not None
        self.rope_dim = (desc.rope_dim or self.head_dim) if rope else 0
        self.rope_scale = (float(desc.rope_scale) or 1.0) if rope else 0.0
        self.qk_norm = bool(desc.qk_norm)
        self.pre_norm = bool(desc.pre_norm)
        self.rms = desc.norm == 1
        self._dtype_code = desc.dtype
        # stack_run's stof_layer_weights arrays by call (pointers, x, y,
        # stream, flags, instance), each [array, the call's tensors (the
        # newest _KEEP_TENSORS calls only: a replay must not read memory
        # freed meanwhile)], the _MAX_STACKS newest calls' (a server whose
        # x and y move would otherwise grow this without end).
        self._stacks = {}
        self._stack_order = []
        # Weight lists already checked: their identity (names and tensor
        # ids, x's device) -> (per-layer structs, the tensors, their
        # addresses), the _KEEP_WEIGHTS newest (holding the tensors, so no
        # id is reused by another tensor meanwhile).
        self._checked = {}

    @property
    def dtype(self):
        torch = _torch()
        return torch.float16 if self._dtype_code == 0 else torch.bfloat16

    @property
    def tokens(self):
        return self.batch * self.seq

    def _lib(self):
        if not self._h:
            raise ValueError("the layer was freed (closed, or its context is)")
        return self._ctx._lib

    def _fail(self, st):
        msg = self._ctx._lib.stof_layer_errmsg(self._h)
        msg = msg.decode() if msg else ""
        raise StofError(st, msg or _status_str(st))

    def describe(self):
        """The plan as JSON (descriptor, fusion scheme, source, times)."""
        return _json_out(self._lib().stof_layer_describe, self._h)

    def _shapes(self):
        h, f = self.hidden, self.ffn
        hd = self.head_dim
        qd = self.heads * hd  # the attention's width (hidden unless head_dim)
        qn = qd + 2 * self.kv_heads * hd  # Q, K, V
        f1 = 2 * f if self.gated else f  # gated: gate rows, then up rows
        # (a QK norm: one flat buffer, the projections then the norms'
        # weights: qkv_weight)
        wqkv = (qn * h + 2 * hd,) if self.qk_norm else (qn, h)
        return {"w_qkv": wqkv, "b_qkv": (qn,), "w_o": (h, qd), "b_o": (h,),
                "w_ffn1": (f1, h), "b_ffn1": (f1,), "w_ffn2": (h, f), "b_ffn2": (h,),
                "norm1_gamma": (h,), "norm1_beta": (h,),
                "norm2_gamma": (h,), "norm2_beta": (h,)}

    def _check_tensor(self, name, t, shape, device):
        if not hasattr(t, "data_ptr"):
            raise TypeError("%s must be a torch tensor" % name)
        if not t.is_cuda or (device is not None and t.device != device):
            raise ValueError("%s must be on %s, not %s" % (name, device, t.device))
        if t.dtype != self.dtype:
            raise ValueError("%s is %s, the layer is %s" % (name, t.dtype, self.dtype))
        if tuple(t.shape) != tuple(shape):
            raise ValueError("%s has shape %s, expected %s" % (name, tuple(t.shape),
                                                               tuple(shape)))
        if not t.is_contiguous():
            raise ValueError("%s must be contiguous" % name)
        if t.data_ptr() % 16:
            raise ValueError("%s must be 16-byte aligned" % name)

    def _weights(self, w, device):
        """(stof_layer_weights, tensors kept) from a dict of tensors."""
        if not isinstance(w, dict):
            raise TypeError("weights must be a dict of tensors")
        unknown = set(w) - set(LAYER_WEIGHT_NAMES)
        if unknown:
            raise ValueError("unknown weight names: %s" % sorted(unknown))
        out = _LayerWeights()
        kept = []
        for name, shape in self._shapes().items():
            t = w.get(name)
            if not self.bias and name.startswith("b_"):
                if t is not None:
                    raise ValueError("weight %s given to a layer planned without "
                                     "biases (layer_plan(bias=False))" % name)
                continue  # NULL
            if t is None:
                if self.rms and name.endswith("_beta"):
                    continue  # RMSNorm has no beta: NULL
                raise ValueError("weight %s is missing" % name)
            self._check_tensor(name, t, shape, device)
            setattr(out, name, t.data_ptr())
            kept.append(t)
        return out, kept

    def _io(self, x, y):
        if not self._h:
            raise StofError(_STATUS_INVALID, "the layer was freed (closed, or "
                            "its context is)")
        self._ctx._check_device(x=x, y=y)
        shapes = ((self.tokens, self.hidden), (self.batch, self.seq, self.hidden))
        for name, t in (("x", x), ("y", y)):
            if not hasattr(t, "data_ptr"):
                raise TypeError("%s must be a torch tensor" % name)
            if tuple(t.shape) not in shapes:
                raise ValueError("%s has shape %s, expected %s or %s"
                                 % (name, tuple(t.shape), shapes[1], shapes[0]))
            self._check_tensor(name, t, t.shape, x.device)

    @property
    def family(self):
        """Whether the layer was planned on a MaskFamily."""
        return isinstance(self._mask, MaskFamily)

    def _instance(self, instance, device, keep):
        """The _MaskData of a call's instance (family layers), or None."""
        if not instance:
            return None
        if not self.family:
            raise ValueError("instance data (%s) is for a layer planned on a "
                             "MaskFamily" % ", ".join(sorted(instance)))
        return _mask_data(instance, device, self.batch, self.seq, keep, heads=self.heads,
                          seq_q=self.seq)

    def run(self, weights, x, y, stream=None, **instance):
        """Enqueue one layer on `stream` (default: torch's current stream):
        y = layer(x); y may be x. Weights must stay alive until it ran.
        A family layer takes this call's instance: int32 CUDA tensors q_len,
        k_len, q_offset, prefix (batch,), doc_id (batch, seq)."""
        lib = self._lib()
        self._io(x, y)
        w, _ = self._weights(weights, x.device)
        keep = []
        md = self._instance(instance, x.device, keep)
        args = (ctypes.byref(w), ctypes.c_void_p(x.data_ptr()),
                ctypes.c_void_p(y.data_ptr()), ctypes.c_void_p(_stream_handle(stream, self._ctx._device)))
        if md is not None:
            st = lib.stof_layer_run_family(self._h, ctypes.byref(md), *args)
        else:
            st = lib.stof_layer_run(self._h, *args)
        if st != 0:
            self._fail(st)
        return y

    def stack_run(self, weights, x, y, stream=None, graph=True, **instance):
        """Run len(weights) layers x -> y (weights: a list of dicts). With
        graph=True the first call with these pointers records a CUDA graph
        and later ones replay it; the tensors of the newest calls are kept
        referenced here so that a replay never reads freed memory. A family
        layer takes this call's instance as run does; the graph records the
        instance tensors' addresses, so write each batch's values into the
        same tensors to replay it. Pre-norm layers whose scheme has a stack
        ending (describe()["scheme"]["junction_b"] == "stack") fold each
        layer's input norm into the previous layer's last GEMM, so a stack
        rounds slightly differently from run() layer by layer. Weights that
        are the very tensors of one of the newest calls (the same objects
        under the same names, at the same addresses) are not checked again
        for shape, dtype and device (x and y always are): change weights'
        values in place freely, but give a layer other weights as other
        tensors."""
        lib = self._lib()
        weights = list(weights)
        if not weights:
            raise ValueError("weights is empty")
        self._io(x, y)
        stream_h = _stream_handle(stream, self._ctx._device)
        flags = _STACK_GRAPH if graph else 0
        per_layer, kept, ptrs = self._stack_weights(weights, x)
        inst_keep = []
        md = self._instance(instance, x.device, inst_keep)
        key = (ptrs, x.data_ptr(), y.data_ptr(), stream_h, flags,
               tuple(t.data_ptr() for t in inst_keep))
        entry = self._stacks.get(key)
        if entry is None:
            arr = (_LayerWeights * len(per_layer))(*per_layer)
            entry = [arr, None]
            self._stacks[key] = entry
        else:
            self._stack_order.remove(key)
        entry[1] = (kept, x, y, inst_keep)
        self._stack_order.append(key)
        while len(self._stack_order) > self._MAX_STACKS:
            del self._stacks[self._stack_order.pop(0)]
        # Keep the tensors of the newest calls only: the call that has just
        # left the newest _KEEP_TENSORS (if any) lets its tensors go.
        if len(self._stack_order) > self._KEEP_TENSORS:
            self._stacks[self._stack_order[-self._KEEP_TENSORS - 1]][1] = None
        xy = (ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()),
              ctypes.c_void_p(stream_h), flags)
        if md is not None:
            st = lib.stof_layer_stack_run_family(self._h, ctypes.byref(md),
                                                 len(per_layer), entry[0], *xy)
        else:
            st = lib.stof_layer_stack_run(self._h, len(per_layer), entry[0], *xy)
        if st != 0:
            self._fail(st)
        return y

    def _stack_weights(self, weights, x):
        """(per-layer stof_layer_weights, the tensors, the pointers by
        layer) of a stack call's weights, checked (Layer._weights) unless the very same tensors
        (the same objects under the same names, still at the same
        addresses, for x's device) were checked by one of the newest
        calls: at small sizes those checks, a dozen tensors a layer, took
        longer than the stack on the GPU."""
        try:
            ident = (tuple((n, id(t)) for w in weights for n, t in w.items()),
                     x.get_device())
        except AttributeError:  # not dicts: the checks say what is wrong
            ident = None
        hit = self._checked.pop(ident, None) if ident is not None else None
        if hit is not None and all(t.data_ptr() == p
                                   for t, p in zip(hit[1], hit[3])):
            self._checked[ident] = hit  # the newest again
            return hit[0], hit[1], hit[2]
        checked = [self._weights(w, x.device) for w in weights]
        per_layer = [pw for pw, _ in checked]
        kept = [t for _, k in checked for t in k]
        ptrs = tuple(tuple(getattr(pw, n) or 0 for n in LAYER_WEIGHT_NAMES)
                     for pw in per_layer)
        if ident is not None:
            self._checked[ident] = (per_layer, kept, ptrs,
                                    tuple(t.data_ptr() for t in kept))
            while len(self._checked) > self._KEEP_WEIGHTS:
                del self._checked[next(iter(self._checked))]
        return per_layer, kept, ptrs

    def _release(self):
        self.close()

    def close(self):
        """Free the plan. The library does not wait for runs in flight
        (stof_layer_free): wait for them first (e.g. the stream's
        synchronize) when a run may still use it."""
        if getattr(self, "_h", None):
            self._ctx._lib.stof_layer_free(ctypes.byref(self._h))
            self._h = ctypes.c_void_p()
        self._stacks = {}
        self._stack_order = []
        self._checked = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
