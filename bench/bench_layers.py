#!/usr/bin/env python3
"""End to end: stacks of stof Transformer layers against PyTorch, same inputs.

Models (fp16, random weights, seeded): BERT-base and BERT-large (post-norm),
GPT-2 and ViT-base (pre-norm), LayerNorm eps 1e-5, tanh-GELU (--act erf for
BERT's exact GELU), the bigbird mask bigbird:64:3:2:3:1 built by stof, at
(batch, seq) = (1,128), (8,512), (16,2048) (../shared/BENCH.md, "End-to-end
peer figures"). For each model and size, three stacks over the same weights
and the same input:

  eager    PyTorch, F.linear / F.layer_norm / F.gelu, attention by
           F.scaled_dot_product_attention with stof's mask as a dense bool
           tensor;
  compile  the same layer under torch.compile(dynamic=False), attention by
           flex_attention with a BlockMask whose mask_mod looks that dense
           tensor up;
  stof     Context.layer_plan once (cold plan seconds reported), then
           Layer.stack_run(graph=True): the whole stack as one CUDA graph.

stof's output is checked against eager (and all three against an fp32 run of
the eager stack) before timing; rel err = |out - ref| / |ref| (Frobenius).
Timing: CUDA events around the whole stack, warm-ups first, median of --reps.

    PYTHONPATH=python python3 bench/bench_layers.py [--models bert-base,gpt2]
        [--sizes 1x128,8x512] [--no-compile] [--peers-only] [--json FILE]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback

import torch
import torch._dynamo
import torch.nn.functional as F

import stof

MODELS = {
    # name: layers, hidden, heads, ffn, pre-norm
    "bert-base": (12, 768, 12, 3072, False),
    "bert-large": (24, 1024, 16, 4096, False),
    "gpt2": (12, 768, 12, 3072, True),
    "vit-base": (12, 768, 12, 3072, True),
}
SIZES = "1x128,8x512,16x2048"
MASK_SPEC = "bigbird:64:3:2:3:1"
FAIL_REL_ERR = 2e-2


class Cfg:
    def __init__(self, name, batch, seq, act, eps):
        self.name = name
        self.layers, self.hidden, self.heads, self.ffn, self.pre_norm = MODELS[name]
        self.batch, self.seq = batch, seq
        self.head_dim = self.hidden // self.heads
        self.act = act          # "tanh" or "erf"
        self.eps = eps


def make_weights(cfg, dtype, seed):
    """cfg.layers dicts of contiguous CUDA tensors, named like
    stof_layer_weights: weights N(0, 0.02), biases and betas N(0, 0.02),
    gammas 1 + N(0, 0.02)."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    h, f = cfg.hidden, cfg.ffn

    def rnd(*shape, mean=0.0):
        t = torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32)
        return (t * 0.02 + mean).to(dtype).contiguous()

    layers = []
    for _ in range(cfg.layers):
        layers.append({
            "w_qkv": rnd(3 * h, h), "b_qkv": rnd(3 * h),
            "w_o": rnd(h, h), "b_o": rnd(h),
            "w_ffn1": rnd(f, h), "b_ffn1": rnd(f),
            "w_ffn2": rnd(h, f), "b_ffn2": rnd(h),
            "norm1_gamma": rnd(h, mean=1.0), "norm1_beta": rnd(h),
            "norm2_gamma": rnd(h, mean=1.0), "norm2_beta": rnd(h),
        })
    return layers


def make_layer_fn(cfg, attention):
    """One encoder layer x [B, S, hidden] -> [B, S, hidden] with the
    semantics of stof_layer_desc. attention(q, k, v, m) takes (B, H, S, D)
    tensors and the mask object m passed to the layer."""
    B, S, h, H, D = cfg.batch, cfg.seq, cfg.hidden, cfg.heads, cfg.head_dim
    approx = "tanh" if cfg.act == "tanh" else "none"
    eps = cfg.eps

    def ln(u, w, which):
        return F.layer_norm(u, (h,), w[which + "_gamma"], w[which + "_beta"], eps)

    def attn(u, w, m):
        qkv = F.linear(u, w["w_qkv"], w["b_qkv"])          # [B, S, 3h]
        # rows [0,h) of w_qkv make Q, [h,2h) K, [2h,3h) V; head i is columns
        # i*D..(i+1)*D of each
        q, k, v = (t.view(B, S, H, D).transpose(1, 2) for t in qkv.split(h, dim=-1))
        o = attention(q, k, v, m)                          # [B, H, S, D]
        o = o.transpose(1, 2).reshape(B, S, h)
        return F.linear(o, w["w_o"], w["b_o"])

    def ffn(u, w):
        t = F.gelu(F.linear(u, w["w_ffn1"], w["b_ffn1"]), approximate=approx)
        return F.linear(t, w["w_ffn2"], w["b_ffn2"])

    if cfg.pre_norm:
        def layer(x, w, m):
            hdn = x + attn(ln(x, w, "norm1"), w, m)
            return hdn + ffn(ln(hdn, w, "norm2"), w)
    else:
        def layer(x, w, m):
            hdn = ln(x + attn(x, w, m), w, "norm1")
            return ln(hdn + ffn(hdn, w), w, "norm2")
    return layer


def sdpa_attention(q, k, v, dense):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=dense)


def flex_attention_fn():
    from torch.nn.attention.flex_attention import flex_attention

    def attention(q, k, v, block_mask):
        return flex_attention(q, k, v, block_mask=block_mask)
    return attention


def run_stack(layer, x, weights, m):
    for w in weights:
        x = layer(x, w, m)
    return x


def rel_err(out, ref):
    out, ref = out.float(), ref.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def max_abs_err(out, ref):
    d = (out.float() - ref.float()).abs()
    return float("inf") if not torch.isfinite(d).all() else d.max().item()


def time_ms(fn, reps, warmup):
    """Median ms of `reps` runs of fn (the whole stack), CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def fp32_reference(cfg, x, weights, dense):
    """The eager stack in fp32 (weights converted one layer at a time)."""
    layer = make_layer_fn(cfg, sdpa_attention)
    h = x.float()
    for w in weights:
        h = layer(h, {k: t.float() for k, t in w.items()}, dense)
    return h


def short(e):
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:200]


def bench_case(args, ctx, cfg, dtype, seed):
    B, S = cfg.batch, cfg.seq
    r = {"model": cfg.name, "batch": B, "seq": S, "layers": cfg.layers,
         "hidden": cfg.hidden, "heads": cfg.heads, "ffn": cfg.ffn,
         "pre_norm": cfg.pre_norm, "act": "gelu_" + cfg.act, "eps": cfg.eps,
         "dtype": args.dtype, "mask": MASK_SPEC}
    mask = ctx.mask(MASK_SPEC, S, S)
    r["density"] = mask.density
    dense = mask.to_dense().cuda()
    weights = make_weights(cfg, dtype, seed)
    g = torch.Generator(device="cuda")
    g.manual_seed(seed + 1)
    x = torch.randn(B, S, cfg.hidden, generator=g, device="cuda",
                    dtype=torch.float32).to(dtype)

    # eager (the reference of the checks)
    eager_layer = make_layer_fn(cfg, sdpa_attention)
    y_eager = run_stack(eager_layer, x, weights, dense)
    torch.cuda.synchronize()
    if not args.no_fp32_ref:
        ref32 = fp32_reference(cfg, x, weights, dense)
        r["eager_err_fp32"] = rel_err(y_eager, ref32)
    else:
        ref32 = None
    r["eager_ms"] = time_ms(lambda: run_stack(eager_layer, x, weights, dense),
                            args.reps, args.warmup)

    # torch.compile with FlexAttention
    if not args.no_compile:
        try:
            from torch.nn.attention.flex_attention import create_block_mask
            table = dense

            def mask_mod(b, hh, q, k):
                return table[q, k]
            t0 = time.perf_counter()
            bm = create_block_mask(mask_mod, None, None, S, S, device="cuda")
            layer = make_layer_fn(cfg, flex_attention_fn())
            kw = {} if args.compile_mode == "default" else {"mode": args.compile_mode}
            if args.compile_stack:
                stack_c = torch.compile(lambda xx, ws, m: run_stack(layer, xx, ws, m),
                                        dynamic=False, **kw)
                fn = lambda: stack_c(x, weights, bm)  # noqa: E731
            else:
                layer_c = torch.compile(layer, dynamic=False, **kw)
                fn = lambda: run_stack(layer_c, x, weights, bm)  # noqa: E731
            y_c = fn()
            torch.cuda.synchronize()
            r["compile_first_s"] = time.perf_counter() - t0
            r["compile_err"] = rel_err(y_c, y_eager)
            if ref32 is not None:
                r["compile_err_fp32"] = rel_err(y_c, ref32)
            del y_c
            r["compile_ms"] = time_ms(fn, args.reps, args.warmup)
            del fn, bm
        except Exception as e:  # report and go on
            r["compile_error"] = short(e)
            print(f"# {cfg.name} {B}x{S}: torch.compile failed: {short(e)}",
                  file=sys.stderr, flush=True)
            if args.verbose:
                traceback.print_exc()

    # stof
    if not args.peers_only:
        layer = None
        try:
            act = "gelu_tanh" if cfg.act == "tanh" else "gelu_erf"
            t0 = time.perf_counter()
            layer = ctx.layer_plan(B, S, cfg.hidden, cfg.heads, cfg.ffn, dtype, act,
                                   "layer", cfg.pre_norm, mask, eps=cfg.eps)
            r["stof_plan_s"] = time.perf_counter() - t0
            desc = layer.describe()
            r["stof_describe"] = desc
            r["stof_source"] = desc.get("source")
            r["stof_scheme"] = desc.get("scheme", desc)
            if args.warm_plan:
                t0 = time.perf_counter()
                l2 = ctx.layer_plan(B, S, cfg.hidden, cfg.heads, cfg.ffn, dtype, act,
                                    "layer", cfg.pre_norm, mask, eps=cfg.eps)
                r["stof_warm_plan_s"] = time.perf_counter() - t0
                r["stof_warm_source"] = l2.describe().get("source")
                l2.close()
                del l2
            y = torch.empty_like(x)
            # one layer, then the stack without and with the graph
            y1_ref = eager_layer(x, weights[0], dense)
            y.fill_(float("nan"))
            layer.run(weights[0], x, y)
            torch.cuda.synchronize()
            r["stof_layer1_err"] = rel_err(y, y1_ref)
            del y1_ref
            y.fill_(float("nan"))
            layer.stack_run(weights, x, y, graph=False)
            torch.cuda.synchronize()
            r["stof_nograph_err"] = rel_err(y, y_eager)
            y.fill_(float("nan"))
            layer.stack_run(weights, x, y, graph=True)
            torch.cuda.synchronize()
            r["rel_err"] = rel_err(y, y_eager)
            r["max_abs_err"] = max_abs_err(y, y_eager)
            if ref32 is not None:
                r["stof_err_fp32"] = rel_err(y, ref32)
            r["stof_ok"] = (r["rel_err"] <= FAIL_REL_ERR and
                            r["stof_nograph_err"] <= FAIL_REL_ERR)
            r["stof_ms"] = time_ms(lambda: layer.stack_run(weights, x, y, graph=True),
                                   args.reps, args.warmup)
            # the graph replays of the timing must still give the same output
            r["stof_replay_err"] = rel_err(y, y_eager)
            r["stof_ok"] = r["stof_ok"] and r["stof_replay_err"] <= FAIL_REL_ERR
            if not args.no_graph_compare:
                r["stof_nograph_ms"] = time_ms(
                    lambda: layer.stack_run(weights, x, y, graph=False),
                    args.reps, args.warmup)
            del y
        except Exception as e:  # report and go on
            r["stof_error"] = short(e)
            r["stof_ok"] = False
            print(f"# {cfg.name} {B}x{S}: stof failed: {short(e)}",
                  file=sys.stderr, flush=True)
            if args.verbose:
                traceback.print_exc()
        finally:
            if layer is not None:
                layer.close()
            del layer
    peers = [r[k] for k in ("eager_ms", "compile_ms") if k in r]
    if "stof_ms" in r and peers:
        r["speedup"] = min(peers) / r["stof_ms"]
    return r  # the tensors go with this frame


def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else format("-", ">" +
                                                                        spec.split(".")[0])


def print_table(results):
    print()
    print(f"{'model':>10} {'BxS':>8} {'eager ms':>9} {'compile ms':>10} {'stof ms':>8} "
          f"{'x best':>7} {'stof err':>9} {'max abs':>8} {'plan s':>7} {'source':>8} "
          f"{'compile 1st s':>13}")
    for r in results:
        bs = f"{r['batch']}x{r['seq']}"
        err = r.get("rel_err")
        flag = "" if r.get("stof_ok", True) or "stof_error" in r else " FAIL"
        print(f"{r['model']:>10} {bs:>8} {fmt(r.get('eager_ms'), '9.3f')} "
              f"{fmt(r.get('compile_ms'), '10.3f')} {fmt(r.get('stof_ms'), '8.3f')} "
              f"{fmt(r.get('speedup'), '7.2f')} {fmt(err, '9.1e')} "
              f"{fmt(r.get('max_abs_err'), '8.1e')} {fmt(r.get('stof_plan_s'), '7.2f')} "
              f"{str(r.get('stof_source') or '-'):>8} "
              f"{fmt(r.get('compile_first_s'), '13.2f')}{flag}")
    print("x best = the faster of eager and compile / stof (whole stack, median); "
          f"stof err = |stof - eager| / |eager|, FAIL above {FAIL_REL_ERR:g}")
    errs = [r for r in results if "stof_error" in r or "compile_error" in r]
    if errs:
        print()
        for r in errs:
            for k in ("stof_error", "compile_error"):
                if k in r:
                    print(f"{r['model']} {r['batch']}x{r['seq']} {k}: {r[k]}")
    schemes = [r for r in results if "stof_scheme" in r]
    if schemes:
        print()
        print("stof fusion schemes:")
        for r in schemes:
            print(f"{r['model']} {r['batch']}x{r['seq']}: {json.dumps(r['stof_scheme'])}")
    acc = [r for r in results if "eager_err_fp32" in r]
    if acc:
        print()
        print("error against the fp32 eager stack (|out - ref32| / |ref32|):")
        print(f"{'model':>10} {'BxS':>8} {'eager':>9} {'compile':>9} {'stof':>9} "
              f"{'stof 1 layer':>12} {'stof no graph':>13}")
        for r in acc:
            bs = f"{r['batch']}x{r['seq']}"
            print(f"{r['model']:>10} {bs:>8} {fmt(r.get('eager_err_fp32'), '9.1e')} "
                  f"{fmt(r.get('compile_err_fp32'), '9.1e')} "
                  f"{fmt(r.get('stof_err_fp32'), '9.1e')} "
                  f"{fmt(r.get('stof_layer1_err'), '12.1e')} "
                  f"{fmt(r.get('stof_nograph_err'), '13.1e')}")
        print("(stof 1 layer and stof no graph are against eager fp16)")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS),
                    help="comma-separated, from %s" % ", ".join(MODELS))
    ap.add_argument("--sizes", default=SIZES, help="comma-separated BATCHxSEQ "
                    "(default: %(default)s)")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--act", default="tanh", choices=["tanh", "erf"],
                    help="GELU: tanh approximation (the protocol) or exact erf")
    ap.add_argument("--eps", type=float, default=1e-5, help="LayerNorm eps")
    ap.add_argument("--reps", type=int, default=20, help="timed runs (median)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed runs first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile mode (default, reduce-overhead, "
                    "max-autotune-no-cudagraphs, ...)")
    ap.add_argument("--compile-stack", action="store_true",
                    help="compile the whole stack as one function instead of "
                    "one layer called per layer")
    ap.add_argument("--peers-only", action="store_true",
                    help="only PyTorch (stof still builds the mask)")
    ap.add_argument("--no-fp32-ref", action="store_true",
                    help="skip the fp32 eager reference")
    ap.add_argument("--no-graph-compare", action="store_true",
                    help="skip timing stof's stack without the CUDA graph")
    ap.add_argument("--warm-plan", action="store_true",
                    help="also time a second (database-hit) plan")
    ap.add_argument("--user-db", default=os.environ.get("STOF_USER_DB"),
                    help="tuning database (default: $STOF_USER_DB, else a new "
                    "temporary file, so plans are cold)")
    ap.add_argument("--tuning-mode", default="default",
                    choices=["default", "cache-only", "force"])
    ap.add_argument("--json", help="write all results to this file")
    ap.add_argument("--verbose", action="store_true", help="tracebacks of failures")
    args = ap.parse_args()

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            ap.error("unknown model %r (known: %s)" % (m, ", ".join(MODELS)))
    sizes = []
    for s in args.sizes.split(","):
        try:
            b, n = (int(v) for v in s.lower().split("x"))
        except ValueError:
            ap.error("bad size %r (BATCHxSEQ)" % s)
        sizes.append((b, n))

    if not args.no_compile:
        # Each (model, size) brings a new mask_mod and shapes: leave room
        # for the recompiles, else dynamo falls back to eager silently.
        torch._dynamo.config.cache_size_limit = 1024
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 1024
        if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
            torch._dynamo.config.accumulated_cache_size_limit = 4096

    user_db = args.user_db
    if user_db is None:
        user_db = os.path.join(tempfile.mkdtemp(prefix="stof-bench-layers-"), "tuning.db")
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    ctx = stof.Context(user_db=user_db, tuning_mode=args.tuning_mode)
    dev = ctx.device()
    print(f"# {dev.get('name')}, torch {torch.__version__}, "
          f"stof {stof._load().stof_version_string().decode()}, db {user_db}, "
          f"mask {MASK_SPEC}, {args.dtype}, gelu_{args.act}, reps {args.reps}",
          flush=True)

    results = []
    with torch.no_grad():
        for mi, m in enumerate(models):
            for (b, n) in sizes:
                cfg = Cfg(m, b, n, args.act, args.eps)
                try:
                    r = bench_case(args, ctx, cfg, dtype, args.seed + 1000 * mi)
                except Exception as e:  # e.g. out of memory in a peer
                    r = {"model": m, "batch": b, "seq": n, "error": short(e)}
                    print(f"# {m} {b}x{n}: failed: {short(e)}", file=sys.stderr,
                          flush=True)
                    if args.verbose:
                        traceback.print_exc()
                results.append(r)
                line = {k: v for k, v in r.items() if k not in ("stof_describe",)}
                print(json.dumps(line), file=sys.stderr, flush=True)
                torch.cuda.synchronize()
                if not args.no_compile:
                    torch._dynamo.reset()  # drop the compiled code of this case
                torch.cuda.empty_cache()
    print_table([r for r in results if "error" not in r])
    for r in results:
        if "error" in r:
            print(f"{r['model']} {r['batch']}x{r['seq']}: failed: {r['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    bad = [r for r in results if "error" in r or
           (not args.peers_only and not r.get("stof_ok", False))]
    if bad:
        print(f"{len(bad)} case(s) failed or did not pass the {FAIL_REL_ERR:g} check",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
