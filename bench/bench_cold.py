"""Cold plans of small problems (issue 13: tuning cost in proportion to the
problem; at most 3 s when the kernel runs under 0.1 ms): each problem
planned once into a fresh database in a fresh context (the process's
first compiles paid by a warm-up problem first), its wall time, the
kernel it chose and that kernel's time (triton do_bench median).

Usage: python bench/bench_cold.py [--problems 32x32x1x8192x128:dense,...]
       [--json FILE]
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch
import triton.testing

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0] + "/python")
import stof  # noqa: E402

DEFAULT = ("32x32x1x8192x128:dense,32x32x1x8192x128:sliding:4096,"
           "8x32x16x8192x128:causal,4x16x128x128x64:dense,"
           "16x16x256x256x64:causal,1x16x1024x1024x64:bigbird:64:3:2:3:1")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default=DEFAULT)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ctx = stof.Context(user_db=os.path.join(tmp, "warm.db"))
        q = torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.float16)
        ctx.attention_plan(q, q, q, ctx.mask("causal", 256, 256))  # warm-up
        for i, item in enumerate(args.problems.split(",")):
            shape, spec = item.split(":", 1)
            B, H, SQ, SK, D = (int(x) for x in shape.split("x"))
            ctx = stof.Context(user_db=os.path.join(tmp, "p%d.db" % i))
            q = torch.randn(B, H, SQ, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(B, H, SK, D, device="cuda", dtype=torch.bfloat16)
            out = torch.empty_like(q)
            m = ctx.mask(spec, SQ, SK)
            t0 = time.perf_counter()
            p = ctx.attention_plan(q, k, k, m, out=out)
            plan_s = time.perf_counter() - t0
            dsc = p.describe()
            ms = triton.testing.do_bench(lambda: p.run(q, k, k, out), warmup=25,
                                         rep=200, return_mode="median")
            r = {"problem": item, "cold_plan_s": plan_s, "kernel": dsc.get("kernel"),
                 "params": dsc.get("params"), "candidates": dsc.get("candidates"),
                 "kernel_ms": ms, "source": dsc.get("source")}
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    print("| problem | cold plan s | kernel | kernel ms |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['problem']} | {r['cold_plan_s']:.2f} | {r['kernel']} | {r['kernel_ms']:.4f} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
