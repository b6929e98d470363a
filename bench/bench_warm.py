"""Warm plans of the public suite: how long a plan takes when its problem is
in the tuning database (issue 12: at most 1 ms in-process at every size),
and where that time goes (the plan's own "plan_ms": key, lookup, formats,
load, verify).

For each shape and mask: the mask from its spec (timed apart), one plan
into a fresh database (tuning), then 7 plans of the same problem in the
same process: wall time of each call, median, and the median of each part.
With --family, the same masks through stof_attention_plan_family (the
default instance) where the spec is built on the GPU.

With --db FILE the database is kept (and reused); with --fresh, each
problem is planned once in this new process from that database (a fresh
process's first hit: nothing may be compiled, the builder's cubin comes
from the database), the plan's parts and where its formats were built.

Usage: python bench/bench_warm.py [--shapes 4x16x4096x64,1x32x8192x128]
       [--family] [--db FILE [--fresh]] [--json FILE]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0] + "/python")
import stof  # noqa: E402

SUITE = [("none", "dense"), ("causal", "causal"), ("sliding", "sliding:256"),
         ("dilated", "dilated:512:2"), ("longformer", "longformer:256:64"),
         ("bigbird", "bigbird:64:3:2:3:1"), ("strided", "strided:128")]
PARTS = ("key", "lookup", "formats", "load", "verify")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4x16x4096x64,1x32x8192x128")
    ap.add_argument("--family", action="store_true")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--db", help="the tuning database (kept)")
    ap.add_argument("--fresh", action="store_true",
                    help="one plan per problem, from --db, in this process")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.fresh and not args.db:
        ap.error("--fresh needs --db")
    db = args.db or tempfile.NamedTemporaryFile(suffix=".db", delete=False).name
    if not args.db:
        os.unlink(db)
    ctx = stof.Context(user_db=db)
    rows = []
    for shape in args.shapes.split(","):
        B, H, N, D = (int(x) for x in shape.split("x"))
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16)
                   for _ in range(3))
        for name, spec in SUITE:
            r = {"shape": shape, "mask": name}
            if args.family:
                try:
                    fam = ctx.mask_family(spec)
                    make = lambda: ctx.attention_plan_family(q, k, v, fam)  # noqa: E731
                    make()
                except stof.StofError as e:
                    r["skipped"] = str(e)[:80]
                    rows.append(r)
                    continue
            else:
                t0 = time.perf_counter()
                mask = ctx.mask(spec, N, N)
                r["mask_ms"] = (time.perf_counter() - t0) * 1e3
                make = lambda: ctx.attention_plan(q, k, v, mask)  # noqa: E731
                if not args.fresh:
                    make()  # tunes
            walls, parts = [], {p: [] for p in PARTS}
            for _ in range(1 if args.fresh else args.reps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                p = make()
                walls.append((time.perf_counter() - t0) * 1e3)
                d = p.describe()
                r["source"], r["kernel"] = d.get("source"), d.get("kernel")
                r["formats_built_on"] = d.get("formats_built_on")
                for part in PARTS:
                    parts[part].append(d.get("plan_ms", {}).get(part) or 0.0)
                del p
            r["warm_ms"] = statistics.median(walls)
            for part in PARTS:
                r[part + "_ms"] = statistics.median(parts[part])
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    print("| shape | mask | kernel | source | mask from spec ms | warm plan ms | "
          "key | lookup | formats | load | verify | formats on |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "skipped" in r:
            print("| %s | %s | skipped: %s |" % (r["shape"], r["mask"], r["skipped"]))
            continue
        print("| %s | %s | %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s |" % (
            r["shape"], r["mask"], r["kernel"], r["source"],
            "%.1f" % r["mask_ms"] if "mask_ms" in r else "-", r["warm_ms"],
            r["key_ms"], r["lookup_ms"], r["formats_ms"], r["load_ms"], r["verify_ms"],
            r.get("formats_built_on")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    ctx.close()
    for f in (db, db + "-wal", db + "-shm"):
        if not args.db and os.path.exists(f):
            os.unlink(f)


if __name__ == "__main__":
    main()
