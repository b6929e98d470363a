"""Mask-family instance data from Python, against PyTorch in fp32 (issue
12): packed sequences (Context.attention_plan_packed with cu_seqlens, runs
on fewer rows than planned), a per-sequence bitmap made by
stof.pack_bitmap from boolean masks, and a window per head
(head_sliding with head_window). Each plan is made once and run on several
instances; outputs are poisoned first, every sequence and head is compared
with masked softmax attention in fp32, and the rows stof must not write
are checked untouched.

Exit status 77 (skipped) without torch or a GPU."""
import os
import tempfile

from gpu_test import require

require()
import torch  # noqa: E402
import stof  # noqa: E402

TOL = 2e-3  # fp16, as the C suites


def attend(q, k, v, allowed):
    """fp32 attention of (H, Sq, D) x (H, Sk, D) with a (H or 1, Sq, Sk)
    bool mask; rows with no key give 0."""
    s = torch.einsum("hqd,hkd->hqk", q.float(), k.float()) / q.shape[-1] ** 0.5
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("hqk,hkd->hqd", p, v.float())


def rel(a, b):
    return ((a.float() - b).norm() / b.norm().clamp_min(1e-30)).item()


def packed(ctx, gen):
    H, D, B, T = 4, 64, 5, 1400
    q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.float16, generator=gen)
               for _ in range(3))
    out = torch.empty_like(q)
    fam = ctx.mask_family("causal|prefix")

    def offsets():
        lens = torch.randint(0, 280, (B,), generator=gen, device="cuda").tolist()
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        return cu
    plan = ctx.attention_plan_packed(q, k, v, fam, offsets(), prefix=[3] * B)
    assert plan.describe()["family"]["packed_sequences"] == B
    worst = worst_lse = 0.0
    for it in range(3):
        cu = offsets()
        tot = cu[-1] + 17  # rows past the last sequence: zeros
        prefix = torch.randint(0, 40, (B,), generator=gen, device="cuda",
                               dtype=torch.int32)
        out.fill_(float("nan"))
        # The log-sum-exp too on one instance: (heads, total_q).
        lse = torch.full((H, tot), 7.0, device="cuda") if it == 1 else None
        plan.run(q[:tot], k[:tot], v[:tot], out[:tot],
                 torch.tensor(cu, dtype=torch.int32, device="cuda"), prefix=prefix,
                 lse=lse)
        if lse is not None:
            assert bool(torch.isinf(lse[:, cu[-1]:]).all()), "lse past the sequences"
            for b in range(B):
                a, e = cu[b], cu[b + 1]
                if e == a:
                    continue
                n = e - a
                pos = torch.arange(n, device="cuda")
                allowed = (pos[None, :] <= pos[:, None]) | (pos[None, :] < prefix[b])
                sc = torch.einsum("qhd,khd->hqk", q[a:e].float(), k[a:e].float()) / D ** 0.5
                want = sc.masked_fill(~allowed[None], float("-inf")).logsumexp(-1)
                err = (lse[:, a:e] - want).abs().max().item()
                assert err < 5e-3, "lse of sequence %d: %g" % (b, err)
                worst_lse = max(worst_lse, err)
        for b in range(B):
            a, e = cu[b], cu[b + 1]
            if e == a:
                continue
            n = e - a
            pos = torch.arange(n, device="cuda")
            allowed = (pos[None, :] <= pos[:, None]) | (pos[None, :] < prefix[b])
            ref = attend(q[a:e].transpose(0, 1), k[a:e].transpose(0, 1),
                         v[a:e].transpose(0, 1), allowed[None])
            err = rel(out[a:e].transpose(0, 1), ref)
            assert err < TOL, "packed sequence %d (%d rows): %g" % (b, n, err)
            worst = max(worst, err)
        assert bool((out[cu[-1]:tot] == 0).all()), "rows past the sequences not 0"
        assert bool(torch.isnan(out[tot:]).all()), "rows past total written"
    print("packed: worst relative error %.2e, lse %.2e" % (worst, worst_lse))


def bitmap_and_heads(ctx, gen):
    B, H, S, D = 3, 4, 300, 64
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16, generator=gen)
               for _ in range(3))
    out = torch.empty_like(q)
    pos = torch.arange(S, device="cuda")

    # A bitmap per sequence (a random band), ANDed with causal.
    def bits():
        band = torch.randint(1, 120, (B, 1, 1), generator=gen, device="cuda")
        keep = torch.rand(B, S, S, generator=gen, device="cuda") < 0.8
        return ((pos[None, :, None] - pos[None, None, :]).abs() < band) & keep
    fam = ctx.mask_family("causal&bitmap")
    m0 = bits()
    plan = ctx.attention_plan_family(q, k, v, fam,
                                     sample={"bitmap": stof.pack_bitmap(m0).cpu()})
    worst = 0.0
    for _ in range(3):
        m = bits()
        out.fill_(float("nan"))
        plan.run(q, k, v, out, bitmap=stof.pack_bitmap(m))
        causal = pos[None, :] <= pos[:, None]
        for b in range(B):
            err = rel(out[b], attend(q[b], k[b], v[b], (m[b] & causal)[None]))
            assert err < TOL, "bitmap sequence %d: %g" % (b, err)
            worst = max(worst, err)
    print("bitmap: worst relative error %.2e" % worst)

    # A window per head, with per-sequence lengths.
    fam = ctx.mask_family("head_sliding")
    plan = ctx.attention_plan_family(q, k, v, fam,
                                     sample={"head_window": [8, 32, 64, 200]})
    worst = 0.0
    for _ in range(3):
        win = torch.randint(0, 150, (H,), generator=gen, device="cuda",
                            dtype=torch.int32)
        lens = torch.randint(1, S + 1, (B,), generator=gen, device="cuda",
                             dtype=torch.int32)
        out.fill_(float("nan"))
        plan.run(q, k, v, out, head_window=win, q_len=lens, k_len=lens)
        for b in range(B):
            n = int(lens[b])
            d = (pos[:n, None] - pos[None, :n]).abs()
            allowed = d[None] < win[:, None, None]
            ref = attend(q[b, :, :n], k[b, :, :n], v[b, :, :n], allowed)
            got = out[b, :, :n]
            bad = ~torch.isfinite(got)
            assert not bool(bad.any()), "head windows: non-finite output"
            err = rel(got, ref)
            assert err < TOL, "head windows, sequence %d: %g" % (b, err)
            assert bool((out[b, :, n:] == 0).all()), "padding rows not 0"
            worst = max(worst, err)
    print("head windows: worst relative error %.2e" % worst)


def main():
    gen = torch.Generator(device="cuda").manual_seed(12)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = stof.Context(user_db=os.path.join(tmp, "t.db"),
                           tuning_mode="cache-only")
        packed(ctx, gen)
        bitmap_and_heads(ctx, gen)
    print("ok")


if __name__ == "__main__":
    main()
