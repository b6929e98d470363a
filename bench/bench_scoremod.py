"""Score modifiers: logit soft-capping (desc.softcap, Gemma 2), ALiBi
(desc.alibi_slopes) and an additive bias tensor (desc.bias), stof against
FlexAttention (torch.compile'd flex_attention with a score_mod and a
block_mask), in one process on the same tensors; the bias also against
SDPA (scaled_dot_product_attention with the bias as a float attn_mask,
-inf where the mask disallows). For each B x H x N x D problem (seq_q =
seq_k = N) and mask (causal: k <= q; sliding:W: |q - k| < W; dense) and
each modifier (none; softcap:C: every score s becomes C * tanh(s / C);
alibi: head h's scores get slope[h] * (k - q) with stof.alibi_slopes(H);
bias: a (1, H, N, N) tensor of small random values, one per head for
every batch element, like a T5 / relative-position bias; bias:pad: a (B,
1, N, N) tensor, batch element b's keys >= len_b -inf like a Hugging Face
padding mask and small random values elsewhere, for every head; len_b
from N down to N / 2 (sliding:W: N - W / 2), so that every query row keeps
a key): stof plans the mask with the modifier, Flex is compiled once for
the pair with the matching score_mod. Kernel times: triton.testing.do_bench
(median, L2 flushed). Errors (norm(out - ref) / norm(ref)) against an fp32
reference computed in torch a batch element and a few heads at a time.

Usage: python bench/bench_scoremod.py [--problems 4x16x4096x128:causal,...]
       [--mods none,softcap:50,alibi,bias,bias:pad] [--dtype bf16]
       [--json FILE]
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
    """(softcap, alibi, bias) of a modifier: none, softcap:C, alibi, bias
    (bias "head": (1, H, N, N)) or bias:pad (bias "pad": (B, 1, N, N))."""
    if mod == "none":
        return 0.0, False, None
    if mod.startswith("softcap:"):
        return float(mod.split(":", 1)[1]), False, None
    if mod == "alibi":
        return 0.0, True, None
    if mod == "bias":
        return 0.0, False, "head"
    if mod == "bias:pad":
        return 0.0, False, "pad"
    raise ValueError("unknown modifier %r (none, softcap:C, alibi, bias, bias:pad)"
                     % mod)


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


def pad_lengths(spec, B, N):
    """bias:pad's key lengths: N for batch element 0, then down to about N
    / 2; sliding:W down to about N - W / 2 (each query row keeps a key)."""
    span = int(spec.split(":", 1)[1]) - 1 if spec.startswith("sliding:") else N
    return [N - b * span // (2 * B) for b in range(B)]


def make_bias(kind, spec, B, H, N, dtype):
    """The bias tensor of a bias modifier (None: none): "head": (1, H, N,
    N), "pad": (B, 1, N, N) with -inf at batch element b's keys >= len_b;
    small random values (0.5 * randn) elsewhere. Its rows are stored padded
    to a multiple of 8 keys (stof.pad_bias) where N is not one."""
    if kind is None:
        return None
    shape = (1, H, N, N) if kind == "head" else (B, 1, N, N)
    bias = torch.randn(shape, device="cuda", dtype=dtype).mul_(0.5)
    if kind == "pad":
        lens = torch.tensor(pad_lengths(spec, B, N), device="cuda")
        keys = torch.arange(N, device="cuda")
        bias.masked_fill_(keys[None, None, None, :] >= lens[:, None, None, None],
                          float("-inf"))
    return stof.pad_bias(bias) if N % 8 else bias


def score_mod_for(cap, slopes_t, bias):
    """Flex's score_mod (None: no modifier)."""
    if cap > 0:
        return lambda s, b, h, q, k: cap * torch.tanh(s / cap)
    if slopes_t is not None:
        return lambda s, b, h, q, k: s + slopes_t[h] * (k - q)
    if bias is not None and bias.shape[0] == 1:
        return lambda s, b, h, q, k: s + bias[0, h, q, k]
    if bias is not None:
        return lambda s, b, h, q, k: s + bias[b, 0, q, k]
    return None


def sdpa_mask(bias, allowed):
    """SDPA's float attn_mask: the bias, -inf where the mask disallows."""
    if allowed is None:
        return bias
    return bias.masked_fill(~allowed, float("-inf"))


def errors(q, k, v, outs, allowed, cap, slopes_t, bias):
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
            if bias is not None:
                bb = bias[b if bias.shape[0] > 1 else 0]
                s.add_(bb[h0:h1] if bb.shape[0] > 1 else bb)
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
    ap.add_argument("--mods", default="none,softcap:50,alibi,bias,bias:pad",
                    help="none, softcap:C, alibi, bias ((1, H, N, N)), bias:pad "
                    "((B, 1, N, N) padding mask)")
    ap.add_argument("--dtype", default="bf16", choices=["fp16", "bf16"])
    ap.add_argument("--json")
    args = ap.parse_args()
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from torch.nn.functional import scaled_dot_product_attention as sdpa
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
            cap, alibi, bias_kind = parse_mod(mod)
            slopes = stof.alibi_slopes(H) if alibi else None
            slopes_t = torch.tensor(slopes, dtype=torch.float32, device="cuda") \
                if alibi else None
            bias = make_bias(bias_kind, spec, B, H, N, dt)
            r = {"shape": shape, "mask": spec, "mod": mod, "dtype": args.dtype}
            so = fo = po = None
            try:
                p = ctx.attention_plan(q, k, v, m, out=out, softcap=cap,
                                       alibi_slopes=slopes, bias=bias)
                r["kernel"] = p.describe().get("kernel")
                p.run(q, k, v, out, bias=bias)
                torch.cuda.synchronize()
                so = out.clone()
                r["stof_ms"] = bench(lambda: p.run(q, k, v, out, bias=bias))
            except stof.StofError as e:
                r["stof_error"] = str(e)
            if bias is not None:
                am = sdpa_mask(bias, allowed)
                try:
                    po = sdpa(q, k, v, attn_mask=am)
                    torch.cuda.synchronize()
                    r["sdpa_ms"] = bench(lambda: sdpa(q, k, v, attn_mask=am))
                except Exception as e:  # e.g. out of memory
                    r["sdpa_error"] = "%s: %s" % (type(e).__name__,
                                                  str(e).splitlines()[0]
                                                  if str(e) else "")
                del am
            flex = torch.compile(flex_attention, dynamic=False)
            sm = score_mod_for(cap, slopes_t, bias)
            try:
                fo = flex(q, k, v, score_mod=sm, block_mask=bm)
                torch.cuda.synchronize()
                r["flex_ms"] = bench(lambda: flex(q, k, v, score_mod=sm, block_mask=bm))
            except Exception as e:  # e.g. a Triton kernel out of shared memory
                r["flex_error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0]
                                              if str(e) else "")
            r["stof_err"], r["flex_err"], r["sdpa_err"] = errors(
                q, k, v, [so, fo, po], allowed, cap, slopes_t, bias)
            del so, fo, po, bias, flex, sm
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
        del q, k, v, out
        torch.cuda.empty_cache()
    nan = float("nan")
    print()
    print("| B x H x N x D | mask | modifier | stof ms | Flex ms | Flex / stof | "
          "SDPA ms | SDPA / stof | stof err | Flex err | SDPA err | kernel |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s, f = r.get("stof_ms", nan), r.get("flex_ms", nan)
        kernel = r.get("kernel") or ("error: " + r["stof_error"] if "stof_error" in r else "-")
        if parse_mod(r["mod"])[2] is not None:
            p = r.get("sdpa_ms", nan)
            sd = (f"{p:.3f}", f"{p / s:.2f}", f"{r['sdpa_err']:.1e}")
        else:  # SDPA: the bias modifiers only
            sd = ("-", "-", "-")
        print(f"| {r['shape']} | {r['mask']} | {r['mod']} | {s:.3f} | {f:.3f} | "
              f"{f / s:.2f} | {sd[0]} | {sd[1]} | {r['stof_err']:.1e} | "
              f"{r['flex_err']:.1e} | {sd[2]} | {kernel} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
