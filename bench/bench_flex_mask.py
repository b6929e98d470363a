"""What stof.flex costs a FlexAttention user per new mask: the stof mask of
a mask_mod (stof.flex.mask_from_mask_mod) at long lengths, its time and
the GPU memory it takes at its peak (above the inputs), and a
flex_attention call with a new BlockMask whose mask is already planned
(evaluation, the batch/head check, registration, the cached plan, the
kernel); and a mask per sequence (documents per batch element, the
`bitmap` family) against compiled FlexAttention. The mask_mod: causal attention within documents, `(doc[q] ==
doc[k]) & (q >= k)` over 9 sorted random document ids. Each case runs
--reps times; the first call of a size includes PyTorch's warm-up.

Usage: python bench/bench_flex_mask.py [--sizes 8192,16384,32768]
       [--reps 3] [--call-len 16384] [--heads 8] [--per-seq 8x16x4096]
"""
import argparse
import sys
import time

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0] + "/python")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8192,16384,32768",
                    help="mask sizes L (an L x L mask each)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--call-len", type=int, default=16384,
                    help="sequence length of the flex_attention calls (0: none)")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--per-seq", default="8x16x4096",
                    help="B x H x L of a per-sequence document mask (the bitmap "
                    "family) timed against FlexAttention ('' : none)")
    args = ap.parse_args()
    import torch
    import stof
    import stof.flex
    if not torch.cuda.is_available():
        print("bench_flex_mask: needs a CUDA GPU")
        return 77
    from torch.nn.attention.flex_attention import create_block_mask
    print("stof", stof.__version__, "library", stof.library_path())
    ctx = stof.Context()
    torch.manual_seed(0)
    for L in (int(x) for x in args.sizes.split(",")):
        doc = torch.sort(torch.randint(0, 9, (L,), device="cuda")).values

        def mod(b, h, qi, ki):
            return (doc[qi] == doc[ki]) & (qi >= ki)

        for rep in range(args.reps):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            m = stof.flex.mask_from_mask_mod(ctx, mod, L, L)
            t = time.perf_counter() - t0
            peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
            print(f"mask_from_mask_mod {L} x {L}, call {rep + 1}: {t * 1e3:.1f} ms, "
                  f"GPU peak {peak:.0f} MiB, digest {m.digest()}", flush=True)
            del m
    L = args.call_len
    if L:
        doc = torch.sort(torch.randint(0, 9, (L,), device="cuda")).values

        def mod(b, h, qi, ki):
            return (doc[qi] == doc[ki]) & (qi >= ki)

        q = torch.randn(1, args.heads, L, 64, device="cuda", dtype=torch.float16)
        for rep in range(args.reps + 1):
            bm = create_block_mask(mod, None, None, L, L, device="cuda")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            stof.flex.flex_attention(q, q, q, block_mask=bm)
            torch.cuda.synchronize()
            print(f"flex_attention, a new BlockMask, 1 x {args.heads} x {L} x 64, "
                  f"call {rep + 1}{' (plans)' if rep == 0 else ''}: "
                  f"{(time.perf_counter() - t0) * 1e3:.1f} ms", flush=True)
    if args.per_seq:
        B, H, L = (int(x) for x in args.per_seq.split("x"))
        docs = torch.sort(torch.randint(0, 9, (B, L), device="cuda"), dim=1).values

        def mod_b(b, h, qi, ki):
            return (docs[b, qi] == docs[b, ki]) & (qi >= ki)

        q, k, v = (torch.randn(B, H, L, 64, device="cuda", dtype=torch.float16)
                   for _ in range(3))
        from torch.nn.attention.flex_attention import flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
        bm = create_block_mask(mod_b, B, None, L, L, device="cuda")
        for rep in range(args.reps + 1):
            bm = create_block_mask(mod_b, B, None, L, L, device="cuda")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            o = stof.flex.flex_attention(q, k, v, block_mask=bm)
            torch.cuda.synchronize()
            print(f"per-sequence documents {B} x {H} x {L} x 64, a new BlockMask, "
                  f"call {rep + 1}{' (plans)' if rep == 0 else ''}: "
                  f"{(time.perf_counter() - t0) * 1e3:.1f} ms", flush=True)
        ref = flex(q, k, v, block_mask=bm)
        err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()

        def timed(fn, reps=20):
            for _ in range(3):
                fn()
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / reps

        for rnd in range(2):
            ts = timed(lambda: stof.flex.flex_attention(q, k, v, block_mask=bm))
            tf = timed(lambda: flex(q, k, v, block_mask=bm))
            print(f"per-sequence documents {B} x {H} x {L} x 64, same BlockMask, "
                  f"round {rnd + 1}: stof {ts:.3f} ms, FlexAttention (compiled) "
                  f"{tf:.3f} ms: {tf / ts:.2f}x; relative difference {err:.1e}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
