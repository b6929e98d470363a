"""stof as an attention backend of Hugging Face transformers.

    import stof.integrations.transformers  # registers "stof"
    model = AutoModel.from_config(cfg, attn_implementation="stof")
    # or AutoModelForCausalLM.from_pretrained(name, attn_implementation="stof")

Importing this module registers "stof" with transformers' AttentionInterface
(and, where transformers has one, its AttentionMaskInterface, with the SDPA
mask builder: a boolean 4-D mask, or None when the mask is plain causal or
full). Eager use: working out a mask tensor's pattern reads it on the host
once per forward, so torch.compile(fullgraph=True) of a model with a mask
breaks the graph there (stof.attention itself compiles). The attention:
  - no mask tensor: stof's "causal" (or "dense" for bidirectional layers,
    and single-token decode steps) structured kernels;
  - a mask tensor: when it equals one of those patterns, or the layer's
    causal sliding window ("causal_sliding:W"), in every batch element and
    head (checked on the GPU once per forward), that structured kernel;
    when it is full or causal attention over each sequence's first k_len
    keys (right padding), stof's "dense" / "causal" mask family with the
    lengths as this batch's data (padded keys are skipped, not computed);
    otherwise an additive bias (0 / -inf) on the dense pattern. The choice
    is made once per forward and shared by the layers.
Inference only: dropout must be 0 (model.eval()). Attention weights are not
returned (None), as with SDPA.
"""
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

# The last mask worked out, and the tensor itself: held, its memory cannot
# be handed to the next batch's mask, so a later mask at the same address
# is a view of this one (layers slice the forward pass's mask).
_last = {"mask": None, "key": None, "plan": None}
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


def _mask_plan(mask, dtype, seq_k, window):
    """(spec, extra) for a transformers mask, boolean (True = attend) or
    additive: a structured spec and None when the mask is one (see
    _pattern); "family:<spec>" and the lengths for right or left padding
    (_padding: ("k_len" or "prefix", int32 lengths)); else "dense" and an
    additive bias
    in q's dtype (key dimension padded to a multiple of 8 elements).
    Cached for the same mask memory (address, shape, strides; the version
    counter where tensors have one: not under torch.inference_mode) and
    the same dtype, seq_k and window."""
    try:
        version = mask._version
    except RuntimeError:  # inference tensors have no version counter
        version = None
    key = (mask.data_ptr(), tuple(mask.shape), tuple(mask.stride()), mask.dtype,
           version, dtype, seq_k, window)
    if _last["key"] == key:
        return _last["plan"]
    mask = mask[..., :seq_k]
    allowed = mask if mask.dtype == torch.bool else mask == 0
    spec = _pattern(allowed, window)
    padded = None if spec is not None else _padding(allowed, window)
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
    _last["mask"], _last["key"], _last["plan"] = mask, key, plan
    return plan


def stof_attention_forward(module, query, key, value, attention_mask,
                           dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention interface: query (B, H, Sq, D), key and value
    (B, Hkv, Sk, D); returns ((B, Sq, H, D), None)."""
    if dropout:
        raise ValueError("stof attention is for inference: dropout must be 0 "
                         "(call model.eval())")
    calls[0] += 1
    seq_q, seq_k = query.shape[2], key.shape[2]
    bias = None
    if attention_mask is not None:
        window = kwargs.get("sliding_window") or getattr(module, "sliding_window",
                                                         None)
        spec, bias = _mask_plan(attention_mask, query.dtype, seq_k, window)
    else:
        if is_causal is None:
            is_causal = getattr(module, "is_causal", True)
        spec = "causal" if (is_causal and seq_q > 1) else "dense"
    if spec.startswith("family:"):
        out = _family_attention(query, key, value, spec[7:], bias, scaling)
    else:
        out = _ops.attention(query, key, value, mask=spec, scale=scaling,
                             bias=bias)
    return out.transpose(1, 2).contiguous(), None




def _family_attention(q, k, v, family, lengths, scale):
    """Attention over mask family `family` with this batch's lengths
    (("k_len" or "prefix", int32 CUDA tensor)): stof.attention's family
    path (a family plan per shape, strides and dtype, made once)."""
    name, t = lengths
    return _ops._family_impl(q, k, v, family,
                             0.0 if scale is None else float(scale), None,
                             t if name == "k_len" else None,
                             prefix=t if name == "prefix" else None)


AttentionInterface.register(NAME, stof_attention_forward)
try:
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionMaskInterface.register(NAME, sdpa_mask)
except ImportError:  # older transformers build masks for any implementation
    pass
