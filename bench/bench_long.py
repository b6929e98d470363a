"""Long context with mask families (issue 12, part 4): sliding windows at
64k-256k tokens, bf16, 16 heads of 128, in one process.

For each (N, W): the family plan of `sliding:W` cold (a fresh tuning
database: stage 1 on tile-by-tile formats, stage 2 against the GPU
reference) and warm (the same problem again: a database hit), with the
plan's wall time and the host memory it takes at its peak (VmHWM after a
reset, minus VmRSS before: /proc/self/clear_refs); then the attention
kernel against FlexAttention (compiled flex_attention, block mask made
once with _compile=True; its creation timed apart), CUDA events, medians; and the
error of 64 sampled rows against an fp32 reference.

Usage: python bench/bench_long.py [--sizes 65536:2048,131072:4096]
       [--heads 16] [--no-flex] [--json FILE]
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


def status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak():
    """Make VmHWM restart from the current RSS (Linux: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measured(fn):
    """(result, wall seconds, peak host memory growth in MB) of fn()."""
    torch.cuda.synchronize()
    ok = reset_peak()
    base = status_kb("VmRSS")
    t0 = time.perf_counter()
    r = fn()
    dt = time.perf_counter() - t0
    peak = (status_kb("VmHWM") - base) / 1024.0 if ok else float("nan")
    return r, dt, peak


def events(fn, n, reps=5):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        s.record()
        for _ in range(n):
            fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) / n)
    return statistics.median(out)


def sampled_error(q, k, v, out, W, rows):
    """Relative error of out's rows against fp32 attention with |q-k| < W."""
    N = k.shape[2]
    qs = q[:, :, rows].float()
    s = torch.einsum("bhqd,bhkd->bhqk", qs, k.float()) / q.shape[-1] ** 0.5
    pos = torch.arange(N, device=q.device)
    allowed = (rows[:, None] - pos[None, :]).abs() < W
    s = s.masked_fill(~allowed[None, None], float("-inf"))
    ref = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, -1), v.float())
    got = out[:, :, rows].float()
    return ((got - ref).norm() / ref.norm()).item()


def one(args, N, W, flex, create_block_mask):
    B, H, D = 1, args.heads, 128
    dt = torch.bfloat16
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dt) for _ in range(3))
    out = torch.empty_like(q)
    db = tempfile.NamedTemporaryFile(suffix=".db", delete=False).name
    os.unlink(db)
    ctx = stof.Context(user_db=db)
    fam = ctx.mask_family("sliding:%d" % W)
    r = {"case": "sliding:%d %dx%dx%dx%d bf16" % (W, B, H, N, D)}
    # Warm the context (CUDA, the builder's compile) on a small problem so
    # that the cold figure is the plan's own.
    qs = q[:, :, :256].contiguous()
    ctx.attention_plan_family(qs, qs, qs, fam)
    plan, r["cold_plan_s"], r["cold_plan_host_mb"] = measured(
        lambda: ctx.attention_plan_family(q, k, v, fam))
    d = plan.describe()
    r.update(kernel=d.get("kernel"), params=d.get("params"), source=d.get("source"),
             tuned_ms=d.get("time_ms"), candidates=d.get("candidates"),
             workspace_mb=d.get("family", {}).get("workspace_bytes", 0) / 2 ** 20)
    warm, warm_mb = [], []
    for _ in range(5):
        p2, t, mb = measured(lambda: ctx.attention_plan_family(q, k, v, fam))
        warm.append(t * 1e3)
        warm_mb.append(mb)
        r["warm_source"] = p2.describe().get("source")
        del p2
    r["warm_plan_ms"] = statistics.median(warm)
    r["warm_plan_host_mb"] = max(warm_mb)
    out.fill_(float("nan"))
    plan.run(q, k, v, out)
    torch.cuda.synchronize()
    gen = torch.Generator().manual_seed(N)
    rows = torch.cat([torch.tensor([0, N - 1]),
                      torch.randint(0, N, (62,), generator=gen)]).cuda()
    r["stof_err"] = sampled_error(q, k, v, out, W, rows)
    r["stof_ms"] = events(lambda: plan.run(q, k, v, out), 10)
    flops = 4.0 * B * H * D * sum(min(N, i + W) - max(0, i - W + 1) for i in range(0, N, 64)) * 64
    r["stof_tflops"] = flops / r["stof_ms"] / 1e9
    if flex is not None:
        def mm(b, h, qi, ki):
            return (qi - ki).abs() < W
        bm, t, _ = measured(lambda: create_block_mask(mm, None, None, N, N, device="cuda",
                                                      _compile=True))
        r["flex_create_block_mask_s"] = t
        fo = flex(q, k, v, block_mask=bm)
        torch.cuda.synchronize()
        r["flex_err"] = sampled_error(q, k, v, fo, W, rows)
        del fo
        r["flex_ms"] = events(lambda: flex(q, k, v, block_mask=bm), 10)
        r["speedup_vs_flex"] = r["flex_ms"] / r["stof_ms"]
    del plan
    ctx.close()
    for f in (db, db + "-wal", db + "-shm"):
        if os.path.exists(f):
            os.unlink(f)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="65536:2048,65536:4096,131072:4096,262144:4096")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    flex = create_block_mask = None
    if not args.no_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
    results = []
    for item in args.sizes.split(","):
        N, W = (int(x) for x in item.split(":"))
        r = one(args, N, W, flex, create_block_mask)
        results.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    print("| case | cold plan s | cold host MB | warm plan ms | warm host MB | "
          "stof ms | TF/s | Flex ms | stof vs Flex | err stof / Flex |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print("| %s | %.2f | %.1f | %.2f | %.1f | %.3f | %.0f | %s | %s | %.1e / %s |" % (
            r["case"], r["cold_plan_s"], r["cold_plan_host_mb"], r["warm_plan_ms"],
            r["warm_plan_host_mb"], r["stof_ms"], r["stof_tflops"],
            "%.3f" % r["flex_ms"] if "flex_ms" in r else "-",
            "%.2fx" % r["speedup_vs_flex"] if "speedup_vs_flex" in r else "-",
            r["stof_err"], "%.1e" % r["flex_err"] if "flex_err" in r else "-"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
