"""stof.flex: FlexAttention's mask_mods and BlockMasks as stof masks, and
stof.flex.flex_attention as a drop-in for torch's: causal, sliding-window,
document (a mask_mod indexing a tensor, also per batch element) and
grouped-query problems against an fp32 reference and against torch's
flex_attention on the same inputs; mask_mods that depend on the head are
refused by name; times printed. Skips (exit 77) without PyTorch (with FlexAttention) or a GPU."""
import sys

from gpu_test import require

(flex_mod,) = require("torch.nn.attention.flex_attention")
import torch  # noqa: E402
import stof  # noqa: E402
import stof.flex  # noqa: E402

create_block_mask = flex_mod.create_block_mask
torch_flex = flex_mod.flex_attention

DEV = "cuda"


def reference(q, k, v, allowed):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1).float(), v.repeat_interleave(g, 1).float()
    s = torch.einsum("bhqd,bhkd->bhqk", q.float(), k) * q.shape[-1] ** -0.5
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, -1).nan_to_num(0), v)


def dense(mod, sq, sk, b=0, h=0):
    """The mask_mod over the whole grid at once (the test's own evaluation)."""
    qi = torch.arange(sq, device=DEV)[:, None]
    ki = torch.arange(sk, device=DEV)[None, :]
    bi, hi = torch.tensor(b, device=DEV), torch.tensor(h, device=DEV)
    return torch.broadcast_to(mod(bi, hi, qi, ki), (sq, sk)).bool()


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def ms(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps


def main():
    torch.manual_seed(0)
    flex = torch.compile(torch_flex, dynamic=False)
    S = 2048
    doc = torch.sort(torch.randint(0, 6, (S,), device=DEV)).values
    cases = [
        ("causal", lambda b, h, q, k: q >= k, 2, 8, 8),
        ("sliding window 256", lambda b, h, q, k: (q - k).abs() < 256, 2, 8, 8),
        ("documents, causal", lambda b, h, q, k: (doc[q] == doc[k]) & (q >= k),
         2, 8, 8),
        ("causal, GQA 8/2", lambda b, h, q, k: q >= k, 2, 8, 2),
    ]
    for name, mod, B, H, HKV in cases:
        q = torch.randn(B, H, S, 64, device=DEV, dtype=torch.float16)
        k = torch.randn(B, HKV, S, 64, device=DEV, dtype=torch.float16)
        v = torch.randn(B, HKV, S, 64, device=DEV, dtype=torch.float16)
        bm = create_block_mask(mod, None, None, S, S, device=DEV)
        gqa = HKV != H
        ours = stof.flex.flex_attention(q, k, v, block_mask=bm, enable_gqa=gqa)
        theirs = flex(q, k, v, block_mask=bm, enable_gqa=gqa)
        allowed = dense(mod, S, S)
        ref = reference(q, k, v, allowed)
        e_ours, e_theirs = rel(ours, ref), rel(theirs, ref)
        t_ours = ms(lambda: stof.flex.flex_attention(q, k, v, block_mask=bm,
                                                     enable_gqa=gqa))
        t_theirs = ms(lambda: flex(q, k, v, block_mask=bm, enable_gqa=gqa))
        print(f"{name} {B}x{H}x{S}x64: rel err stof {e_ours:.1e}, flex "
              f"{e_theirs:.1e}; stof {t_ours:.3f} ms, flex {t_theirs:.3f} ms "
              f"({t_theirs / t_ours:.2f}x)")
        if not e_ours < 1e-2:
            print(f"FAIL: {name}: stof's relative error {e_ours:.2e}")
            return 1
    # The same mask_mod function over document ids changed in place (a new
    # batch's documents), with a new BlockMask: the new documents' mask, as
    # torch's flex_attention gives, not the first BlockMask's.
    docs = torch.zeros(S, dtype=torch.int64, device=DEV)

    def doc_mod(b, h, qi, ki):
        return (docs[qi] == docs[ki]) & (qi >= ki)

    q = torch.randn(1, 4, S, 64, device=DEV, dtype=torch.float16)
    k = torch.randn(1, 4, S, 64, device=DEV, dtype=torch.float16)
    v = torch.randn(1, 4, S, 64, device=DEV, dtype=torch.float16)
    for cut in (S // 2, S // 8):
        docs.copy_((torch.arange(S, device=DEV) >= cut).to(torch.int64))
        bm = create_block_mask(doc_mod, None, None, S, S, device=DEV)
        ours = stof.flex.flex_attention(q, k, v, block_mask=bm)
        again = stof.flex.flex_attention(q, k, v, block_mask=bm)  # cached
        ref = reference(q, k, v, dense(doc_mod, S, S))
        e, e2 = rel(ours, ref), rel(again, ref)
        if not (e < 1e-2 and e2 < 1e-2):
            print(f"FAIL: documents split at {cut} (ids changed in place, new "
                  f"BlockMask): relative error {e:.2e}, cached call {e2:.2e}")
            return 1
    print("ok: a new BlockMask over document ids changed in place gives the new mask")
    # The Mask of a mask_mod, without a BlockMask.
    ctx = stof.Context()
    m = stof.flex.mask_from_mask_mod(ctx, lambda b, h, q, k: q >= k, 100, 80)
    if m.shape != (100, 80) or m.digest() != ctx.mask("causal", 100, 80).digest():
        print("FAIL: mask_from_mask_mod(causal) differs from stof's causal")
        return 1
    print("ok: mask_from_mask_mod(causal) equals stof's causal mask")
    # Evaluated a block of rows at a time and packed on the GPU: the same
    # mask as one whole-grid evaluation, at sizes that are not multiples of
    # 8 or of a block, with blocks of a few rows (and of one).
    odd = torch.sort(torch.randint(0, 5, (1500,), device=DEV)).values

    def odd_mod(b, h, qi, ki):
        return (odd[qi] == odd[ki]) & (qi >= ki - 37)

    want = ctx.mask_from_dense(dense(odd_mod, 1000, 1500).cpu()).digest()
    saved = stof.flex._CHUNK
    try:
        for chunk in (1, 7 * 1500, 1 << 24):
            stof.flex._CHUNK = chunk
            got = stof.flex.mask_from_mask_mod(ctx, odd_mod, 1000, 1500)
            if got.digest() != want:
                print(f"FAIL: the mask_mod evaluated in blocks of {chunk} elements "
                      "differs from its whole-grid evaluation")
                return 1
    finally:
        stof.flex._CHUNK = saved
    bits = stof.pack_bits(dense(odd_mod, 1000, 1500), chunk=3000)
    if ctx.mask_from_bits(bits.cpu(), 1500).digest() != want or \
            ctx.mask_from_dense(dense(odd_mod, 1000, 1500)).digest() != want:
        print("FAIL: stof.pack_bits / mask_from_dense of a CUDA tensor differ")
        return 1
    # A long mask: 32k x 32k documents (1 G elements; 128 MB of bits).
    L = 32768
    ldoc = torch.sort(torch.randint(0, 9, (L,), device=DEV)).values
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    import time
    t0 = time.perf_counter()
    big = stof.flex.mask_from_mask_mod(
        ctx, lambda b, h, qi, ki: (ldoc[qi] == ldoc[ki]) & (qi >= ki), L, L)
    secs = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    counts = torch.bincount(ldoc, minlength=9).tolist()
    want_n = sum(c * (c + 1) // 2 for c in counts)
    got_n = round(big.density * L * L)
    print(f"ok: mask_mod evaluated in blocks, packed on the GPU; 32k x 32k "
          f"documents in {secs:.2f} s, {peak:.0f} MiB of GPU memory at most")
    if got_n != want_n:
        print(f"FAIL: 32k documents mask has {got_n} elements, expected {want_n}")
        return 1
    if peak > 512:
        print(f"FAIL: evaluating a 32k mask took {peak:.0f} MiB of GPU memory")
        return 1
    # Masks per sequence (documents per batch element): the `bitmap`
    # family with each sequence's words, whether the BlockMask was made per
    # batch element or broadcast; grouped-query too; odd lengths.
    for B, H, HKV, SL, per_b in ((3, 4, 4, 1000, True), (3, 8, 2, 1024, False)):
        docs_b = torch.sort(torch.randint(0, 4, (B, SL), device=DEV), dim=1).values

        def mod_b(b, h, qi, ki):
            return (docs_b[b, qi] == docs_b[b, ki]) & (qi >= ki)

        q = torch.randn(B, H, SL, 64, device=DEV, dtype=torch.float16)
        k = torch.randn(B, HKV, SL, 64, device=DEV, dtype=torch.float16)
        v = torch.randn(B, HKV, SL, 64, device=DEV, dtype=torch.float16)
        bm = create_block_mask(mod_b, B if per_b else None, None, SL, SL, device=DEV)
        gqa = HKV != H
        ours = stof.flex.flex_attention(q, k, v, block_mask=bm, enable_gqa=gqa)
        again = stof.flex.flex_attention(q, k, v, block_mask=bm, enable_gqa=gqa)
        allowed = torch.stack([dense(mod_b, SL, SL, b=b) for b in range(B)])[:, None]
        ref = reference(q, k, v, allowed)
        e, e2 = rel(ours, ref), rel(again, ref)
        line = f"per-sequence documents {B}x{H}x{SL}x64 (K/V heads {HKV}, " \
               f"BlockMask {'per batch' if per_b else 'broadcast'}): rel err {e:.1e}"
        if per_b:
            theirs = flex(q, k, v, block_mask=bm, enable_gqa=gqa)
            t_ours = ms(lambda: stof.flex.flex_attention(q, k, v, block_mask=bm,
                                                         enable_gqa=gqa))
            t_theirs = ms(lambda: flex(q, k, v, block_mask=bm, enable_gqa=gqa))
            line += (f", flex {rel(theirs, ref):.1e}; stof {t_ours:.3f} ms, flex "
                     f"{t_theirs:.3f} ms ({t_theirs / t_ours:.2f}x)")
        print(line)
        if not (e < 1e-2 and e2 < 1e-2):
            print(f"FAIL: per-sequence masks: relative error {e:.2e} / {e2:.2e}")
            return 1
    # Inference only: in grad mode the per-sequence path is recorded and its
    # backward raises by name (training must not leave q untrained).
    qg = q.clone().requires_grad_()
    out = stof.flex.flex_attention(qg, k, v, block_mask=bm, enable_gqa=gqa)
    try:
        if not out.requires_grad:
            raise AssertionError("not recorded")
        out.float().sum().backward()
    except RuntimeError as e:
        if "inference" not in str(e):
            print(f"FAIL: per-sequence backward: unclear error {e}")
            return 1
        print("ok: the per-sequence path's backward raises by name")
    except AssertionError:
        print("FAIL: per-sequence output in grad mode is not recorded by autograd")
        return 1
    else:
        print("FAIL: per-sequence backward ran")
        return 1
    # A mask_mod that depends on the head is refused by name.
    q = torch.randn(2, 4, 256, 64, device=DEV, dtype=torch.float16)
    bm = create_block_mask(lambda b, h, qi, ki: (qi >= ki) | (h == 3), None, 4,
                           256, 256, device=DEV)
    try:
        stof.flex.flex_attention(q, q, q, block_mask=bm)
    except NotImplementedError as e:
        if "depends on the head" not in str(e):
            print(f"FAIL: unclear refusal: {e}")
            return 1
        print("ok: a head-dependent mask_mod is refused by name")
    else:
        print("FAIL: a head-dependent mask_mod was accepted")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
