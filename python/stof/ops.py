"""stof attention as a PyTorch operator: torch.ops.stof.attention, registered
through torch.library with a fake (meta) implementation, so that models
calling it compile with torch.compile(fullgraph=True) and run under CUDA-graph
capture (mode="reduce-overhead"). Inference only (no backward).

    import stof
    out = stof.attention(q, k, v, mask="causal")             # (B, H, S, D)
    out = stof.attention(q, k, v, mask="sliding:256", layout="bshd")

Plans are made on first use and cached (the last MAX_PLANS) per device,
mask spec, shapes, strides, dtypes, scale, soft-cap and bias layout: the
first call of each
(tuning, or a database hit) must happen outside a CUDA-graph capture, as
torch.compile's warm-up runs do. The contexts are stof.Context() per device
(so $STOF_TUNING_MODE and the default databases apply).
"""
import threading
from typing import Optional

import torch

from . import Context

_lock = threading.Lock()
_contexts = {}  # device index -> Context
_masks = {}     # (device, spec, seq_q, seq_k) -> Mask
_plans = {}     # see _plan
_registered = {}  # "stof-mask:<digest>" -> Mask (register_mask)
_family_plans = {}  # mask-family plans of stof.integrations.transformers

MASK_PREFIX = "stof-mask:"


def register_mask(mask):
    """A name for a stof Mask (any construction: Context.mask_from_dense,
    stof.flex.mask_from_mask_mod, ...) that stof.attention's `mask` accepts
    like a spec ("stof-mask:" + its digest). The mask stays registered (and
    alive) until clear_cache()."""
    name = MASK_PREFIX + mask.digest()
    with _lock:
        _registered.setdefault(name, mask)
    return name


def _context(device):
    ctx = _contexts.get(device)
    if ctx is None:
        ctx = _contexts[device] = Context(device=device)
    return ctx


def _layout_key(t):
    return None if t is None else (tuple(t.shape), tuple(t.stride()))


# At most this many plans are kept (each holds GPU memory): a server
# seeing many sequence lengths evicts the oldest first.
MAX_PLANS = 256


def cache_put(cache, key, value):
    """cache[key] = value, dropping the oldest entries past MAX_PLANS."""
    while len(cache) >= MAX_PLANS:
        cache.pop(next(iter(cache)))
    cache[key] = value


def _plan(q, k, v, out, mask, scale, softcap, bias):
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    # Everything Plan.run checks (the eager path launches without its
    # checks): shapes, strides, dtypes and devices of q, k, v and out.
    key = (dev, mask, tuple(q.shape), tuple(k.shape), tuple(v.shape),
           tuple(tuple(t.stride()) for t in (q, k, v, out)),
           (q.dtype, k.dtype, v.dtype), (q.device, k.device, v.device), scale,
           softcap, _layout_key(bias))
    p = _plans.get(key)
    if p is not None:
        return p
    with _lock:
        p = _plans.get(key)
        if p is None:
            ctx = _context(dev)
            mkey = (dev, mask, q.shape[2], k.shape[2])
            m = _masks.get(mkey)
            if m is None and mask.startswith(MASK_PREFIX):
                m = _registered.get(mask)
                if m is None:
                    raise ValueError(f"{mask}: no such registered mask "
                                     "(stof.ops.register_mask)")
                if m.shape != (q.shape[2], k.shape[2]):
                    raise ValueError(f"{mask} is {m.shape[0]} x {m.shape[1]}; "
                                     f"the problem is {q.shape[2]} x {k.shape[2]}")
            if m is None:
                m = ctx.mask(mask, q.shape[2], k.shape[2])
                cache_put(_masks, mkey, m)
            p = ctx.attention_plan(q, k, v, m, scale=scale, out=out,
                                   softcap=softcap, bias=_layout_key(bias))
            cache_put(_plans, key, p)
    return p


def _attention_impl(q, k, v, mask, scale, softcap, bias):
    out = torch.empty_like(q)
    p = _plan(q, k, v, out, mask, scale, softcap, bias)
    if bias is None:
        # The plan's key holds every property run() would check.
        return p._launch(q, k, v, out, torch.cuda.current_stream(q.device).cuda_stream)
    return p.run(q, k, v, out, bias=bias)


@torch.library.custom_op("stof::attention", mutates_args=())
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: str,
               scale: float, softcap: float,
               bias: Optional[torch.Tensor]) -> torch.Tensor:
    return _attention_impl(q, k, v, mask, scale, softcap, bias)


@_attention.register_fake
def _attention_fake(q, k, v, mask, scale, softcap, bias):
    return torch.empty_like(q)


def attention(q, k, v, mask="dense", scale=None, *, layout="bhsd", softcap=0.0,
              bias=None):
    """Masked attention of q against k, v: torch.ops.stof.attention.

    q: (B, H, Sq, D), k and v: (B, Hkv, Sk, D) with Hkv dividing H
    (grouped-query attention), or all with S and H swapped for
    layout="bshd"; float16 or bfloat16 CUDA tensors, the last dimension
    contiguous. mask: a stof mask spec ("dense", "causal", "sliding:256",
    "bigbird:64:3:2:3:1", ...; stof.Context.mask) of Sq x Sk, or the name
    of a registered Mask (register_mask). scale: None =
    1 / sqrt(D). softcap: 0, or scores s -> softcap * tanh(s / softcap).
    bias: None, or an additive bias broadcasting to (B, H, Sq, Sk) in q's
    dtype (the key dimension contiguous, other strides multiples of 8: see
    stof.pad_bias); -inf masks a key. Returns a new tensor shaped and laid
    out like q. Rows with no allowed key give zeros."""
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout {layout!r}: 'bhsd' (batch, heads, seq, dim) "
                         "or 'bshd' (batch, seq, heads, dim)")
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    args = (q, k, v, str(mask), 0.0 if scale is None else float(scale),
            float(softcap), bias)
    # Traced by torch.compile / torch.export: the registered operator (its
    # fake implementation gives the output's shape). Eager: the same
    # implementation without the dispatcher's cost per call.
    out = (torch.ops.stof.attention(*args) if torch.compiler.is_compiling()
           else _attention_impl(*args))
    return out.transpose(1, 2) if layout == "bshd" else out


def clear_cache():
    """Forget the cached plans, masks and registered masks (their GPU
    memory is freed once nothing else holds them)."""
    with _lock:
        _plans.clear()
        _masks.clear()
        _registered.clear()
        _family_plans.clear()
