#!/usr/bin/env python3
"""stof against FlexAttention (compiled) and SDPA, in one process, same inputs.

For each shape and mask of the public suite (../shared/BENCH.md): plan stof,
build FlexAttention's block mask, make SDPA's dense bool mask; check each
output against an fp32 reference on the same inputs; time each with
triton.testing.do_bench (CUDA events, L2 flushed between runs, median). Prints
a table with ratios and effective TF/s over unmasked elements only, and
writes every number as JSON with --json.

    PYTHONPATH=python python3 bench/bench_attention.py [--shapes 4x16x4096x64,...]
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton.testing

import stof

SUITE = [
    ("none", "dense"),
    ("causal", "causal"),
    ("sliding", "sliding:256"),
    ("dilated", "dilated:512:2"),
    ("longformer", "longformer:256:64"),
    ("bigbird", "bigbird:64:3:2:3:1"),
    ("strided", "strided:128"),
]


def mask_mod_for(name, dense_bool):
    """FlexAttention mask_mods with the same definitions as stof's specs.
    bigbird's random blocks come from stof's own mask (looked up)."""
    if name == "causal":
        return lambda b, h, q, k: q >= k
    if name == "sliding":
        return lambda b, h, q, k: (q - k).abs() < 256
    if name.startswith("sliding:"):
        w = int(name.split(":")[1])
        return lambda b, h, q, k: (q - k).abs() < w
    if name == "dilated":
        return lambda b, h, q, k: ((q - k).abs() < 512) & ((q - k) % 2 == 0)
    if name == "longformer":
        return lambda b, h, q, k: ((q - k).abs() < 256) | (q < 64) | (k < 64)
    if name == "strided":
        return lambda b, h, q, k: ((q - k).abs() < 128) | (k % 128 == 127)
    table = dense_bool
    return lambda b, h, q, k: table[q, k]


def reference(q, k, v, dense_bool):
    """fp32 masked attention, a few heads at a time (rows with no key -> 0)."""
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    B, H = q.shape[:2]
    step = max(1, (1 << 31) // (q.shape[2] * k.shape[2] * 4))
    m = dense_bool
    for b in range(B):
        for h0 in range(0, H, step):
            h1 = min(H, h0 + step)
            qf, kf, vf = (t[b, h0:h1].float() for t in (q, k, v))
            s = torch.matmul(qf, kf.transpose(-1, -2)) / math.sqrt(q.shape[-1])
            s = s.masked_fill(~m, float("-inf"))
            p = torch.softmax(s, dim=-1).nan_to_num(0.0)
            out[b, h0:h1] = torch.matmul(p, vf)
    return out


def rel_err(x, ref):
    x = x.float()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def cfg_str(p):
    if not p or "BLOCK_M" not in p:
        return "-"
    s = f"{p['BLOCK_M']}/{p['BLOCK_N']}/{p.get('WARPS', 'wg')}/{p['STAGES']}"
    # wgmma: P persistent, n without the in-warpgroup overlap
    if str(p.get("PERSIST", "0")) == "1":
        s += "P"
    if str(p.get("OVERLAP", "1")) == "0" and "WARPS" not in p:
        s += "n"
    return s


def bench(fn):
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4x16x4096x64,1x32x8192x128",
                    help="comma-separated BxHxNxD (default: %(default)s)")
    ap.add_argument("--masks", default=",".join(n for n, _ in SUITE),
                    help="comma-separated names from the suite, or sliding:W")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention")
    ap.add_argument("--json", help="write all results to this file")
    ap.add_argument("--plot", help="draw the speed-ups over Flex and SDPA into "
                    "this PNG (bench/plot_attention.py; needs matplotlib)")
    ap.add_argument("--user-db", help="tuning database (default: stof's default "
                    "location); the first plan of each problem tunes, the second loads")
    args = ap.parse_args()

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    import torch._dynamo
    # Each mask_mod is a new function: without room for the recompiles,
    # dynamo gives up after a few and FlexAttention silently runs eagerly
    # (materialising the scores: 100x slower). Each case gets its own
    # compiled function, compiled once.
    torch._dynamo.config.cache_size_limit = 1024
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 1024

    dt = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    ctx = stof.Context(user_db=args.user_db)
    dev = ctx.device()
    print(f"# {dev['name']}, CUDA driver API {dev.get('driver_version')}, torch {torch.__version__}, "
          f"stof {stof._load().stof_version_string().decode()}", flush=True)
    names = args.masks.split(",")
    results = []
    torch.manual_seed(0)
    for shape in args.shapes.split(","):
        B, H, N, D = (int(x) for x in shape.split("x"))
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dt) for _ in range(3))
        out = torch.empty_like(q)
        sdpa_dense = bench(lambda: F.scaled_dot_product_attention(q, k, v))
        sdpa_causal = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        extra = [(n, n) for n in names if n.startswith("sliding:")]
        for name, spec in SUITE + extra:
            if name not in names:
                continue
            r = {"shape": [B, H, N, D], "mask": name, "spec": spec, "dtype": args.dtype}
            mask = ctx.mask(spec, N, N)
            r["density"] = mask.density
            dense = mask.to_dense().cuda()
            ref = reference(q, k, v, dense)

            t0 = time.perf_counter()
            plan = ctx.attention_plan(q, k, v, mask, out=out)
            r["stof_plan_s"] = time.perf_counter() - t0
            # Warm plan: a second plan of the same problem is a database hit.
            t0 = time.perf_counter()
            plan2 = ctx.attention_plan(q, k, v, mask, out=out)
            r["stof_warm_plan_s"] = time.perf_counter() - t0
            r["stof_warm_source"] = plan2.describe().get("source")
            del plan2
            desc = plan.describe()
            r["stof_source"] = desc.get("source")
            r["stof_tuned_ms"] = desc.get("time_ms")
            r["stof_model_choice_ms"] = desc.get("model_choice_ms")
            r["stof_kernel"] = desc.get("kernel")
            r["stof_params"] = desc.get("params")
            r["stof_predicted_ms"] = desc.get("predicted_ms")
            out.fill_(float("nan"))
            plan.run(q, k, v, out)
            torch.cuda.synchronize()
            r["stof_err"] = rel_err(out, ref)
            r["stof_ms"] = bench(lambda: plan.run(q, k, v, out))

            if not args.no_flex:
                flex = torch.compile(flex_attention, dynamic=False)
                t0 = time.perf_counter()
                bm = create_block_mask(mask_mod_for(name, dense), None, None, N, N,
                                       device="cuda")
                fo = flex(q, k, v, block_mask=bm)
                torch.cuda.synchronize()
                r["flex_first_s"] = time.perf_counter() - t0
                r["flex_err"] = rel_err(fo, ref)
                r["flex_ms"] = bench(lambda: flex(q, k, v, block_mask=bm))
            so = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
            r["sdpa_mask_err"] = rel_err(so, ref)
            r["sdpa_mask_ms"] = bench(lambda: F.scaled_dot_product_attention(
                q, k, v, attn_mask=dense))
            r["sdpa_dense_ms"] = sdpa_dense
            r["sdpa_causal_ms"] = sdpa_causal
            flops = 4.0 * B * H * N * N * D * r["density"]
            r["stof_tflops"] = flops / (r["stof_ms"] * 1e-3) / 1e12
            if "flex_ms" in r:
                r["flex_tflops"] = flops / (r["flex_ms"] * 1e-3) / 1e12
            results.append(r)
            del ref, dense, plan, mask
            torch.cuda.empty_cache()
            print(json.dumps(r), file=sys.stderr, flush=True)

    hdr = (f"{'shape':>14} {'mask':>10} {'dens':>6} {'stof ms':>8} {'flex ms':>8} "
           f"{'sdpa+m':>8} {'x flex':>7} {'x sdpa':>7} {'stof TF':>8} {'flex TF':>8} "
           f"{'err':>8} {'kernel':>10} {'config':>12} {'pred ms':>8}")
    print(hdr)
    for r in results:
        shape = "x".join(str(x) for x in r["shape"])
        base = r["sdpa_causal_ms"] if r["mask"] == "causal" else (
            r["sdpa_dense_ms"] if r["mask"] == "none" else r["sdpa_mask_ms"])
        fl = r.get("flex_ms", float("nan"))
        # A peer whose output fails the check does other work: no ratio.
        if not r.get("flex_err", 0.0) < 1e-2:
            fl = float("nan")
        if r["mask"] not in ("causal", "none") and \
                not r.get("sdpa_mask_err", 0.0) < 1e-2:
            base = float("nan")
        print(f"{shape:>14} {r['mask']:>10} {r['density']:6.3f} {r['stof_ms']:8.3f} "
              f"{fl:8.3f} {r['sdpa_mask_ms']:8.3f} {fl / r['stof_ms']:7.2f} "
              f"{base / r['stof_ms']:7.2f} {r['stof_tflops']:8.1f} "
              f"{r.get('flex_tflops', float('nan')):8.1f} {r['stof_err']:8.1e} "
              f"{r['stof_kernel']:>10} {cfg_str(r.get('stof_params')):>12} "
              f"{r.get('stof_predicted_ms') or float('nan'):8.3f}")
    print("x flex = FlexAttention time / stof time; x sdpa = SDPA time / stof time "
          "(flash SDPA for none, is_causal for causal, bool mask otherwise); "
          "nan where the peer's output is 1e-2 or more from the fp32 reference")
    print()
    print(f"{'shape':>14} {'mask':>10} {'cold plan s':>11} {'source':>8} "
          f"{'warm plan ms':>12} {'source':>9} {'flex 1st s':>10}")
    for r in results:
        shape = "x".join(str(x) for x in r["shape"])
        print(f"{shape:>14} {r['mask']:>10} {r['stof_plan_s']:11.2f} "
              f"{r.get('stof_source', '-'):>8} {r['stof_warm_plan_s'] * 1e3:12.2f} "
              f"{r.get('stof_warm_source', '-'):>9} {r.get('flex_first_s', float('nan')):10.2f}")
    print()
    print("cost model: its first choice, timed by the search, against the "
          "search's winner (same run)")
    print(f"{'shape':>14} {'mask':>10} {'model 1st ms':>12} {'winner ms':>9} "
          f"{'ratio':>6} {'winner pred ms':>14}")
    for r in results:
        shape = "x".join(str(x) for x in r["shape"])
        mc, w = r.get("stof_model_choice_ms") or float("nan"), r.get("stof_tuned_ms")
        w = w or float("nan")
        print(f"{shape:>14} {r['mask']:>10} {mc:12.3f} {w:9.3f} {mc / w:6.2f} "
              f"{r.get('stof_predicted_ms') or float('nan'):14.3f}")
    bad = [r for r in results if not r["stof_err"] < 1e-2]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        try:
            import plot_attention
            plot_attention.plot(results, args.plot,
                                f"stof vs FlexAttention and SDPA, {dev['name']}, "
                                f"{args.dtype}")
            print(f"# plot: {args.plot}")
        except ImportError as e:
            print(f"# no plot ({e}): pip install matplotlib", file=sys.stderr)
    if bad:
        print(f"{len(bad)} result(s) failed the 1e-2 accuracy check", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
