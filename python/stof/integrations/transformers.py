"""stof as an attention backend of Hugging Face transformers.

    import stof.integrations.transformers  # registers "stof"
    model = AutoModel.from_config(cfg, attn_implementation="stof")
    # or AutoModelForCausalLM.from_pretrained(name, attn_implementation="stof")

Importing this module registers "stof" with transformers' AttentionInterface
and its AttentionMaskInterface. The mask: transformers' masking code hands
the mask interface its pattern (a mask function) and the batch's 2-D
padding mask. stof_mask recognises the patterns stof has kernels for
(causal, bidirectional, either with a sliding window, and those within
packed sequences found in the position ids) and returns a StofMask: the
stof spec and, where needed, a mask family with its instance tensors
worked out on the GPU without reading them on the host: each sequence's
span of valid keys [first, end), the queries' offset after cached keys (an
int, or a tensor for static caches), the packed sequences' ids. The
attention then runs
  - the structured kernel ("causal", "dense", "causal_sliding:W",
    "sliding:W") when nothing is padded, packed or offset;
  - otherwise the mask family: "<spec>&!prefix" with prefix = first and
    k_len = end for padding on either side (padded keys are skipped, not
    computed), q_offset for queries after cached keys, "&docs" for packed
    sequences. The layers of a forward build its format once.
Eager, the mask interface reads one small summary of the padding mask
(padded at all, contiguous, padded on the left) once per forward to take
the cheapest of these; under CUDA-graph capture and torch.compile nothing
is read on the host (the family path always, and a device-side assert
that every sequence's valid keys are contiguous), so models capture and
compile whole (capture_safe: the same for a warm-up before capturing a
CUDA graph yourself). Other patterns (custom mask functions, chunked
attention, keys padded in the middle) get transformers' SDPA mask, a
boolean 4-D tensor, as do 4-D masks given by the caller; for those the
attention works out the pattern from the tensor on the host once per mask
(structured kernel, the padding families, or an additive bias; under
capture or compile, an additive bias). Traced by torch.compile, only the
plain causal and bidirectional patterns are recognised (the closures of
the composite mask functions transformers makes inside the traced code
cannot be read there): sliding windows and packed sequences then take
SDPA's mask as an additive bias, correct but without the window's
savings; CUDA graphs captured from eager code keep them. Soft-capping (Gemma 2) reaches the
structured kernels; with a mask family (padding, packed sequences, or
queries after cached keys: decoding with a cache) it is refused, as are
attention sinks. Inference only: dropout must be 0 (model.eval()), and
where autograd records the call its backward raises. Attention weights are
not returned (None), as with SDPA.
"""
import contextlib

import torch

try:
    from transformers import AttentionInterface
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError("stof.integrations.transformers needs Hugging Face "
                      "transformers with AttentionInterface (4.48 or newer): "
                      f"{e}") from None

from .. import ops as _ops
from .. import pad_bias

NAME = "stof"

try:
    from transformers import masking_utils as _mu
except ImportError:  # pragma: no cover - older transformers
    _mu = None


def _code_of(make, *args):
    """The code object of the function make(*args) returns, or None where
    this transformers lacks make (each recognised on its own: one missing
    name must not cost the others, or the mask hook)."""
    try:
        return make(*args).__code__
    except Exception:  # (AttributeError, TypeError: another transformers)
        return None


# The code objects of transformers' composite mask functions: a mask
# function is recognised by its code and the values it closes over,
# exactly, never by evaluating it.
_AND_CODE = _code_of(lambda: _mu.and_masks(_mu.causal_mask_function))
_SW_CODE = _code_of(lambda: _mu.sliding_window_overlay(1))
_SWB_CODE = _code_of(lambda: _mu.sliding_window_bidirectional_overlay(1))
_PACKED_CODE = _code_of(lambda: _mu.packed_sequence_mask_function(None))


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _cell(fn, name):
    """The value function `fn` closes over as `name`, or None (by index:
    what torch.compile can trace)."""
    names = fn.__code__.co_freevars
    if name not in names or fn.__closure__ is None:
        return None
    return fn.__closure__[names.index(name)].cell_contents


def mask_spec(mask_function):
    """The stof spec of a transformers mask function: "causal", "dense",
    "causal_sliding:W" (transformers' causal sliding window W: q - k < W)
    or "sliding:<W+1>" (its bidirectional window |q - k| <= W); None for
    any other function (custom, chunked, or combined with more; packed
    sequences: see parse_mask_function)."""
    if _mu is None:
        return None
    if mask_function is _mu.causal_mask_function:
        return "causal"
    if mask_function is _mu.bidirectional_mask_function:
        return "dense"
    if torch.compiler.is_compiling() or _AND_CODE is None or \
            getattr(mask_function, "__code__", None) is not _AND_CODE:
        # (torch.compile cannot read the closures of functions made in the
        # traced code: composites go to SDPA's mask there, an additive bias)
        return None
    parts = _cell(mask_function, "mask_functions")
    if not isinstance(parts, tuple) or len(parts) != 2:
        return None
    overlay, base = parts
    code = getattr(overlay, "__code__", None)
    if code is None or code not in (_SW_CODE, _SWB_CODE):
        return None
    w = _cell(overlay, "sliding_window")
    if not isinstance(w, int) or isinstance(w, bool) or w <= 0:
        return None
    if code is _SW_CODE and base is _mu.causal_mask_function:
        return f"causal_sliding:{w}"
    if code is _SWB_CODE and base is _mu.bidirectional_mask_function:
        return f"sliding:{w + 1}"
    return None


def parse_mask_function(mask_function):
    """(spec, documents) of a transformers mask function: mask_spec's spec,
    with documents None; or, for such a pattern within packed sequences
    (transformers' and_masks(pattern, packed_sequence_mask_function(ids))),
    the spec and the (batch, seq) tensor of each token's sequence index
    (non-decreasing: stof's `docs`). None for anything else."""
    spec = mask_spec(mask_function)
    if spec is not None or _mu is None:
        return None if spec is None else (spec, None)
    if torch.compiler.is_compiling() or _AND_CODE is None or \
            _PACKED_CODE is None or \
            getattr(mask_function, "__code__", None) is not _AND_CODE:
        return None
    parts = _cell(mask_function, "mask_functions")
    if not isinstance(parts, tuple) or len(parts) != 2 or \
            getattr(parts[1], "__code__", None) is not _PACKED_CODE:
        return None
    spec = mask_spec(parts[0])
    ids = _cell(parts[1], "packed_sequence_mask")
    if spec is None or not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return None
    return spec, ids


class StofMask:
    """The mask the "stof" mask interface gives the attention: `spec` (a
    stof spec) over q_length x kv_length, the queries at key position
    `q_offset` + row (an int, the keys starting at position 0; None when
    the offset is a tensor, in `data`); and where it needs one (padding, an
    offset held in a tensor, packed sequences) `family` (the mask family
    to run) with `data` (its int32 instance tensors of shape (batch,):
    prefix, k_lens, q_offset; doc_id (batch, keys)), else None and {}.
    `check`: None, or a CUDA bool tensor that must be true (every
    sequence's valid keys contiguous), asserted on the device when the
    mask is made. The layers of a forward share the mask: the first run of
    each family plan builds the format from `data`, the others reuse it
    (`built`: each plan's first output, which the later runs take as
    `after` so that a compiled graph keeps them in order)."""

    def __init__(self, spec, q_length, kv_length, q_offset, family=None,
                 data=None, check=None, warm=()):
        self.spec, self.q_length, self.kv_length = spec, q_length, kv_length
        self.q_offset, self.family, self.data = q_offset, family, data or {}
        self.check = check
        self.built = {}  # plan key -> the output of the run that built it
        self._on = {}    # device -> data there (data_on)
        self.warm = warm  # families to plan too (capture_safe's warm-up)
        if check is not None:
            torch._assert_async(check, "stof: a padding mask whose valid keys "
                                "are not contiguous in some sequence; this "
                                "path takes left or right padding only")

    def data_on(self, device):
        """A copy of `data` whose tensors are on `device` (models split
        over GPUs: each device's copy is made once per mask)."""
        d = self._on.get(device)
        if d is None:
            d = {n: t if t.device == device else t.to(device)
                 for n, t in self.data.items()}
            self._on[device] = d
        return dict(d)

    def __repr__(self):
        return (f"StofMask({self.spec!r}, {self.q_length}x{self.kv_length}, "
                f"q_offset={self.q_offset}, family={self.family!r})")


def _family_of(spec, prefix):
    """The family running `spec` with keys before each sequence's prefix
    left out (prefix=True) or not."""
    if not prefix:
        return spec
    return "!prefix" if spec == "dense" else spec + "&!prefix"


def key_spans(padding):
    """Each sequence's span of valid keys in a (batch, keys) boolean
    padding mask, on its device and without reading it on the host:
    (first, end, contiguous) with first and end int32 (batch,) (keys and 0
    for a sequence with no valid key: an empty span) and contiguous a bool
    scalar tensor, true when every sequence's valid keys are exactly
    first..end-1. first and end are each a reduction's output, nothing
    computed on top: torch.compile then stores them once rather than
    recomputing them for each layer's call (which would give every call
    new tensors, and the layers could not share one format build)."""
    keys = padding.shape[-1]
    idx = torch.arange(keys, device=padding.device, dtype=torch.int32)
    end = torch.where(padding, idx + 1, 0).amax(-1).to(torch.int32)
    first = torch.where(padding, idx, keys).amin(-1).to(torch.int32)
    n = padding.sum(-1, dtype=torch.int32)
    contiguous = (((end - first) == n) | (n == 0)).all()
    return first, end, contiguous


_no_host_reads = [0]


@contextlib.contextmanager
def capture_safe():
    """Within this context the backend reads nothing on the host, as under
    CUDA-graph capture: run a model's warm-up forward in it before
    capturing the model in a CUDA graph yourself, so that the plans the
    captured forward needs (made on first use: tuning or a database hit,
    which cannot happen during capture) exist. torch.compile needs none
    of this: its warm-up runs are traced."""
    _no_host_reads[0] += 1
    try:
        yield
    finally:
        _no_host_reads[0] -= 1


def _capturing():
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _tracing():
    """Whether host reads must be avoided: CUDA-graph capture, tracing by
    torch.compile / export, or capture_safe()."""
    return bool(_no_host_reads[0]) or torch.compiler.is_compiling() or \
        _capturing()


def stof_mask(batch_size, q_length=None, kv_length=None, q_offset=0,
              kv_offset=0, mask_function=None, attention_mask=None, **kwargs):
    """transformers' mask interface for "stof": a StofMask when the pattern
    is one stof has kernels for (parse_mask_function) and the offsets are
    ints (or, static caches, the queries' offset a one-element tensor);
    otherwise transformers' SDPA mask (a boolean 4-D tensor or None).
    Called with another signature (a transformers whose hook passes
    cache_position instead of q_length and q_offset), transformers' SDPA
    mask with the arguments as given."""
    if q_length is None or kv_length is None or \
            not hasattr(_mu, "prepare_padding_mask"):
        given = dict(kwargs, batch_size=batch_size, kv_offset=kv_offset,
                     mask_function=mask_function,
                     attention_mask=attention_mask)
        if kv_length is not None:
            given["kv_length"] = kv_length
        if q_length is not None:
            given.update(q_length=q_length, q_offset=q_offset)
        if given["mask_function"] is None:
            del given["mask_function"]
        return _mu.sdpa_mask(**given)

    def sdpa():  # transformers' own mask, for what stof does not claim
        return _mu.sdpa_mask(batch_size=batch_size, q_length=q_length,
                             kv_length=kv_length, q_offset=q_offset,
                             kv_offset=kv_offset, mask_function=mask_function,
                             attention_mask=attention_mask, **kwargs)

    def spans():  # the padding mask over these keys, and its key spans
        pad = _mu.prepare_padding_mask(attention_mask, kv_length, kv_offset)
        pad = pad[:, kv_offset:kv_offset + kv_length].to(torch.bool)
        return (pad,) + key_spans(pad)

    if mask_function is None and _mu is not None:
        mask_function = _mu.causal_mask_function
    parsed = parse_mask_function(mask_function)
    ints = _is_int(q_offset) and _is_int(kv_offset)
    # Static caches give the queries' offset as a one-element tensor.
    held = _is_int(kv_offset) and isinstance(q_offset, torch.Tensor) and \
        q_offset.numel() == 1
    offsets_ok = (ints and q_offset >= kv_offset) or held
    docs = None if parsed is None else parsed[1]
    if docs is not None and (not ints or q_offset != kv_offset or
                             q_length != kv_length or
                             tuple(docs.shape) != (batch_size, kv_length)):
        parsed = None  # packed sequences with a cache: the general path
    if parsed is None or not offsets_ok:
        return sdpa()
    spec = parsed[0]
    if held:
        # The family with the offset as instance data (read on the GPU:
        # positions past the cache's filled part are beyond every query,
        # so causal patterns leave them out), and the key spans of the
        # padding mask, if any.
        data = {"q_offset": (q_offset.reshape(1) - kv_offset).to(
            torch.int32).expand(batch_size).contiguous()}
        if attention_mask is None:
            return StofMask(spec, q_length, kv_length, None, spec, data)
        _, first, end, contiguous = spans()
        if not _tracing() and not bool(contiguous):
            # Eager, keys padded in the middle (say a right-padded prompt
            # decoding on): the general path, not the device assert.
            return sdpa()
        data.update(prefix=first, k_lens=end)
        return StofMask(spec, q_length, kv_length, None, _family_of(spec, True),
                        data, check=contiguous if _tracing() else None)
    rel = q_offset - kv_offset
    if docs is not None:
        # Packed sequences (transformers passes their ids only when it
        # found some, or when it cannot look: under capture or compile).
        data = {"doc_id": docs.to(torch.int32).contiguous()}
        if attention_mask is not None:
            _, first, end, contiguous = spans()
            if not _tracing() and not bool(contiguous):
                return sdpa()
            data.update(prefix=first, k_lens=end)
            return StofMask(spec, q_length, kv_length, rel,
                            _family_of(spec, True) + "&docs", data,
                            check=contiguous if _tracing() else None)
        return StofMask(spec, q_length, kv_length, rel, spec + "&docs", data)
    if attention_mask is None:
        warm = ()
        if _no_host_reads[0] and spec.startswith("causal") and rel == 0 and \
                q_length == kv_length:
            # A warm-up for a capture: under capture transformers cannot
            # look for packed sequences in the position ids, so it passes
            # its sequence ids for every causal mask made without a cache
            # or padding mask, and that forward runs "<spec>&docs": plan it
            # now (it cannot be planned during the capture).
            warm = (spec + "&docs",)
        return StofMask(spec, q_length, kv_length, rel, warm=warm)
    pad, first, end, contiguous = spans()
    if _tracing():
        return StofMask(spec, q_length, kv_length, rel, _family_of(spec, True),
                        {"prefix": first, "k_lens": end}, check=contiguous)
    # Eager: one small read decides the cheapest path for this forward.
    full, contiguous, left = torch.stack(
        [pad.all(), contiguous, (first > 0).any()]).tolist()
    if full:
        return StofMask(spec, q_length, kv_length, rel)
    if not contiguous:  # keys padded in the middle: the general path
        return sdpa()
    data = {"k_lens": end}
    if left:
        data["prefix"] = first
    return StofMask(spec, q_length, kv_length, rel, _family_of(spec, left), data)

# The last mask worked out: (key, the tensor itself, plan). Held, its memory
# cannot be handed to the next batch's mask, so a later mask at the same
# address is a view of this one (layers slice the forward pass's mask).
_last = {"entry": None}
# Calls of stof_attention_forward (tests check that a model really runs it).
calls = [0]


def _pattern(allowed, window):
    """The stof spec whose mask equals `allowed` (boolean, (..., S, S)) in
    every batch element and head: "dense", "causal" or
    "causal_sliding:<window>"; None when it is none of them."""
    sq, sk = allowed.shape[-2:]
    if sq != sk:
        return None
    if bool(allowed.all()):
        return "dense"
    i = torch.arange(sq, device=allowed.device)
    d = i[:, None] - i[None, :]  # q - k
    pats = [("causal", d >= 0)]
    if window:
        pats.append((f"causal_sliding:{int(window)}", (d >= 0) & (d < window)))
    for spec, p in pats:
        if bool((allowed == p).all()):
            return spec
    return None


def _padding(allowed, window):
    """(family, lengths) when `allowed` (batch, 1, S, S) is full, causal or
    causal within `window` over each sequence's valid keys, padded on the
    right (family "dense" / "causal" / "causal_sliding:W" and the int32 key
    lengths k_len) or on the left (the same with "&!prefix" and the int32
    prefix lengths to skip); else None."""
    if allowed.dim() != 4 or allowed.shape[1] != 1 or \
            allowed.shape[2] != allowed.shape[3]:
        return None
    a = allowed[:, 0]
    valid = a.any(dim=-2)  # (batch, S): keys some query may see
    n = valid.sum(-1)
    i = torch.arange(a.shape[-1], device=a.device)
    if bool((valid == (i[None, :] < n[:, None])).all()):
        side, lens = "right", n
    elif bool((valid == (i[None, :] >= (a.shape[-1] - n)[:, None])).all()):
        side, lens = "left", a.shape[-1] - n
    else:
        return None
    keys = valid[:, None, :]
    d = i[:, None] - i[None, :]  # q - k
    pats = [("dense", None), ("causal", d >= 0)]
    if window:
        pats.append((f"causal_sliding:{int(window)}", (d >= 0) & (d < window)))
    for spec, p in pats:
        want = keys if p is None else p[None] & keys
        if bool((a == want).all()):
            if side == "right":
                return spec, ("k_len", lens.to(torch.int32))
            fam = "!prefix" if spec == "dense" else spec + "&!prefix"
            return fam, ("prefix", lens.to(torch.int32))
    return None


def _mask_plan(mask, dtype, seq_k, window, recheck=False):
    """(spec, extra) for a transformers mask, boolean (True = attend) or
    additive: a structured spec and None when the mask is one (see
    _pattern); "family:<spec>" and the lengths for right or left padding
    (_padding: ("k_len" or "prefix", int32 lengths)); else "dense" and an
    additive bias in q's dtype (key dimension padded to a multiple of 8
    elements). An additive mask is read as a pattern only when each of its
    elements is 0 or masks (-inf, or at most half the dtype's lowest: what
    transformers fills with); any other value (ALiBi-like slopes, soft
    penalties) makes it a bias, as SDPA adds it. Cached for the same mask
    memory (address, shape, strides; the version counter where tensors
    have one) and the same dtype, seq_k and window; recheck: work it out
    again even so (tensors made under torch.inference_mode have no version
    counter, so a mask rewritten in place would look the same: the caller
    asks once per forward, at its first layer)."""
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        raise TypeError(f"stof: an attention mask of dtype {mask.dtype}: "
                        "give a boolean mask (True = attend) or an additive "
                        "float one, as SDPA takes")
    version = _version_of(mask)
    key = (mask.data_ptr(), tuple(mask.shape), tuple(mask.stride()), mask.dtype,
           mask.device, version, dtype, seq_k, window)
    hit = _last["entry"]  # (key, mask, plan): one read, one write
    if hit is not None and hit[0] == key and not recheck:
        return hit[2]
    held = mask
    mask = mask[..., :seq_k]
    if mask.dtype == torch.bool:
        allowed, binary = mask, True
    else:
        allowed = mask == 0
        binary = bool((allowed | (mask <= torch.finfo(mask.dtype).min / 2)).all())
    spec = _pattern(allowed, window) if binary else None
    padded = None if spec is not None or not binary else _padding(allowed, window)
    if spec is not None:
        plan = (spec, None)
    elif padded is not None:
        plan = ("family:" + padded[0], padded[1])
    elif mask.dtype == torch.bool:
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        bias.masked_fill_(~mask, float("-inf"))
        plan = ("dense", pad_bias(bias))
    else:
        plan = ("dense", pad_bias(mask.to(dtype)))
    # (the mask held: its memory cannot go to the next batch's mask, so a
    # later mask at this address is this one or a view of it)
    _last["entry"] = (key, held, plan)
    return plan


_lowest_layer = [None]


def _first_attention_layer(module):
    """Whether module is the model's first attention layer (the lowest
    layer_idx seen so far; True for a module without one)."""
    li = getattr(module, "layer_idx", None)
    if not _is_int(li):
        return True
    if _lowest_layer[0] is None or li < _lowest_layer[0]:
        _lowest_layer[0] = li
    return li == _lowest_layer[0]


def _version_of(t):
    """t's version counter, or None (inference tensors have none)."""
    try:
        return t._version
    except RuntimeError:
        return None


def stof_attention_forward(module, query, key, value, attention_mask,
                           dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention interface: query (B, H, Sq, D), key and value
    (B, Hkv, Sk, D); returns ((B, Sq, H, D), None)."""
    if dropout:
        raise ValueError("stof attention is for inference: dropout must be 0 "
                         "(call model.eval())")
    if not torch.compiler.is_compiling():  # a traced counter would recompile
        calls[0] += 1
    seq_q, seq_k = query.shape[2], key.shape[2]
    if kwargs.get("s_aux") is not None:
        raise ValueError("stof: attention sinks (s_aux) are not supported")
    softcap = kwargs.get("softcap") or 0.0
    if isinstance(attention_mask, StofMask):
        return _run_stof_mask(attention_mask, query, key, value, scaling,
                              float(softcap)), None
    bias = None
    if attention_mask is not None and _tracing():
        # Nothing may be read on the host: the mask as an additive bias.
        spec, bias = "dense", _ops._mask_bias(attention_mask[..., :seq_k],
                                              query.dtype)
    elif attention_mask is not None:
        window = kwargs.get("sliding_window") or getattr(module, "sliding_window",
                                                         None)
        # (without a version counter, the first attention layer of each
        # forward works the mask out again: the lowest layer_idx seen, not
        # necessarily 0 in hybrid models; a module without one, each call)
        recheck = _version_of(attention_mask) is None and \
            _first_attention_layer(module)
        spec, bias = _mask_plan(attention_mask, query.dtype, seq_k, window,
                                recheck)
    else:
        if is_causal is None:
            is_causal = getattr(module, "is_causal", True)
        spec = "causal" if (is_causal and seq_q > 1) else "dense"
    if spec.startswith("family:"):
        if softcap:
            raise ValueError("stof: logit soft-capping with a padded batch (a "
                             "mask family) is not supported")
        out = _family_attention(query, key, value, spec[7:], bias, scaling)
    else:
        last["path"] = spec if bias is None else spec + "+bias"
        out = _ops.attention(query, key, value, mask=spec, scale=scaling,
                             bias=bias, softcap=float(softcap))
    return out.transpose(1, 2).contiguous(), None


def _family_attention(q, k, v, family, lengths, scale):
    """Attention over mask family `family` with this batch's lengths
    (("k_len" or "prefix", int32 CUDA tensor)): stof.attention's family
    path (a family plan per shape, strides and dtype, made once)."""
    name, t = lengths
    if t.shape[0] == 1 and q.shape[0] > 1:  # one mask for the whole batch
        t = t.expand(q.shape[0]).contiguous()
    last["path"] = "family:" + family
    return _ops.family_attention(q, k, v, family, scale,
                                 k_lens=t if name == "k_len" else None,
                                 prefix=t if name == "prefix" else None)


def _run_stof_mask(m, q, k, v, scale, softcap=0.0):
    """Attention (B, Sq, H, D) of q, k, v (B, H, S, D) under a StofMask."""
    if (q.shape[2], k.shape[2]) != (m.q_length, m.kv_length):
        raise ValueError(f"stof: the mask is {m.q_length} x {m.kv_length}, the "
                         f"attention {q.shape[2]} x {k.shape[2]} (queries x keys)")
    for family in m.warm:
        _ops.family_plan(q, k, v, family, 0.0 if scale is None else float(scale))
    if m.family is None and m.q_offset == 0:
        last["path"] = m.spec
        out = _ops.attention(q, k, v, mask=m.spec, scale=scale, softcap=softcap)
    else:
        if softcap:
            raise ValueError("stof: logit soft-capping with padding, packed "
                             "sequences or a cache offset (a mask family) is not "
                             "supported; without them it is")
        family = m.family or m.spec
        data = m.data_on(q.device)
        if m.q_offset:
            data["q_offset"] = _offsets(q.shape[0], m.q_offset, q.device)
        last["path"] = "family:" + family
        # Later layers of this forward (the same plan: same family, shapes,
        # strides, dtype, scale, device) reuse the format the first built.
        key = (family, tuple(q.shape), tuple(k.shape), q.stride(), k.stride(),
               v.stride(), q.dtype, q.device, scale)
        out = _ops.family_attention(q, k, v, family, scale,
                                    after=m.built.get(key), **data)
        if key not in m.built:
            # Traced, the output itself (it orders the later calls); eager,
            # a marker (holding the tensor would keep its memory).
            m.built[key] = out if torch.compiler.is_compiling() else True
    return out.transpose(1, 2).contiguous()


def _offsets(batch, value, device):
    """An int32 (batch,) tensor of `value` on `device` (cached: the same for
    every layer and forward)."""
    if torch.compiler.is_compiling() or _capturing():
        # Traced or captured: made in the graph (a cached tensor whose fill
        # was only captured would hold nothing for the eager calls).
        return torch.full((batch,), value, dtype=torch.int32, device=device)
    key = (batch, value, device)
    t = _offset_cache.get(key)
    if t is None:
        t = torch.full((batch,), value, dtype=torch.int32, device=device)
        _ops.cache_put(_offset_cache, key, t)
    return t


_offset_cache = {}
# The path the last attention call took ("causal", "family:causal&!prefix",
# "dense+bias", ...): tests and benchmarks print it.
last = {"path": None}


AttentionInterface.register(NAME, stof_attention_forward)
# Registered whenever transformers has the mask interface: without it there,
# transformers would hand an unregistered implementation no mask at all,
# and padding would be attended.
if _mu is not None and hasattr(_mu, "AttentionMaskInterface"):
    _mu.AttentionMaskInterface.register(NAME, stof_mask)
# (older transformers build SDPA-style masks for any implementation: the
# attention then works out the pattern from the tensor)
