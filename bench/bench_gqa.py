"""Grouped-query attention (desc.kv_heads, issue 13): stof with K/V of
kv_heads heads against the same stof problem with K/V heads expanded
(repeat_interleave), FlexAttention with enable_gqa=True and SDPA with
enable_gqa=True (bool mask, or is_causal for causal), in one process on
the same tensors. Kernel times: triton.testing.do_bench (median, L2
flushed), GQA and expanded timed in --rounds interleaved rounds of
alternating order (median), and --pairs single launches of each back to
back (alternating which goes first), each pair's ratio taken while the
GPU's clocks are the same for both (median of the ratios; no L2 flush).
Errors against an fp32 reference on the expanded problem.

Usage: python bench/bench_gqa.py [--shapes 1x32x8x8192x128,...]
       [--masks causal,sliding:1024,bigbird:64:3:2:3:1] [--dtype bf16|fp16]
       [--rounds N] [--pairs N] [--json FILE]
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0] + "/python")
import stof  # noqa: E402


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def pair_ratios(fa, fb, n):
    """Median over n back-to-back pairs of (time of fb) / (time of fa),
    single launches timed with CUDA events, the order alternating."""
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    ratios = []
    for i in range(n):
        first, second = (fa, fb) if i % 2 == 0 else (fb, fa)
        ev[0].record()
        first()
        ev[1].record()
        second()
        ev[2].record()
        ev[2].synchronize()
        t1, t2 = ev[0].elapsed_time(ev[1]), ev[1].elapsed_time(ev[2])
        ta, tb = (t1, t2) if i % 2 == 0 else (t2, t1)
        ratios.append(tb / ta)
    return statistics.median(ratios)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x32x8x8192x128,4x32x8x4096x128,1x32x4x16384x128")
    ap.add_argument("--masks", default="causal,sliding:1024,bigbird:64:3:2:3:1")
    ap.add_argument("--dtype", default="bf16", choices=["fp16", "bf16"])
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved timing rounds of GQA and expanded (median)")
    ap.add_argument("--pairs", type=int, default=0,
                    help="back-to-back launch pairs of GQA and expanded (median "
                    "of the per-pair ratios; 0: none)")
    ap.add_argument("--json")
    args = ap.parse_args()
    dt = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flex = torch.compile(flex_attention, dynamic=False)
    ctx = stof.Context()
    dev = ctx.device()
    print(f"# {dev['name']}, driver {dev.get('driver_version')}, torch {torch.__version__}",
          flush=True)
    rows = []
    for shape in args.shapes.split(","):
        B, H, KV, N, D = (int(x) for x in shape.split("x"))
        g = H // KV
        q = torch.randn(B, H, N, D, device="cuda", dtype=dt)
        k = torch.randn(B, KV, N, D, device="cuda", dtype=dt)
        v = torch.randn(B, KV, N, D, device="cuda", dtype=dt)
        ke, ve = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        out, out2 = torch.empty_like(q), torch.empty_like(q)
        for spec in args.masks.split(","):
            m = ctx.mask(spec, N, N)
            r = {"shape": shape, "mask": spec}
            p = ctx.attention_plan(q, k, v, m, out=out)
            pe = ctx.attention_plan(q, ke, ve, m, out=out2)
            r["kernel"] = p.describe().get("kernel")
            # The two searches may choose different kernels (then the
            # outputs differ in rounding, and so may the times).
            cfg = lambda pl: {k: v for k, v in pl.describe().get("params", {}).items()
                              if k not in ("HEAD_DIM", "DTYPE")}
            r["config"], r["config_expanded"] = cfg(p), cfg(pe)
            r["same_kernel"] = (r["kernel"] == pe.describe().get("kernel")
                                and r["config"] == r["config_expanded"])
            # Interleaved rounds in alternating order, the median of each:
            # two kernels within a few percent are otherwise ranked by the
            # GPU's clock and temperature when each happened to be timed.
            g_ms, e_ms = [], []
            for rnd in range(args.rounds):
                pair = [(g_ms, lambda: p.run(q, k, v, out)),
                        (e_ms, lambda: pe.run(q, ke, ve, out2))]
                for dst, fn in (pair if rnd % 2 == 0 else pair[::-1]):
                    dst.append(bench(fn))
            r["stof_gqa_ms"] = statistics.median(g_ms)
            r["stof_expanded_ms"] = statistics.median(e_ms)
            if args.pairs:
                r["pair_ratio"] = pair_ratios(lambda: p.run(q, k, v, out),
                                              lambda: pe.run(q, ke, ve, out2),
                                              args.pairs)
            pe.run(q, ke, ve, out2)
            p.run(q, k, v, out)
            torch.cuda.synchronize()
            r["gqa_equals_expanded"] = bool(torch.equal(out, out2))
            allowed = m.to_dense().cuda()
            if B * H * N * N <= (1 << 31):
                s = torch.einsum("bhqd,bhkd->bhqk", q.float(), ke.float()) / D ** 0.5
                s = s.masked_fill(~allowed, float("-inf"))
                ref = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, -1).nan_to_num(0), ve.float())
                r["stof_err"] = ((out.float() - ref).norm() / ref.norm()).item()
                del s, ref

            def mm(b, h, qi, ki):
                return allowed[qi, ki]
            bm = create_block_mask(mm, None, None, N, N, device="cuda")
            r["flex_ms"] = bench(lambda: flex(q, k, v, block_mask=bm, enable_gqa=True))
            if spec == "causal":
                r["sdpa_ms"] = bench(lambda: F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, enable_gqa=True))
            elif B * N * N <= (1 << 31):
                am = allowed[None, None]
                r["sdpa_ms"] = bench(lambda: F.scaled_dot_product_attention(
                    q, k, v, attn_mask=am, enable_gqa=True))
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    print()
    print("| B x H (KV) x N x D | mask | kernel | stof GQA ms | stof expanded ms | Flex (enable_gqa) ms | SDPA (enable_gqa) ms | expanded / GQA | pairs: expanded / GQA | Flex / stof | SDPA / stof | same kernel | equal | err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        f, s = r.get("flex_ms", float("nan")), r.get("sdpa_ms", float("nan"))
        print(f"| {r['shape']} | {r['mask']} | {r['kernel']} | {r['stof_gqa_ms']:.3f} | "
              f"{r['stof_expanded_ms']:.3f} | {f:.3f} | {s:.3f} | "
              f"{r['stof_expanded_ms'] / r['stof_gqa_ms']:.2f} | "
              f"{r.get('pair_ratio', float('nan')):.3f} | {f / r['stof_gqa_ms']:.2f} | "
              f"{s / r['stof_gqa_ms']:.2f} | {r['same_kernel']} | {r['gqa_equals_expanded']} | "
              f"{r.get('stof_err', float('nan')):.1e} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
