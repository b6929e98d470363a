"""FlexAttention interop: stof masks from FlexAttention mask_mods and
BlockMasks, and a flex_attention-shaped call, so that a FlexAttention user
switches with one line:

    from stof.flex import flex_attention        # instead of torch's
    out = flex_attention(q, k, v, block_mask=block_mask)

The mask_mod (a BlockMask's, or one given) is evaluated on the GPU over the
(Sq, Sk) grid once per BlockMask and size, a block of rows at a time and
packed to bits there (about 16M elements at once, so a 32k x 32k mask needs
no 1 GB temporaries and moves 128 MB to the host), and becomes a stof Mask
(registered with stof.ops by its bits, so equal masks share
stof.attention's plans). A new BlockMask is evaluated again even when its
mask_mod is the same function: a mask_mod that reads a tensor (document
ids, lengths) changed in place since gives its new mask, as
create_block_mask does. Masks that depend on the batch element or head are refused by
name (stof's 2-D masks apply to every (b, h); its mask families cover
per-sequence data). score_mod functions are not translated: use
stof.attention's softcap= and bias=.
"""
import torch

from . import ops as _ops
from . import pack_bits as _pack_bits

# (id(block_mask), Sq, Sk, device) -> (block_mask, registered name); the
# entry holds the BlockMask, so its id is not reused while it is cached
_from_blocks = {}
_MAX_BLOCK_MASKS = 16


def mask_from_mask_mod(ctx, mask_mod, seq_q, seq_k, device="cuda", b=0, h=0):
    """A stof Mask from a FlexAttention mask_mod(b, h, q_idx, kv_idx) -> bool,
    evaluated on `device` over the (seq_q, seq_k) grid for batch element b
    and head h (broadcasting index tensors, as FlexAttention's own
    create_mask does)."""
    bits = _evaluate(mask_mod, seq_q, seq_k, device, b, h)
    return ctx.mask_from_bits(bits.cpu().numpy(), seq_k)


# elements of the (Sq, Sk) grid a mask_mod is evaluated on at once
_CHUNK = 1 << 24


def _evaluate(mask_mod, seq_q, seq_k, device, b, h):
    """mask_mod over the grid for (b, h), packed to bits a block of rows at
    a time: uint8 (seq_q, ceil(seq_k / 8)) on device (stof.pack_bits)."""
    out = torch.empty((seq_q, (seq_k + 7) // 8), dtype=torch.uint8, device=device)
    ki = torch.arange(seq_k, device=device)[None, :]
    bi = torch.tensor(b, device=device)
    hi = torch.tensor(h, device=device)
    step = max(1, _CHUNK // seq_k)
    for r0 in range(0, seq_q, step):
        r1 = min(seq_q, r0 + step)
        qi = torch.arange(r0, r1, device=device)[:, None]
        m = torch.broadcast_to(mask_mod(bi, hi, qi, ki), (r1 - r0, seq_k))
        out[r0:r1] = _pack_bits(m, chunk=_CHUNK)
    return out


def _registered_name(block_mask, mask_mod, batch, heads, seq_q, seq_k, device):
    """The stof.ops name of the mask of block_mask's mask_mod (evaluated once
    per BlockMask, size and device; refused when it depends on b or h)."""
    key = (id(block_mask), seq_q, seq_k, str(device))
    hit = _from_blocks.get(key)
    if hit is not None and hit[0] is block_mask and hit[1] in _ops._registered:
        return hit[1]
    first = _evaluate(mask_mod, seq_q, seq_k, device, 0, 0)
    for b, h in ((batch - 1, 0), (0, heads - 1), (batch - 1, heads - 1)):
        if (b, h) != (0, 0) and not torch.equal(
                first, _evaluate(mask_mod, seq_q, seq_k, device, b, h)):
            raise NotImplementedError(
                "stof.flex: this mask_mod depends on the batch element or head "
                f"(b={b}, h={h} differs from b=0, h=0); stof's masks apply to "
                "every (b, h): use a stof mask family for per-sequence data")
    ctx = _ops._context(first.device.index if first.device.index is not None
                        else torch.cuda.current_device())
    name = _ops.register_mask(ctx.mask_from_bits(first.cpu().numpy(), seq_k))
    # (a few BlockMasks: a loop making one a step keeps no more alive)
    while len(_from_blocks) >= _MAX_BLOCK_MASKS:
        _from_blocks.pop(next(iter(_from_blocks)))
    _from_blocks[key] = (block_mask, name)
    return name


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, kernel_options=None):
    """torch.nn.attention.flex_attention's call, computed by stof: query
    (B, H, Sq, D), key and value (B, Hkv, Sk, D) (Hkv < H needs
    enable_gqa=True, as in FlexAttention); block_mask: a BlockMask (its
    mask_mod is used) or None (no mask). Returns the output (B, H, Sq, D).
    score_mod, return_lse and kernel_options are not supported (a clear
    error)."""
    if score_mod is not None:
        raise NotImplementedError("stof.flex: score_mod functions are not "
                                  "translated; use stof.attention(softcap=, "
                                  "bias=)")
    if return_lse or kernel_options:
        raise NotImplementedError("stof.flex: return_lse and kernel_options are "
                                  "not supported")
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError("key/value have fewer heads than query: pass "
                         "enable_gqa=True (as FlexAttention requires)")
    sq, sk = query.shape[2], key.shape[2]
    if block_mask is None:
        mask = "dense"
    else:
        mask_mod = getattr(block_mask, "mask_mod", None)
        if mask_mod is None:
            raise ValueError("stof.flex: the BlockMask has no mask_mod")
        mask = _registered_name(block_mask, mask_mod, query.shape[0], query.shape[1], sq, sk,
                                query.device)
    return _ops.attention(query, key, value, mask=mask, scale=scale)
