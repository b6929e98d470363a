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
create_block_mask does. A mask_mod that depends on the batch element (say
documents per sequence) runs as the `bitmap` mask family, each sequence's
mask packed to words on the GPU. Every sequence is evaluated when the
BlockMask was made per batch element (create_block_mask(mod, B, ...));
for a broadcast one (B=None) the first and last sequences are compared
and, where they differ, all are evaluated. One found to depend on the
head (heads 0, H/2 and H-1 are compared) is refused by name. score_mod
functions are not translated: use stof.attention's softcap= and bias=.
"""
import torch

from . import ops as _ops
from . import _MaskData, pack_bits as _pack_bits

# (id(block_mask), batch, Sq, Sk, device) -> (block_mask, kind, value) of
# _mask_of; the entry holds the BlockMask, so its id is not reused while it
# is cached
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


def _block_dims(block_mask):
    """The batch and head sizes a BlockMask was made for (1: broadcast)."""
    t = getattr(block_mask, "kv_num_blocks", None)
    if t is None or t.dim() < 2:
        return 1, 1
    return int(t.shape[0]), int(t.shape[1])


def _head_dependent(b, h):
    return NotImplementedError(
        "stof.flex: this mask_mod depends on the head "
        f"(h={h} differs from h=0 at b={b}); stof's masks apply to every head "
        "(per-sequence masks are supported)")


def _mask_of(block_mask, mask_mod, batch, heads, seq_q, seq_k, device):
    """The stof form of block_mask's mask_mod, evaluated once per BlockMask,
    size and device: ("name", the stof.ops name of its 2-D mask) when it is
    the same for every sequence, or ("bitmap", int32 words (batch, seq_q,
    ceil(seq_k / 32)), each sequence's mask for the `bitmap` family).
    Every sequence is evaluated when the BlockMask was made per batch
    element (create_block_mask(mod, B, ...)), the first and last ones
    otherwise; a mask_mod found to depend on the head is refused."""
    key = (id(block_mask), batch, seq_q, seq_k, str(device))
    hit = _from_blocks.get(key)
    if hit is not None and hit[0] is block_mask and (
            hit[1] != "name" or hit[2] in _ops._registered):
        return hit[1], hit[2]
    bm_batch, bm_heads = _block_dims(block_mask)
    first = _evaluate(mask_mod, seq_q, seq_k, device, 0, 0)
    checked_heads = sorted({heads - 1, heads // 2} - {0}) if heads > 1 else []
    for h in checked_heads:
        if not torch.equal(first, _evaluate(mask_mod, seq_q, seq_k, device, 0, h)):
            raise _head_dependent(0, h)
    rows = [first]
    which = range(1, batch) if bm_batch > 1 else ([batch - 1] if batch > 1 else [])
    for b in which:
        rows.append(_evaluate(mask_mod, seq_q, seq_k, device, b, 0))
    if all(torch.equal(first, r) for r in rows[1:]):
        ctx = _ops._context(first.device.index if first.device.index is not None
                            else torch.cuda.current_device())
        entry = ("name", _ops.register_mask(ctx.mask_from_bits(first.cpu().numpy(),
                                                               seq_k)))
    else:
        if bm_batch <= 1:  # (only the last one was evaluated)
            rows = [first] + [_evaluate(mask_mod, seq_q, seq_k, device, b, 0)
                              for b in range(1, batch)]
        last = rows[-1]
        for h in checked_heads:
            if not torch.equal(last, _evaluate(mask_mod, seq_q, seq_k, device,
                                               batch - 1, h)):
                raise _head_dependent(batch - 1, h)
        words = (seq_k + 31) // 32
        bits = torch.zeros((batch, seq_q, 4 * words), dtype=torch.uint8, device=device)
        for b, r in enumerate(rows):
            bits[b, :, :r.shape[1]] = r
        # little-endian bytes: bit k % 32 of word k // 32, as pack_bitmap
        entry = ("bitmap", bits.view(torch.int32))
    # (a few BlockMasks: a loop making one a step keeps no more alive)
    with _ops._lock:
        while len(_from_blocks) >= _MAX_BLOCK_MASKS:
            _from_blocks.pop(next(iter(_from_blocks)))
        _from_blocks[key] = (block_mask,) + entry
    return entry


# (shapes, strides, dtypes, devices, scale) -> the `bitmap` family's plan
_bitmap_plans = {}


def _clear():
    """Forget the BlockMasks' masks and the bitmap plans (stof.ops.clear_cache)."""
    with _ops._lock:
        _from_blocks.clear()
        _bitmap_plans.clear()


def _bitmap_impl(query, key, value, bits, scale):
    """Attention with each sequence's own mask: the `bitmap` mask family's
    plan (made once per shapes; its kernel chosen on the first call's
    sequence 0), run with these words (batch, seq_q, words)."""
    if bits.dim() != 3 or bits.dtype != torch.int32 or not bits.is_contiguous() \
            or bits.device != query.device or bits.shape[0] != query.shape[0] \
            or bits.shape[1] < query.shape[2] or 32 * bits.shape[2] < key.shape[2]:
        raise ValueError("stof.flex: the bitmap words must be a contiguous int32 "
                         "(batch, >= seq_q, >= seq_k / 32) tensor on q's device")
    out = torch.empty_like(query)
    ck = (query.shape, key.shape, value.shape, query.stride(), key.stride(),
          value.stride(), query.dtype, key.dtype, value.dtype, query.device,
          key.device, value.device, scale)
    p = _bitmap_plans.get(ck)
    if p is None:
        _ops._not_capturing()  # (the plan reads its sample on the host)
        p = _ops.family_plan(query, key, value, "bitmap", scale, out,
                             sample={"bitmap": bits[0].cpu()})
        p._check_tensors(query, key, value, out, None)
        with _ops._lock:
            _ops.cache_put(_bitmap_plans, ck, p)
    if _ops._is_capturing():
        # (a graph replays the plan and reads these words)
        _ops._pin(p)
        _ops._pin(bits)
    md = _MaskData()
    md.bitmap = bits.data_ptr()
    md.bitmap_words = bits.shape[2]
    md.bitmap_stride = bits.shape[1] * bits.shape[2]
    s = _ops._raw_stream(query.device)
    with _ops._plan_lock(p):
        _ops._ordered(p, s, query.device)
        return p._launch_family(query, key, value, out, md, 0, s)


@torch.library.custom_op("stof::attention_bitmap", mutates_args=())
def _attention_bitmap(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      bits: torch.Tensor, scale: float) -> torch.Tensor:
    return _bitmap_impl(q, k, v, bits, scale)


@_attention_bitmap.register_fake
def _attention_bitmap_fake(q, k, v, bits, scale):
    return torch.empty_like(q)


_attention_bitmap.register_autograd(_ops._no_backward, setup_context=_ops._no_context)


def _bitmap_attention(query, key, value, bits, scale):
    """Per-sequence masks: the operator where autograd records the call or
    torch.compile traces it (its backward raises by name), else the same
    implementation directly."""
    sc = 0.0 if scale is None else float(scale)
    if _ops._dispatched(query, key, value):
        return torch.ops.stof.attention_bitmap(query, key, value, bits, sc)
    return _bitmap_impl(query, key, value, bits, sc)


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
        kind, mask = _mask_of(block_mask, mask_mod, query.shape[0], query.shape[1],
                              sq, sk, query.device)
        if kind == "bitmap":
            return _bitmap_attention(query, key, value, mask, scale)
    return _ops.attention(query, key, value, mask=mask, scale=scale)
