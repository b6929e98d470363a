"""Short queries against long keys (issue 13: decode, chunked prefill,
speculative verification): B x H x SQ x SK x D problems with a dense mask
or a causal sliding window aligned bottom-right (query row i sits at key
position SK - SQ + i, as in a decoder's KV cache), stof against
FlexAttention (torch.compile'd; its decoding kernel for short queries) and
SDPA, in one process on the same tensors. Kernel times:
triton.testing.do_bench (median, L2 flushed). The bandwidth column is the
K and V bytes a kernel must read (the keys any query of the problem
allows) over stof's time. Errors against an fp32 reference.

stof plans the sliding window as a mask family with q_offset = SK - SQ
(the same plan serves every cache length up to SK), the dense mask as a
plain spec.

Grouped-query problems write the heads as H/KV (e.g. 16x32/8x1x8192x128:
K and V have 8 heads); Flex and SDPA then run with enable_gqa=True.

Usage: python bench/bench_splitkv.py [--problems 32x32x1x8192x128:dense,...]
       [--dtype bf16] [--json FILE]
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0] + "/python")
import stof  # noqa: E402

DEFAULT = ("32x32x1x8192x128:dense,32x32x1x8192x128:causal_sliding:4096,"
           "8x32x16x32768x128:dense,8x32x16x32768x128:causal_sliding:4096,"
           "1x32x1x32768x128:dense,1x32x16x65536x128:dense,"
           "2x32x64x16384x128:causal")


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def allowed_rows(spec, SQ, SK, device):
    """The (SQ, SK) bool mask with query i at key position SK - SQ + i."""
    qi = torch.arange(SQ, device=device)[:, None] + (SK - SQ)
    ki = torch.arange(SK, device=device)[None, :]
    if spec == "dense":
        return torch.ones(SQ, SK, dtype=torch.bool, device=device)
    if spec.startswith("causal_sliding:"):
        w = int(spec.split(":")[1])
        return (ki <= qi) & (qi - ki < w)
    if spec == "causal":
        return ki <= qi
    raise ValueError("unsupported mask " + spec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default=DEFAULT)
    ap.add_argument("--dtype", default="bf16", choices=["fp16", "bf16"])
    ap.add_argument("--peak-gbs", type=float, default=3350.0,
                    help="HBM bandwidth for the %% of peak column (H100 SXM)")
    ap.add_argument("--json")
    args = ap.parse_args()
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flex = torch.compile(flex_attention, dynamic=False)
    dt = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    ctx = stof.Context()
    dev = ctx.device()
    print(f"# {dev['name']}, driver {dev.get('driver_version')}, torch {torch.__version__}, "
          f"{args.dtype}", flush=True)
    rows = []
    for item in args.problems.split(","):
        shape, spec = item.split(":", 1)
        B, HS, SQ, SK, D = shape.split("x")
        H, KV = (int(x) for x in HS.split("/")) if "/" in HS else (int(HS), int(HS))
        B, SQ, SK, D = int(B), int(SQ), int(SK), int(D)
        gqa = KV != H
        torch.manual_seed(0)
        q = torch.randn(B, H, SQ, D, device="cuda", dtype=dt)
        k = torch.randn(B, KV, SK, D, device="cuda", dtype=dt)
        v = torch.randn(B, KV, SK, D, device="cuda", dtype=dt)
        out = torch.empty_like(q)
        allowed = allowed_rows(spec, SQ, SK, "cuda")
        r = {"problem": item, "dtype": args.dtype}
        if spec == "dense":
            p = ctx.attention_plan(q, k, v, ctx.mask("dense", SQ, SK), out=out)
            run = lambda: p.run(q, k, v, out)  # noqa: E731
        else:
            fam = ctx.mask_family(spec)
            off = [SK - SQ] * B
            p = ctx.attention_plan_family(q, k, v, fam, sample={"q_offset": off},
                                          out=out)
            q_off = torch.tensor(off, dtype=torch.int32, device="cuda")
            run = lambda: p.run(q, k, v, out, q_offset=q_off)  # noqa: E731
        dsc = p.describe()
        r["kernel"], r["params"] = dsc.get("kernel"), dsc.get("params")
        r["stof_ms"] = bench(run)
        run()
        torch.cuda.synchronize()
        # fp32 reference, one batch element at a time.
        num = den = 0.0
        for b in range(B):
            kb, vb = k[b], v[b]
            if gqa:
                kb, vb = kb.repeat_interleave(H // KV, 0), vb.repeat_interleave(H // KV, 0)
            s = torch.einsum("hqd,hkd->hqk", q[b].float(), kb.float()) / D ** 0.5
            s = s.masked_fill(~allowed, float("-inf"))
            ref = torch.einsum("hqk,hkd->hqd", torch.softmax(s, -1).nan_to_num(0),
                               vb.float())
            num += (out[b].float() - ref).norm().item() ** 2
            den += ref.norm().item() ** 2
        r["stof_err"] = (num / den) ** 0.5
        keys = int(allowed.any(0).sum().item())
        r["kv_bytes"] = 2 * B * KV * keys * D * q.element_size()
        r["stof_gbs"] = r["kv_bytes"] / r["stof_ms"] / 1e6
        try:
            if spec == "dense":
                r["flex_ms"] = bench(lambda: flex(q, k, v, enable_gqa=gqa))
            else:
                def mm(b, h, qi, ki):
                    return allowed[qi, ki]
                bm = create_block_mask(mm, None, None, SQ, SK, device="cuda")
                r["flex_ms"] = bench(lambda: flex(q, k, v, block_mask=bm,
                                                  enable_gqa=gqa))
        except Exception as e:  # e.g. no kernel for a shape: recorded, not fatal
            r["flex_ms"] = float("nan")
            r["flex_error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200])
        if spec == "dense":
            r["sdpa_ms"] = bench(lambda: F.scaled_dot_product_attention(
                q, k, v, enable_gqa=gqa))
        else:
            am = allowed[None, None]
            r["sdpa_ms"] = bench(lambda: F.scaled_dot_product_attention(
                q, k, v, attn_mask=am, enable_gqa=gqa))
        rows.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
        del q, k, v, out
        torch.cuda.empty_cache()
    print()
    print("| B x H x SQ x SK x D | mask | kernel | stof ms | GB/s (% peak) | Flex ms | "
          "SDPA ms | Flex / stof | SDPA / stof | err |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        shape, spec = r["problem"].split(":", 1)
        print(f"| {shape} | {spec} | {r['kernel']} {r['params']} | {r['stof_ms']:.4f} | "
              f"{r['stof_gbs']:.0f} ({100 * r['stof_gbs'] / args.peak_gbs:.0f}%) | "
              f"{r['flex_ms']:.4f} | {r['sdpa_ms']:.4f} | "
              f"{r['flex_ms'] / r['stof_ms']:.2f} | {r['sdpa_ms'] / r['stof_ms']:.2f} | "
              f"{r['stof_err']:.1e} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
