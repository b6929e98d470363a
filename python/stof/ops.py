"""stof attention as a PyTorch operator: torch.ops.stof.attention, registered
through torch.library with a fake (meta) implementation, so that models
calling it compile with torch.compile(fullgraph=True) and run under CUDA-graph
capture (mode="reduce-overhead"). Inference only (no backward).

    import stof
    out = stof.attention(q, k, v, mask="causal")             # (B, H, S, D)
    out = stof.attention(q, k, v, mask="sliding:256", layout="bshd")
    out = stof.attention(q, k, v, mask="causal", k_lens=lens)  # padded batch
    out = stof.attention(q, k, v, attn_mask=keep)            # bool or additive

Plans are made on first use and cached (the last MAX_PLANS) per device,
mask spec, shapes, strides, dtypes, scale, soft-cap and bias layout: the
first call of each
(tuning, or a database hit) must happen outside a CUDA-graph capture, as
torch.compile's warm-up runs do. The contexts are stof.Context() per device
(so $STOF_TUNING_MODE and the default databases apply).
"""
import sys
import threading
from typing import List, Optional, Tuple

import torch

from . import RUN_SAME_DATA, Context, _MaskData, pad_bias

_lock = threading.Lock()
_contexts = {}  # device index -> Context
_masks = {}     # (device, spec, seq_q, seq_k) -> Mask
_plans = {}     # see _plan
_registered = {}  # "stof-mask:<digest>" -> Mask (register_mask)
_family_plans = {}  # mask-family plans (family_plan)
_family_fast = {}   # the eager family path's flat keys -> the same plans

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
    """cache[key] = value, dropping the oldest entries past MAX_PLANS (none
    during a CUDA-graph capture: freeing a plan's memory would end it)."""
    while len(cache) >= MAX_PLANS and not _is_capturing():
        cache.pop(next(iter(cache)))
    cache[key] = value


def _plan(q, k, v, out, mask, scale, softcap, bias):
    qd = q.device
    dev = qd.index if qd.index is not None else torch.cuda.current_device()
    # Everything Plan.run checks (the eager path launches without its
    # checks): shapes, strides, dtypes and devices of q, k, v and out (a
    # flat tuple: this runs on every eager call).
    key = (dev, mask, q.shape, k.shape, v.shape, q.stride(), k.stride(),
           v.stride(), out.stride(), q.dtype, k.dtype, v.dtype, qd, k.device,
           v.device, scale, softcap,
           None if bias is None else _layout_key(bias))
    p = _plans.get(key)
    if p is not None:
        return p
    _not_capturing()
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
    if bias is not None and (bias.stride(-1) != 1 and bias.shape[-1] > 1 or any(
            st % 8 for n, st in zip(bias.shape[:-1], bias.stride()[:-1]) if n > 1)):
        # (a compiler may hand the operator a contiguous copy of what
        # pad_bias laid out, or the caller an unpadded bias: its rows are
        # copied padded here, on every call; broadcast dimensions stay so)
        bias = pad_bias(bias)
    out = torch.empty_like(q)
    p = _plan(q, k, v, out, mask, scale, softcap, bias)
    if _is_capturing():
        _pin(p)
    s = _raw_stream(q.device)
    with _plan_lock(p):
        _ordered(p, s, q.device)
        if bias is None:
            # The plan's key holds every property run() would check.
            return p._launch(q, k, v, out, s)
        return p.run(q, k, v, out, bias=bias)


_is_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing",
                        lambda: False)
# Plans run inside a CUDA-graph capture: kept for good (a graph replays
# their kernels and workspaces; evicting one from the caches must not
# free it).
_pinned = {}


def _pin(p):
    _pinned.setdefault(id(p), p)


def _not_capturing():
    """Raise a clear error when a plan would be made during CUDA-graph
    capture (making one tunes or loads kernels and synchronises)."""
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "stof: this attention problem has no plan yet, and a plan cannot "
            "be made during CUDA-graph capture (it is tuned or loaded on first "
            "use): run the same call once before capturing (for the "
            "transformers backend, the warm-up forward inside "
            "stof.integrations.transformers.capture_safe())")


def _raw_stream(device):
    """The current CUDA stream's handle on `device` (torch's private raw
    accessor when it has one: a few microseconds less per call than
    torch.cuda.current_stream)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if _get_raw_stream is not None:
        return _get_raw_stream(idx)
    return torch.cuda.current_stream(idx).cuda_stream


_get_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _plan_lock(p):
    """The lock that makes one cached plan's enqueue (the stream hand-over
    and the launch, whose kernels share the plan's workspaces) one step
    when threads share the plan."""
    lk = p.__dict__.get("_ops_lock")
    if lk is None:
        lk = p.__dict__.setdefault("_ops_lock", threading.Lock())
    return lk


def _ordered(p, stream, device):
    """Keep a cached plan's runs in the order they are enqueued when they
    come from different streams: its workspaces (a family's formats,
    split-KV partial results) serve one run at a time. On a change of
    stream, the new one waits for what the old one holds (nothing while a
    graph is captured: the capture has one stream). A plan used from one
    stream pays one comparison. A graph that captured the plan replays
    unseen here: replays belong on the stream of the plan's eager calls
    (README). Called under the plan's lock (_plan_lock)."""
    last = p.__dict__.get("_ops_stream")
    if last is not None and last != stream and not _is_capturing():
        ev = torch.cuda.Event()
        ev.record(torch.cuda.ExternalStream(last, device=device))
        torch.cuda.ExternalStream(stream, device=device).wait_event(ev)
    p._ops_stream = stream


def family_plan(q, k, v, family, scale, out=None, sample=None):
    """The cached family plan of stof.attention's family path for these
    tensors (made on first use: tuned or loaded, the kernel chosen on
    `sample`, host instance data, or the default instance), without
    running it."""
    if out is None:
        out = torch.empty_like(q)
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    key = (dev, family, tuple(q.shape), tuple(k.shape),
           tuple(tuple(t.stride()) for t in (q, k, v, out)), q.dtype, scale)
    p = _family_plans.get(key)
    if p is None:
        _not_capturing()
        with _lock:
            p = _family_plans.get(key)
            if p is None:
                ctx = _context(dev)
                p = ctx.attention_plan_family(q, k, v, ctx.mask_family(family),
                                              sample=sample, scale=scale, out=out)
                cache_put(_family_plans, key, p)
    return p


def _family_impl(q, k, v, family, scale, q_lens, k_lens, q_offset=None,
                 prefix=None, doc_id=None, same_data=False):
    """Attention over mask family `family` with this batch's lengths (int32
    CUDA tensors of shape (batch,), or None; q_offset: the key position of
    each sequence's first query row; prefix: the instance's prefix
    lengths, for families that say `prefix`; doc_id: (batch, seq_k) int32,
    each key's document, for families that say `docs`; same_data: these are
    the tensors of this plan's previous run, unchanged (FamilyPlan.run)):
    a family plan per shape, strides and dtype, made once (family_plan);
    the formats are built on the GPU from the lengths at each call, nothing
    is planned again."""
    qd = q.device
    out = torch.empty_like(q)
    # Everything FamilyPlan.run checks, in one flat key (out's layout
    # follows from q's: empty_like), so the eager call launches directly.
    key = (family, q.shape, k.shape, v.shape, q.stride(), k.stride(),
           v.stride(), q.dtype, k.dtype, v.dtype, qd, k.device, v.device, scale)
    p = _family_fast.get(key)
    if p is None:
        p = family_plan(q, k, v, family, scale, out)
        p._check_tensors(q, k, v, out, None)
        with _lock:
            cache_put(_family_fast, key, p)
    if _is_capturing():
        _pin(p)
    md = _instance(q.shape[0], k.shape[2], qd, q_lens, k_lens, q_offset, prefix,
                   doc_id)
    s = _raw_stream(qd)
    with _plan_lock(p):
        _ordered(p, s, qd)
        return p._launch_family(q, k, v, out, md,
                                RUN_SAME_DATA if same_data else 0, s)


def _instance(batch, seq_k, device, q_len, k_len, q_offset, prefix, doc_id):
    """The _MaskData of a family run from its int32 tensors on `device`
    ((batch,) each; doc_id (batch, >= seq_k) or (batch * seq_k,)),
    checked."""
    d = _MaskData()
    for name, arg, t in (("q_len", "q_lens", q_len), ("k_len", "k_lens", k_len),
                         ("q_offset", "q_offset", q_offset),
                         ("prefix", "prefix", prefix)):
        if t is None:
            continue
        if t.dtype != torch.int32 or t.device != device or t.numel() != batch \
                or not t.is_contiguous():
            raise ValueError(f"{arg} must be a contiguous int32 tensor of "
                             f"{batch} elements on {device}")
        setattr(d, name, t.data_ptr())
    if doc_id is not None:
        flat = doc_id.dim() == 1 and doc_id.numel() == batch * seq_k
        rows = doc_id.dim() == 2 and doc_id.shape[0] == batch and \
            doc_id.shape[1] >= seq_k
        if doc_id.dtype != torch.int32 or doc_id.device != device or \
                not (flat or rows) or not doc_id.is_contiguous():
            raise ValueError(f"doc_id must be a contiguous int32 tensor of "
                             f"({batch}, >= {seq_k}) on {device}")
        d.doc_id = doc_id.data_ptr()
        d.doc_stride = 0 if flat else doc_id.shape[1]
    return d


@torch.library.custom_op("stof::attention_lens", mutates_args=())
def _attention_lens(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    family: str, scale: float, q_lens: Optional[torch.Tensor],
                    k_lens: Optional[torch.Tensor],
                    q_offset: Optional[torch.Tensor] = None,
                    prefix: Optional[torch.Tensor] = None,
                    doc_id: Optional[torch.Tensor] = None,
                    after: Optional[torch.Tensor] = None) -> torch.Tensor:
    # after: the output of the call that built the format this one reuses
    # (None: build): as an input here it orders the two in a compiled graph.
    return _family_impl(q, k, v, family, scale, q_lens, k_lens, q_offset, prefix,
                        doc_id, same_data=after is not None)


@_attention_lens.register_fake
def _attention_lens_fake(q, k, v, family, scale, q_lens, k_lens, q_offset=None,
                         prefix=None, doc_id=None, after=None):
    return torch.empty_like(q)


# stof's attention has no backward. Autograd must not take its output for
# a constant (a model trained with it would leave q, k and v untrained
# without a word): where autograd records the call, it goes through the
# operator, whose backward says so.
_NO_BACKWARD = ("stof attention is for inference and has no backward: run "
                "the model under torch.no_grad() or torch.inference_mode(), "
                "or train with another attention implementation")


@torch.library.custom_op("stof::no_backward", mutates_args=())
def _no_backward_op(grad: torch.Tensor, k_shape: List[int],
                    v_shape: List[int]) -> Tuple[torch.Tensor, torch.Tensor,
                                                 torch.Tensor]:
    raise RuntimeError(_NO_BACKWARD)


@_no_backward_op.register_fake
def _no_backward_fake(grad, k_shape, v_shape):
    # (torch.compile traces the backward ahead of time, with fakes: the
    # error comes when a backward really runs)
    return (torch.empty_like(grad), grad.new_empty(k_shape),
            grad.new_empty(v_shape))


def _no_backward(ctx, grad, *rest):
    gq, gk, gv = torch.ops.stof.no_backward(grad, ctx.k_shape, ctx.v_shape)
    return (gq, gk, gv) + (None,) * ctx.n_rest


def _no_context(ctx, inputs, output):
    ctx.k_shape = list(inputs[1].shape)
    ctx.v_shape = list(inputs[2].shape)
    ctx.n_rest = len(inputs) - 3


_attention_lens.register_autograd(_no_backward, setup_context=_no_context)


def _records_grad(*ts):
    """Whether autograd records a call on these tensors (None skipped)."""
    return torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in ts)


def _dispatched(q, *ts):
    """Whether a call goes through the registered operator rather than
    straight to the implementation: traced by torch.compile / export,
    recorded by autograd, or on tensors that are not plain CUDA tensors
    (fake, meta, subclasses: the operator's fake or their own handling)."""
    return (torch.compiler.is_compiling() or type(q) is not torch.Tensor
            or q.is_meta or _records_grad(q, *ts))


def family_attention(q, k, v, family, scale, q_lens=None, k_lens=None,
                     q_offset=None, prefix=None, doc_id=None, after=None):
    """Attention (B, H, S, D) over mask family `family` with per-sequence
    int32 CUDA tensors (batch,) of instance data (None: the default) and
    doc_id (batch, seq_k) for families that say `docs`. after: None, or
    (traced: must be) the output of an earlier call of the same plan (same
    family, shapes, strides, dtype and scale) with these same instance
    tensors, unchanged since: this call then reuses the format that call
    built (STOF_RUN_SAME_DATA; where the plan ran in between with other
    tensors, the library builds it again). Passing that output makes the
    order explicit to torch.compile, which may otherwise reorder calls
    that do not depend on each other. torch.ops.stof.attention_lens when
    traced, the same implementation without the dispatcher otherwise."""
    args = (q, k, v, family, 0.0 if scale is None else float(scale), q_lens,
            k_lens, q_offset, prefix, doc_id)
    if _dispatched(q, k, v):
        if after is not None and not isinstance(after, torch.Tensor):
            # (eager callers mark a reuse with any value; the operator
            # takes a tensor: an empty one says the same)
            after = q.new_empty(0)
        return torch.ops.stof.attention_lens(*args, after)
    return _family_impl(*args, same_data=after is not None)


def _lens(t, batch, device, name):
    """A per-sequence length argument as an int32 CUDA tensor (batch,)."""
    if (not torch.compiler.is_compiling() and _is_capturing()
            and (not isinstance(t, torch.Tensor) or t.device != device)):
        raise ValueError(f"{name}: under CUDA-graph capture the lengths must "
                         f"already be a tensor on {device} (a copy from the "
                         "host cannot be captured)")
    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t, dtype=torch.int32)
    if t.shape != (batch,):
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected ({batch},), "
                         "one length per sequence")
    if t.dtype != torch.int32 or t.device != device:
        t = t.to(device=device, dtype=torch.int32)
    return t.contiguous()


def _mask_bias(attn_mask, dtype):
    """An attention mask as stof's additive bias: boolean (True = attend)
    or additive (added to the scores, -inf masks), broadcasting to (B, H,
    Sq, Sk); stored with its rows padded to a multiple of 8 keys."""
    if attn_mask.dtype == torch.bool:
        bias = torch.zeros(attn_mask.shape, dtype=dtype, device=attn_mask.device)
        bias = bias.masked_fill(~attn_mask, float("-inf"))
    else:
        bias = attn_mask.to(dtype)
    while bias.dim() < 4:
        bias = bias.unsqueeze(0)
    return pad_bias(bias)


@torch.library.custom_op("stof::attention", mutates_args=())
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: str,
               scale: float, softcap: float,
               bias: Optional[torch.Tensor]) -> torch.Tensor:
    return _attention_impl(q, k, v, mask, scale, softcap, bias)


@_attention.register_fake
def _attention_fake(q, k, v, mask, scale, softcap, bias):
    return torch.empty_like(q)


_attention.register_autograd(_no_backward, setup_context=_no_context)


def attention(q, k, v, mask="dense", scale=None, *, layout="bhsd", softcap=0.0,
              bias=None, attn_mask=None, q_lens=None, k_lens=None):
    """Masked attention of q against k, v: torch.ops.stof.attention.

    q: (B, H, Sq, D), k and v: (B, Hkv, Sk, D) with Hkv dividing H
    (grouped-query attention), or all with S and H swapped for
    layout="bshd"; float16 or bfloat16 CUDA tensors, the last dimension
    contiguous. mask: a stof mask spec ("dense", "causal", "sliding:256",
    "bigbird:64:3:2:3:1", ...; stof.Context.mask) of Sq x Sk, or the name
    of a registered Mask (register_mask). scale: None =
    1 / sqrt(D). softcap: 0, or scores s -> softcap * tanh(s / softcap).
    bias: None, or an additive bias broadcasting to (B, H, Sq, Sk) in q's
    dtype (best laid out by stof.pad_bias once: the key dimension
    contiguous, other strides multiples of 8; any other layout is copied
    so at every call); -inf masks a key. attn_mask: what
    F.scaled_dot_product_attention takes, a boolean mask (True = attend)
    or an additive one, broadcasting to (B, H, Sq, Sk), on top of `mask`
    (made into a bias each call; for a padded batch prefer the lengths).
    q_lens, k_lens: per-sequence lengths of a padded batch (int tensors of
    shape (B,), best int32 on q's device): sequence b's queries past
    q_lens[b] and keys past k_lens[b] are padding (not computed; padded
    query rows give zeros); `mask` is then a mask family ("dense",
    "causal", "sliding:256", ...: Context.mask_family) whose plan is made
    once per shape and reused for every batch's lengths (CUDA-graph and
    torch.compile safe: the lengths are read on the GPU). Returns a new
    tensor shaped and laid out like q. Rows with no allowed key give
    zeros. Inference only: where autograd records the call (q, k or v
    requiring grad, grad mode on) the output's backward raises."""
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout {layout!r}: 'bhsd' (batch, heads, seq, dim) "
                         "or 'bshd' (batch, seq, heads, dim)")
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    sc = 0.0 if scale is None else float(scale)
    if q_lens is not None or k_lens is not None:
        if bias is not None or attn_mask is not None or softcap:
            raise ValueError("q_lens / k_lens (a mask family with lengths) take "
                             "no bias, attn_mask or softcap")
        lens = [None if t is None else _lens(t, q.shape[0], q.device, name)
                for t, name in ((q_lens, "q_lens"), (k_lens, "k_lens"))]
        out = family_attention(q, k, v, str(mask), sc, lens[0], lens[1])
        return out.transpose(1, 2) if layout == "bshd" else out
    if attn_mask is not None:
        if bias is not None:
            raise ValueError("give attn_mask or bias, not both")
        if attn_mask.device != q.device:
            raise ValueError(f"attn_mask is on {attn_mask.device}, q on {q.device}")
        bias = _mask_bias(attn_mask, q.dtype)
    if bias is not None and (bias.dtype != q.dtype or bias.device != q.device):
        # (checked before a plan is made for it)
        raise ValueError(f"bias must be {q.dtype} on {q.device}, not {bias.dtype} "
                         f"on {bias.device}")
    args = (q, k, v, str(mask), sc, float(softcap), bias)
    # Traced by torch.compile / torch.export: the registered operator (its
    # fake implementation gives the output's shape). Eager: the same
    # implementation without the dispatcher's cost per call.
    out = (torch.ops.stof.attention(*args) if _dispatched(q, k, v, bias)
           else _attention_impl(*args))
    return out.transpose(1, 2) if layout == "bshd" else out


def clear_cache(captured=False):
    """Forget the cached plans, masks and registered masks (their GPU
    memory is freed once nothing else holds them). Plans that ran inside a
    CUDA-graph capture stay, as the graphs replay them, unless captured=True
    (once those graphs are gone)."""
    with _lock:
        if captured:
            _pinned.clear()
        _plans.clear()
        _masks.clear()
        _registered.clear()
        _family_plans.clear()
        _family_fast.clear()
    flex = sys.modules.get("stof.flex")
    if flex is not None:
        flex._clear()
