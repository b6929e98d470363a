"""Score modifiers: logit soft-capping (desc.softcap, Gemma 2) and ALiBi
(desc.alibi_slopes), stof against FlexAttention (torch.compile'd
flex_attention with a score_mod and a block_mask), in one process on the
same tensors. For each B x H x N x D problem (seq_q = seq_k = N) and mask
(causal: k <= q; sliding:W: |q - k| < W; dense) and each modifier (none;
softcap:C: every score s becomes C * tanh(s / C); alibi: head h's scores
get slope[h] * (k - q) with stof.alibi_slopes(H)): stof plans the mask with
the modifier, Flex is compiled once for the pair with the matching
score_mod. Kernel times: triton.testing.do_bench (median, L2 flushed).
Errors (norm(out - ref) / norm(ref)) against an fp32 reference computed in
torch a batch element and a few heads at a time.

Usage: python bench/bench_scoremod.py [--problems 4x16x4096x128:causal,...]
       [--mods none,softcap:50,alibi] [--dtype bf16] [--json FILE]
"""
import argparse
import json
import sys

import torch
import triton.testing

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0] + "/python")
import stof  # noqa: E402

DEFAULT = "4x16x4096x128:causal,1x32x8192x128:causal,2x8x8192x256:sliding:1024"


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def parse_mod(mod):
    """(softcap, alibi) of a modifier: none, softcap:C or alibi."""
    if mod == "none":
        return 0.0, False
    if mod.startswith("softcap:"):
        return float(mod.split(":", 1)[1]), False
    if mod == "alibi":
        return 0.0, True
    raise ValueError("unknown modifier %r (none, softcap:C, alibi)" % mod)


def mask_mod_for(spec):
    """Flex's mask_mod for a mask spec (None: dense)."""
    if spec == "dense":
        return None
    if spec == "causal":
        return lambda b, h, q, k: k <= q
    if spec.startswith("sliding:"):
        w = int(spec.split(":", 1)[1])
        return lambda b, h, q, k: (q - k).abs() < w
    raise ValueError("unsupported mask %r (causal, sliding:W, dense)" % spec)


def allowed_for(spec, N, device):
    """The (N, N) bool mask of a spec (None: dense)."""
    qi = torch.arange(N, device=device)[:, None]
    ki = torch.arange(N, device=device)[None, :]
    if spec == "dense":
        return None
    if spec == "causal":
        return ki <= qi
    w = int(spec.split(":", 1)[1])
    return (qi - ki).abs() < w


def score_mod_for(cap, slopes_t):
    """Flex's score_mod (None: no modifier)."""
    if cap > 0:
        return lambda s, b, h, q, k: cap * torch.tanh(s / cap)
    if slopes_t is not None:
        return lambda s, b, h, q, k: s + slopes_t[h] * (k - q)
    return None


def errors(q, k, v, outs, allowed, cap, slopes_t):
    """norm(o - ref) / norm(ref) for each output in outs (None: skipped),
    against fp32 attention with the same mask and modifier."""
    B, H, N, D = q.shape
    step = max(1, (1 << 31) // (N * N * 4))
    kq = None
    if slopes_t is not None:
        idx = torch.arange(N, device=q.device, dtype=torch.float32)
        kq = idx[None, :] - idx[:, None]  # k - q
    num = [0.0] * len(outs)
    den = 0.0
    for b in range(B):
        for h0 in range(0, H, step):
            h1 = min(H, h0 + step)
            qf, kf, vf = (t[b, h0:h1].float() for t in (q, k, v))
            s = torch.matmul(qf, kf.transpose(-1, -2)).mul_(D ** -0.5)
            if cap > 0:
                s.div_(cap).tanh_().mul_(cap)
            if kq is not None:
                s.add_(slopes_t[h0:h1, None, None] * kq)
            if allowed is not None:
                s.masked_fill_(~allowed, float("-inf"))
            ref = torch.matmul(torch.softmax(s, -1).nan_to_num_(0), vf)
            del s
            den += ref.norm().item() ** 2
            for i, o in enumerate(outs):
                if o is not None:
                    num[i] += (o[b, h0:h1].float() - ref).norm().item() ** 2
            del ref
    return [(n / den) ** 0.5 if o is not None else float("nan")
            for n, o in zip(num, outs)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default=DEFAULT,
                    help="BxHxNxD:mask,... (mask: causal, sliding:W, dense)")
    ap.add_argument("--mods", default="none,softcap:50,alibi",
                    help="none, softcap:C, alibi")
    ap.add_argument("--dtype", default="bf16", choices=["fp16", "bf16"])
    ap.add_argument("--json")
    args = ap.parse_args()
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    # Every (problem, modifier) compiles its own flex: leave room for them.
    torch._dynamo.config.cache_size_limit = 1024
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 1024
    dt = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    mods = args.mods.split(",")
    for mod in mods:
        parse_mod(mod)
    ctx = stof.Context()
    dev = ctx.device()
    print(f"# {dev['name']}, driver {dev.get('driver_version')}, torch {torch.__version__}, "
          f"{args.dtype}", flush=True)
    rows = []
    for item in args.problems.split(","):
        shape, spec = item.split(":", 1)
        B, H, N, D = (int(x) for x in shape.split("x"))
        torch.manual_seed(0)
        q = torch.randn(B, H, N, D, device="cuda", dtype=dt)
        k = torch.randn(B, H, N, D, device="cuda", dtype=dt)
        v = torch.randn(B, H, N, D, device="cuda", dtype=dt)
        out = torch.empty_like(q)
        m = ctx.mask(spec, N, N)
        allowed = allowed_for(spec, N, "cuda")
        mm = mask_mod_for(spec)
        bm = create_block_mask(mm, None, None, N, N, device="cuda") if mm else None
        for mod in mods:
            cap, alibi = parse_mod(mod)
            slopes = stof.alibi_slopes(H) if alibi else None
            slopes_t = torch.tensor(slopes, dtype=torch.float32, device="cuda") \
                if alibi else None
            r = {"shape": shape, "mask": spec, "mod": mod, "dtype": args.dtype}
            so = fo = None
            try:
                p = ctx.attention_plan(q, k, v, m, out=out, softcap=cap,
                                       alibi_slopes=slopes)
                r["kernel"] = p.describe().get("kernel")
                p.run(q, k, v, out)
                torch.cuda.synchronize()
                so = out.clone()
                r["stof_ms"] = bench(lambda: p.run(q, k, v, out))
            except stof.StofError as e:
                r["stof_error"] = str(e)
            flex = torch.compile(flex_attention, dynamic=False)
            sm = score_mod_for(cap, slopes_t)
            try:
                fo = flex(q, k, v, score_mod=sm, block_mask=bm)
                torch.cuda.synchronize()
                r["flex_ms"] = bench(lambda: flex(q, k, v, score_mod=sm, block_mask=bm))
            except Exception as e:  # e.g. a Triton kernel out of shared memory
                r["flex_error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0]
                                              if str(e) else "")
            r["stof_err"], r["flex_err"] = errors(q, k, v, [so, fo], allowed, cap,
                                                  slopes_t)
            del so, fo
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
        del q, k, v, out
        torch.cuda.empty_cache()
    nan = float("nan")
    print()
    print("| B x H x N x D | mask | modifier | stof ms | Flex ms | Flex / stof | stof err | "
          "Flex err | kernel |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s, f = r.get("stof_ms", nan), r.get("flex_ms", nan)
        kernel = r.get("kernel") or ("error: " + r["stof_error"] if "stof_error" in r else "-")
        print(f"| {r['shape']} | {r['mask']} | {r['mod']} | {s:.3f} | {f:.3f} | "
              f"{f / s:.2f} | {r['stof_err']:.1e} | {r['flex_err']:.1e} | {kernel} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
