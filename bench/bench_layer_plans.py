"""Warm layer plans: how long stof_layer_plan takes when the layer is in the
tuning database (the Hopper-GEMM issue's target: at most 1 ms), and where
that time goes (the layer's "plan_ms": attention, buffers, kernels).

For each size: the bigbird mask bench_layers.py uses, one plan into the
database (tuning when it is not there yet), then --reps plans of the same
layer in the same process (wall time of each call and its parts, and the device memory the layer
holds: its buffers and cuBLASLt's workspace, "device_bytes"). With
--fresh, the same in a new process started by this one on the same
database, after the first: its first plan of each size loads the modules
(and, for the first of all, starts CUDA and cuBLASLt). With --preload too,
a third process calls stof_preload (Context.preload) first, as a server
would at start: its row "load" is that call, and its plans then load no
module.

Usage: python bench/bench_layer_plans.py [--model bert-base]
       [--sizes 1x128,8x512,16x2048] [--reps 3] [--db FILE] [--fresh]
       [--preload] [--json FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0] + "/python")
import stof  # noqa: E402

MASK_SPEC = "bigbird:64:3:2:3:1"  # as bench_layers.py
# hidden, heads, ffn, norm, pre_norm, act (bench_layers.py's shapes)
MODELS = {
    "bert-base": (768, 12, 3072, "layer", False, "gelu_erf"),
    "bert-large": (1024, 16, 4096, "layer", False, "gelu_erf"),
    "gpt2": (768, 12, 3072, "layer", True, "gelu_erf"),
}


def plans(ctx, model, B, S, n):
    """n + 1 plans of one layer; [(ms, source, plan_ms parts)]."""
    hidden, heads, ffn, norm, pre, act = MODELS[model]
    mask = ctx.mask(MASK_SPEC, S, S)
    out = []
    for _ in range(n + 1):
        t0 = time.perf_counter()
        layer = ctx.layer_plan(B, S, hidden, heads, ffn, "fp16", act, norm,
                               pre, mask, eps=1e-5)
        ms = (time.perf_counter() - t0) * 1e3
        d = layer.describe()
        out.append((ms, d.get("source"), d.get("plan_ms") or {},
                    d.get("device_bytes") or {}))
        layer.close()
    return out


def run(args, label):
    ctx = stof.Context(user_db=args.db)
    rows = []
    if label == "preload":
        t0 = time.perf_counter()
        n = ctx.preload()
        rows.append({"process": label, "size": "-", "plan": "load",
                     "ms": (time.perf_counter() - t0) * 1e3,
                     "source": f"{n} mod", "parts": {}, "device_bytes": {}})
    for size in args.sizes.split(","):
        B, S = (int(x) for x in size.split("x"))
        for i, (ms, src, parts, mem) in enumerate(plans(ctx, args.model, B,
                                                        S, args.reps)):
            rows.append({"process": label, "size": size, "plan": i,
                         "ms": ms, "source": src, "parts": parts,
                         "device_bytes": mem})
    return rows


def mib(b):
    """Bytes as MiB for the table; '-' when the library reports none."""
    return "-" if b is None else f"{b / 2**20:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert-base", choices=sorted(MODELS))
    ap.add_argument("--sizes", default="1x128,8x512,16x2048")
    ap.add_argument("--reps", type=int, default=3,
                    help="plans from the database after the first")
    ap.add_argument("--db", help="the tuning database (kept; default: a "
                    "new temporary file)")
    ap.add_argument("--fresh", action="store_true",
                    help="then the same in a new process on that database")
    ap.add_argument("--preload", action="store_true",
                    help="with --fresh: a third process that preloads the "
                    "database's modules before its plans")
    ap.add_argument("--child", choices=["fresh", "preload"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    if args.preload and not args.fresh:
        ap.error("--preload needs --fresh")
    temp = None
    if not args.db:
        temp = tempfile.mkdtemp(prefix="stof-plans-")
        args.db = os.path.join(temp, "tuning.db")
    if args.child:
        json.dump(run(args, args.child), sys.stdout)
        return
    rows = run(args, "first")
    for child in (["fresh"] if args.fresh else []) + \
            (["preload"] if args.preload else []):
        cmd = [sys.executable, __file__, "--child", child, "--model",
               args.model, "--sizes", args.sizes, "--reps", str(args.reps),
               "--db", args.db]
        rows += json.loads(subprocess.run(cmd, check=True, text=True,
                                          stdout=subprocess.PIPE).stdout)
    print(f"{args.model} layer plans, mask {MASK_SPEC}, fp16, database "
          f"{args.db}")
    print(f"{'process':>8} {'size':>8} {'plan':>4} {'ms':>9} {'source':>9}"
          f" {'attention':>9} {'buffers':>8} {'kernels':>8}"
          f" {'MiB':>7} {'lt MiB':>6}")
    for r in rows:
        p = r["parts"]
        print(f"{r['process']:>8} {r['size']:>8} {r['plan']:>4} "
              f"{r['ms']:>9.3f} {r['source']:>9} "
              f"{p.get('attention', float('nan')):>9.3f} "
              f"{p.get('buffers', float('nan')):>8.3f} "
              f"{p.get('kernels', float('nan')):>8.3f} "
              f"{mib(r.get('device_bytes', {}).get('buffers')):>7} "
              f"{mib(r.get('device_bytes', {}).get('cublaslt')):>6}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if temp:
        print(f"(the database is left at {args.db})")


if __name__ == "__main__":
    main()
