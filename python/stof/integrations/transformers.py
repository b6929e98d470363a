"""stof as an attention backend of Hugging Face transformers.

    import stof.integrations.transformers  # registers "stof"
    model = AutoModel.from_config(cfg, attn_implementation="stof")
    # or AutoModelForCausalLM.from_pretrained(name, attn_implementation="stof")

Importing this module registers "stof" with transformers' AttentionInterface
(and, where transformers has one, its AttentionMaskInterface, with the SDPA
mask builder: a boolean 4-D mask, or None when the mask is plain causal or
full). The attention runs through stof.attention (a torch.library operator,
so models compile with torch.compile):
  - no mask tensor: stof's "causal" (or "dense" for bidirectional layers,
    and single-token decode steps) structured kernels;
  - a mask tensor: when it equals one of those patterns, or the layer's
    causal sliding window ("causal_sliding:W"), in every batch element and
    head (checked on the GPU once per forward), that structured kernel;
    otherwise (padding, anything else) an additive bias (0 / -inf) on the
    dense pattern. Either is worked out once per forward and shared by the
    layers.
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

# The last mask converted to a bias: layers of one forward pass share it.
_last = {"key": None, "plan": None}
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


def _mask_plan(mask, dtype, seq_k, window):
    """(spec, bias) for a transformers mask, boolean (True = attend) or
    additive: a structured spec and no bias when the mask is one (see
    _pattern), else "dense" and an additive bias in q's dtype (key
    dimension padded to a multiple of 8 elements). Cached for the same mask
    tensor (same storage and version) and window."""
    key = (mask.data_ptr(), mask._version, tuple(mask.shape), mask.dtype, dtype,
           seq_k, window)
    if _last["key"] == key:
        return _last["plan"]
    mask = mask[..., :seq_k]
    allowed = mask if mask.dtype == torch.bool else mask == 0
    spec = _pattern(allowed, window)
    if spec is not None:
        plan = (spec, None)
    elif mask.dtype == torch.bool:
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        bias.masked_fill_(~mask, float("-inf"))
        plan = ("dense", pad_bias(bias))
    else:
        plan = ("dense", pad_bias(mask.to(dtype)))
    _last["key"], _last["plan"] = key, plan
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
    out = _ops.attention(query, key, value, mask=spec, scale=scaling, bias=bias)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, stof_attention_forward)
try:
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionMaskInterface.register(NAME, sdpa_mask)
except ImportError:  # older transformers build masks for any implementation
    pass
