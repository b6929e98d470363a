"""stof: Python binding over the stof C library (ctypes), taking torch tensors.

    import torch, stof
    ctx = stof.Context()
    mask = ctx.mask("bigbird:64:3:2:3:1", 4096, 4096)
    plan = ctx.attention_plan(q, k, v, mask)      # warm-up (compile / load)
    plan.run(q, k, v, out)                        # on torch's current stream

q, k, v, out: CUDA tensors of shape (batch, heads, seq, head_dim) in
torch.float16 or torch.bfloat16 whose last dimension is contiguous (any other
strides work, e.g. a (batch, seq, heads, dim) tensor transposed to BHSD).
The library is found through $STOF_LIBRARY, else next to this package in a
meson build directory, else by the system loader (libstof.so.0).
"""
import ctypes
import json
import os

__all__ = ["Context", "Mask", "Plan", "StofError", "library_path"]

_STATUS_BUFFER_TOO_SMALL = 10


class StofError(RuntimeError):
    """A stof call failed; .status is the stof_status code."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def library_path():
    env = os.environ.get("STOF_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    for d in ("build", "build-dev", "build-release", ".carry/lib"):
        p = os.path.join(root, d, "src", "libstof.so")
        if os.path.exists(p):
            return p
        p = os.path.join(root, d, "libstof.so")
        if os.path.exists(p):
            return p
    return "libstof.so.0"


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
        ("reserved", ctypes.c_uint8 * 64),
    ]


_lib = None


def _load():
    global _lib
    if _lib is not None:
        return _lib
    lib = ctypes.CDLL(library_path())
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
    _lib = lib
    return lib


def _json_out(fn, handle):
    need = ctypes.c_size_t(0)
    fn(handle, None, 0, ctypes.byref(need))
    buf = ctypes.create_string_buffer(need.value + 1)
    st = fn(handle, buf, need.value + 1, None)
    if st != 0:
        raise StofError(st, "describe failed")
    return json.loads(buf.value.decode())


class Context:
    """A stof context on one CUDA device (default: torch's current one)."""

    def __init__(self, device=None, require_device=True, user_db=None,
                 system_dbs=(), tuning_mode="default", budget_s=0.0):
        """user_db: tuning database path (None: the default location, "":
        none); system_dbs: read-only databases under it; tuning_mode:
        "default" (tune misses), "cache-only" (never tune; record misses) or
        "force" (always re-tune); budget_s: tuning budget per problem."""
        lib = _load()
        s = _Settings()
        lib.stof_default_settings(ctypes.byref(s))
        if device is None:
            try:
                import torch
                device = torch.cuda.current_device() if torch.cuda.is_available() else 0
            except ImportError:
                device = 0
        s.device = int(device)
        s.require_device = 1 if require_device else 0
        modes = {"default": 0, "cache-only": 1, "force": 2}
        if tuning_mode not in modes:
            raise ValueError("tuning_mode must be one of %s" % sorted(modes))
        s.tuning_mode = modes[tuning_mode]
        s.tuning_budget_s = float(budget_s)
        # Keep the encoded strings alive for the duration of stof_open.
        self._db_bytes = user_db.encode() if user_db is not None else None
        s.user_db = self._db_bytes
        sys_list = [p.encode() for p in system_dbs]
        arr = (ctypes.c_char_p * (len(sys_list) + 1))(*sys_list, None)
        s.system_dbs = ctypes.cast(arr, ctypes.c_void_p) if sys_list else None
        self._h = ctypes.c_void_p()
        st = lib.stof_open(ctypes.byref(self._h), ctypes.byref(s))
        if st != 0:
            msg = lib.stof_errmsg(self._h).decode()
            lib.stof_close(ctypes.byref(self._h))
            raise StofError(st, msg)
        self._lib = lib

    def _check(self, st):
        if st != 0:
            raise StofError(st, self._lib.stof_errmsg(self._h).decode())

    def close(self):
        if self._h:
            self._lib.stof_close(ctypes.byref(self._h))

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def device(self):
        return _json_out(self._lib.stof_device_describe, self._h)

    def mask(self, spec, seq_q, seq_k):
        """A mask from a spec string (see stof.h for the grammar)."""
        h = ctypes.c_void_p()
        self._check(self._lib.stof_mask_from_spec(self._h, spec.encode(), int(seq_q),
                                                  int(seq_k), ctypes.byref(h)))
        return Mask(self, h)

    def mask_from_dense(self, t):
        """A mask from a 2-D bool/uint8 tensor or numpy array (nonzero = allowed)."""
        import numpy as np
        a = t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)
        a = np.ascontiguousarray(a != 0, dtype=np.uint8)
        h = ctypes.c_void_p()
        self._check(self._lib.stof_mask_from_dense(self._h, a.ctypes.data, a.shape[0],
                                                   a.shape[1], ctypes.byref(h)))
        return Mask(self, h)

    def attention_plan(self, q, k, v, mask, scale=0.0, out=None):
        """Plan attention for tensors shaped (batch, heads, seq, head_dim)."""
        import torch
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise ValueError("q, k, v must be 4-D (batch, heads, seq, head_dim)")
        if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
            raise ValueError("q, k, v must all be float16 or all bfloat16")
        if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
            raise ValueError("shapes do not match: q %s, k %s, v %s"
                             % (tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        o = out if out is not None else q
        d = _Desc()
        d.batch, d.heads, d.seq_q, d.head_dim = q.shape
        d.seq_k = k.shape[2]
        d.dtype = 0 if q.dtype == torch.float16 else 1
        d.scale = float(scale)
        d.layout = 2
        for name, t in (("q_stride", q), ("k_stride", k), ("v_stride", v), ("o_stride", o)):
            if t.stride(3) != 1:
                raise ValueError("the last dimension must be contiguous")
            arr = getattr(d, name)
            arr[0], arr[1], arr[2] = t.stride(0), t.stride(1), t.stride(2)
        h = ctypes.c_void_p()
        self._check(self._lib.stof_attention_plan(self._h, ctypes.byref(d), mask._h,
                                                  ctypes.byref(h)))
        strides = tuple(tuple(t.stride()) for t in (q, k, v, o))
        return Plan(self, h, tuple(q.shape), tuple(k.shape), q.dtype, strides)


class Mask:
    def __init__(self, ctx, h):
        self._ctx, self._h = ctx, h

    @property
    def shape(self):
        lib = self._ctx._lib
        return (lib.stof_mask_seq_q(self._h), lib.stof_mask_seq_k(self._h))

    @property
    def density(self):
        return self._ctx._lib.stof_mask_density(self._h)

    def digest(self):
        buf = ctypes.create_string_buffer(33)
        self._ctx._lib.stof_mask_digest(self._h, None, buf)
        return buf.value.decode()

    def to_dense(self):
        """A (seq_q, seq_k) torch.bool tensor on the CPU."""
        import torch
        sq, sk = self.shape
        t = torch.empty((sq, sk), dtype=torch.uint8)
        self._ctx._lib.stof_mask_to_dense(self._h, ctypes.c_void_p(t.data_ptr()))
        return t.bool()

    def __del__(self):
        try:
            if self._h:
                self._ctx._lib.stof_mask_free(ctypes.byref(self._h))
        except Exception:
            pass


class Plan:
    def __init__(self, ctx, h, qshape, kshape, dtype, strides):
        self._ctx, self._h = ctx, h
        self._qshape, self._kshape, self._dtype = qshape, kshape, dtype
        self._strides = strides

    def describe(self):
        return _json_out(self._ctx._lib.stof_plan_describe, self._h)

    def run(self, q, k, v, out, stream=None):
        """Enqueue on `stream` (a torch.cuda.Stream; default: the current one).
        The tensors must have the strides the plan was made with."""
        import torch
        if tuple(q.shape) != self._qshape or tuple(k.shape) != self._kshape or \
                tuple(v.shape) != self._kshape or tuple(out.shape) != self._qshape:
            raise ValueError("tensor shapes differ from the plan's")
        if tuple(tuple(t.stride()) for t in (q, k, v, out)) != self._strides:
            raise ValueError("tensor strides differ from the plan's")
        if any(t.dtype != self._dtype or not t.is_cuda for t in (q, k, v, out)):
            raise ValueError("tensors must be CUDA tensors of the plan's dtype")
        if stream is None:
            stream = torch.cuda.current_stream(q.device)
        st = self._ctx._lib.stof_attention_run(
            self._h, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
            ctypes.c_void_p(stream.cuda_stream))
        if st != 0:
            raise StofError(st, self._ctx._lib.stof_plan_errmsg(self._h).decode())
        return out

    def __del__(self):
        try:
            if self._h:
                self._ctx._lib.stof_plan_free(ctypes.byref(self._h))
        except Exception:
            pass
