"""Masks that change every batch: stof mask families against FlexAttention
and SDPA, in one process, same inputs (issue 12 situations).

  packed documents: 1 x 16 x 4096 x 64, causal within documents of 50-900
      tokens, new documents every batch. stof: one family plan, each batch
      runs with the new document ids (formats built on the GPU). Flex:
      create_block_mask(mask_mod over the ids) + flex_attention per batch.
  padded batches: 8 sequences of 64..512 tokens (16 heads, 64 dims) and 16
      of 128..2048: stof with per-sequence lengths; SDPA with the key
      padding mask; Flex with a per-batch mask_mod.

Per batch: wall time of the whole per-batch path (synchronised), and GPU
time of back-to-back batches (CUDA events); medians. The attention kernel's
own time and the builder's come from torch.profiler over the same runs.
Errors against an fp32 reference on the valid rows.
  packed varlen: 8 causal sequences of 64..512 and 16 of 128..2048 packed
      in (total, 16, 64) tensors (flash-attn's varlen layout): stof's packed
      plan with each batch's cu_seqlens; SDPA on the padded equivalent;
      Flex with a sequence-id mask_mod over the packing.

Usage: python bench/bench_family.py [--batches N] [--no-flex] [--no-packed]
       [--only-packed]
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0] + "/python")
import stof  # noqa: E402


def wall(fn, n):
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def events(fn, n, reps=5):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        s.record()
        for _ in range(n):
            fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) / n)
    return statistics.median(out)


def kernel_times(fn, n):
    """Mean GPU time per call of each kernel name (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    tot = {}
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            tot[ev.name] = tot.get(ev.name, 0.0) + ev.device_time / 1e3
    return {k: v / n for k, v in tot.items()}


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def reference(q, k, v, allowed):
    """fp32 attention with a (B, 1|H, Sq, Sk) bool mask; empty rows give 0."""
    s = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) / q.shape[-1] ** 0.5
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bhkd->bhqd", p, v.float())


def random_docs(n, lo, hi, gen):
    ids, d, left = [], 0, int(torch.randint(lo, hi + 1, (1,), generator=gen))
    for _ in range(n):
        if left == 0:
            d += 1
            left = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        ids.append(d)
        left -= 1
    return torch.tensor(ids, dtype=torch.int32)


def packed_docs(ctx, args, flex, create_block_mask, results):
    B, H, N, D = 1, 16, 4096, 64
    dt = torch.float16
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dt) for _ in range(3))
    out = torch.empty_like(q)
    batches = [random_docs(N, 50, 900, gen).cuda().view(1, N) for _ in range(args.batches)]
    fam = ctx.mask_family("causal&docs")
    t0 = time.perf_counter()
    plan = ctx.attention_plan_family(q, k, v, fam, sample={"doc_id": batches[0].cpu()})
    plan_s = time.perf_counter() - t0
    desc = plan.describe()
    r = {"case": "packed docs 1x16x4096x64 causal&docs", "plan_s": plan_s,
         "kernel": desc.get("kernel"), "params": desc.get("params"),
         "source": desc.get("source")}
    # Correctness on three instances.
    errs = []
    for ids in batches[:3]:
        out.fill_(float("nan"))
        plan.run(q, k, v, out, doc_id=ids)
        pos = torch.arange(N, device="cuda")
        allowed = (pos[None, :] <= pos[:, None]) & (ids[0][:, None] == ids[0][None, :])
        errs.append(rel_err(out, reference(q, k, v, allowed[None, None])))
    r["stof_err"] = max(errs)
    it = iter(range(10 ** 9))

    def stof_batch():
        plan.run(q, k, v, out, doc_id=batches[next(it) % len(batches)])
    r["stof_wall_ms"] = wall(stof_batch, 50)
    r["stof_gpu_ms"] = events(stof_batch, 50)
    kt = kernel_times(stof_batch, 50)
    r["stof_attn_kernel_ms"] = sum(t for n, t in kt.items() if n.startswith("stof_attn"))
    r["stof_builder_ms"] = sum(t for n, t in kt.items() if n.startswith("stof_mb_"))
    r["stof_kernels"] = kt
    if flex is not None:
        def flex_batch():
            ids = batches[next(it) % len(batches)][0]

            def mm(b, h, qi, ki):
                return (ki <= qi) & (ids[qi] == ids[ki])
            bm = create_block_mask(mm, 1, 1, N, N, device="cuda")
            return flex(q, k, v, block_mask=bm)
        fo = flex_batch()
        torch.cuda.synchronize()
        r["flex_wall_ms"] = wall(flex_batch, 20)
        ids = batches[0][0]

        def mm0(b, h, qi, ki):
            return (ki <= qi) & (ids[qi] == ids[ki])
        bm0 = create_block_mask(mm0, 1, 1, N, N, device="cuda")
        r["flex_kernel_only_ms"] = events(lambda: flex(q, k, v, block_mask=bm0), 50)
        r["flex_create_block_mask_ms"] = wall(
            lambda: create_block_mask(mm0, 1, 1, N, N, device="cuda"), 20)
        del fo
    results.append(r)
    print(json.dumps(r), file=sys.stderr, flush=True)


def padded(ctx, args, flex, create_block_mask, results, B, lo, hi, H=16, D=64):
    S = hi
    dt = torch.float16
    gen = torch.Generator().manual_seed(B)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dt) for _ in range(3))
    out = torch.empty_like(q)
    lens = [torch.randint(lo, hi + 1, (B,), generator=gen, dtype=torch.int32).cuda()
            for _ in range(args.batches)]
    fam = ctx.mask_family("dense")
    t0 = time.perf_counter()
    plan = ctx.attention_plan_family(q, k, v, fam,
                                     sample={"q_len": lens[0].cpu(), "k_len": lens[0].cpu()})
    r = {"case": f"padded {B} x {lo}..{hi} (16 heads, 64 dims)",
         "plan_s": time.perf_counter() - t0}
    desc = plan.describe()
    r["kernel"], r["params"], r["source"] = desc.get("kernel"), desc.get("params"), desc.get("source")
    pos = torch.arange(S, device="cuda")
    L = lens[0]
    kmask = pos[None, :] < L[:, None]                       # (B, S)
    qmask = kmask
    out.fill_(float("nan"))
    plan.run(q, k, v, out, q_len=L, k_len=L)
    allowed = (qmask[:, :, None] & kmask[:, None, :])[:, None]
    ref = reference(q, k, v, allowed)
    valid = qmask[:, None, :, None].expand_as(out)
    r["stof_err"] = rel_err(out[valid], ref[valid])
    r["stof_padding_rows_zero"] = bool((out[~valid] == 0).all().item())
    sd = F.scaled_dot_product_attention(q, k, v, attn_mask=kmask[:, None, None, :])
    r["sdpa_err"] = rel_err(sd[valid], ref[valid])
    it = iter(range(10 ** 9))

    def stof_batch():
        Lb = lens[next(it) % len(lens)]
        plan.run(q, k, v, out, q_len=Lb, k_len=Lb)

    def sdpa_batch():
        Lb = lens[next(it) % len(lens)]
        m = (pos[None, :] < Lb[:, None])[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    r["stof_wall_ms"] = wall(stof_batch, 50)
    r["stof_gpu_ms"] = events(stof_batch, 50)
    kt = kernel_times(stof_batch, 50)
    r["stof_attn_kernel_ms"] = sum(t for n, t in kt.items() if n.startswith("stof_attn"))
    r["stof_builder_ms"] = sum(t for n, t in kt.items() if n.startswith("stof_mb_"))
    r["sdpa_wall_ms"] = wall(sdpa_batch, 50)
    r["sdpa_gpu_ms"] = events(sdpa_batch, 50)
    if flex is not None:
        def flex_batch():
            Lb = lens[next(it) % len(lens)]

            def mm(b, h, qi, ki):
                return (qi < Lb[b]) & (ki < Lb[b])
            bm = create_block_mask(mm, B, 1, S, S, device="cuda")
            return flex(q, k, v, block_mask=bm)
        fo = flex_batch()
        torch.cuda.synchronize()
        r["flex_wall_ms"] = wall(flex_batch, 20)
        Lb0 = lens[0]

        def mm0(b, h, qi, ki):
            return (qi < Lb0[b]) & (ki < Lb0[b])
        bm0 = create_block_mask(mm0, B, 1, S, S, device="cuda")
        fo = flex(q, k, v, block_mask=bm0)
        r["flex_err"] = rel_err(fo[valid], ref[valid])
        r["flex_kernel_only_ms"] = events(lambda: flex(q, k, v, block_mask=bm0), 50)
    results.append(r)
    print(json.dumps(r), file=sys.stderr, flush=True)


def packed_varlen(ctx, args, flex, create_block_mask, results, B, lo, hi, H=16, D=64,
                  spec="causal"):
    """Packed sequences (flash-attn varlen layout): B causal sequences of
    lo..hi tokens one after another in (total, H, D) tensors, new lengths
    every batch. stof: one packed plan, each batch runs on the first `total`
    rows with its cu_seqlens. SDPA: the same sequences padded to hi, causal
    & key-padding bool mask (what a padded batch costs). Flex: the packed
    tensors as one sequence of B * hi rows, mask_mod causal within the
    sequence ids (a document mask over the packing), new block mask per
    batch."""
    dt = torch.float16
    T = B * hi
    gen = torch.Generator().manual_seed(100 + B)
    qb, kb, vb = (torch.randn(T, H, D, device="cuda", dtype=dt) for _ in range(3))
    ob = torch.empty_like(qb)
    lens = [torch.randint(lo, hi + 1, (B,), generator=gen, dtype=torch.int32)
            for _ in range(args.batches)]
    cus = [torch.cat([torch.zeros(1, dtype=torch.int32), L.cumsum(0).to(torch.int32)])
           for L in lens]
    cus_d = [c.cuda() for c in cus]
    fam = ctx.mask_family(spec)
    t0 = time.perf_counter()
    plan = ctx.attention_plan_packed(qb, kb, vb, fam, cus[0].tolist())
    r = {"case": f"packed varlen {B} x {lo}..{hi} {spec} ({H} heads, {D} dims)",
         "plan_s": time.perf_counter() - t0}
    desc = plan.describe()
    r["kernel"], r["params"], r["source"] = desc.get("kernel"), desc.get("params"), desc.get("source")
    # Correctness: every sequence against fp32, rows past the last zero.
    errs, tails = [], True
    for c in cus_d[:3]:
        tot = int(c[-1])
        ob.fill_(float("nan"))
        plan.run(qb[:tot], kb[:tot], vb[:tot], ob[:tot], c)
        for b in range(B):
            a, e = int(c[b]), int(c[b + 1])
            if e == a:
                continue
            qs, ks, vs = (x[a:e].transpose(0, 1)[None] for x in (qb, kb, vb))
            n = e - a
            allowed = torch.ones(n, n, dtype=torch.bool, device="cuda").tril()
            if spec != "causal":
                allowed = torch.ones(n, n, dtype=torch.bool, device="cuda")
            ref = reference(qs, ks, vs, allowed[None, None])
            errs.append(rel_err(ob[a:e].transpose(0, 1)[None], ref))
        tails &= bool(torch.isnan(ob[tot:]).all().item())  # never written
    r["stof_err"] = max(errs)
    r["stof_rows_past_total_untouched"] = tails
    it = iter(range(10 ** 9))

    totals = [int(c[-1]) for c in cus]

    def stof_batch():
        i = next(it) % len(cus_d)
        tot = totals[i]
        plan.run(qb[:tot], kb[:tot], vb[:tot], ob[:tot], cus_d[i])

    # SDPA on the padded equivalent (B, H, hi, D), causal & key padding.
    qp, kp, vp = (torch.randn(B, H, hi, D, device="cuda", dtype=dt) for _ in range(3))
    pos = torch.arange(hi, device="cuda")
    causal = pos[None, :] <= pos[:, None]
    Ld = [L.cuda() for L in lens]

    def sdpa_batch():
        L = Ld[next(it) % len(Ld)]
        m = causal[None, None] & (pos[None, None, None, :] < L[:, None, None, None])
        return F.scaled_dot_product_attention(qp, kp, vp, attn_mask=m)
    r["stof_wall_ms"] = wall(stof_batch, 50)
    r["stof_gpu_ms"] = events(stof_batch, 50)
    kt = kernel_times(stof_batch, 50)
    r["stof_attn_kernel_ms"] = sum(t for n, t in kt.items() if n.startswith("stof_attn"))
    r["stof_builder_ms"] = sum(t for n, t in kt.items() if n.startswith("stof_mb_"))
    r["sdpa_wall_ms"] = wall(sdpa_batch, 50)
    r["sdpa_gpu_ms"] = events(sdpa_batch, 50)
    if flex is not None:
        q1, k1, v1 = (x.transpose(0, 1)[None] for x in (qb, kb, vb))

        def seq_ids(c):
            ids = torch.full((T,), -1, dtype=torch.int32, device="cuda")
            for b in range(B):
                ids[int(c[b]):int(c[b + 1])] = b
            return ids
        ids_all = [seq_ids(c) for c in cus]

        def flex_batch():
            ids = ids_all[next(it) % len(ids_all)]

            def mm(b, h, qi, ki):
                return (ids[qi] == ids[ki]) & (ids[qi] >= 0) & (ki <= qi)
            bm = create_block_mask(mm, 1, 1, T, T, device="cuda")
            return flex(q1, k1, v1, block_mask=bm)
        fo = flex_batch()
        torch.cuda.synchronize()
        r["flex_wall_ms"] = wall(flex_batch, 20)
        ids0 = ids_all[0]

        def mm0(b, h, qi, ki):
            return (ids0[qi] == ids0[ki]) & (ids0[qi] >= 0) & (ki <= qi)
        bm0 = create_block_mask(mm0, 1, 1, T, T, device="cuda")
        r["flex_kernel_only_ms"] = events(lambda: flex(q1, k1, v1, block_mask=bm0), 50)
        del fo
    results.append(r)
    print(json.dumps(r), file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=16, help="distinct instances")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--no-packed", action="store_true")
    ap.add_argument("--only-packed", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    flex = create_block_mask = None
    if not args.no_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        import torch._dynamo
        torch._dynamo.config.cache_size_limit = 1024
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 1024
        flex = torch.compile(flex_attention, dynamic=False)
    ctx = stof.Context()
    dev = ctx.device()
    print(f"# {dev['name']}, driver {dev.get('driver_version')}, torch {torch.__version__}, "
          f"stof {stof._load().stof_version_string().decode()}", flush=True)
    results = []
    if not args.only_packed:
        packed_docs(ctx, args, flex, create_block_mask, results)
        padded(ctx, args, flex, create_block_mask, results, 8, 64, 512)
        padded(ctx, args, flex, create_block_mask, results, 16, 128, 2048)
    if not args.no_packed:
        packed_varlen(ctx, args, flex, create_block_mask, results, 8, 64, 512)
        packed_varlen(ctx, args, flex, create_block_mask, results, 16, 128, 2048)
    print()
    print("| case | stof per batch ms (wall) | stof GPU ms | attn kernel ms | builder ms | "
          "SDPA ms (wall) | Flex per batch ms (wall) | Flex kernel ms | x SDPA | x Flex | stof err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        sd = r.get("sdpa_wall_ms", float("nan"))
        fl = r.get("flex_wall_ms", float("nan"))
        print(f"| {r['case']} | {r['stof_wall_ms']:.3f} | {r['stof_gpu_ms']:.3f} | "
              f"{r['stof_attn_kernel_ms']:.3f} | {r['stof_builder_ms']:.4f} | {sd:.3f} | "
              f"{fl:.3f} | {r.get('flex_kernel_only_ms', float('nan')):.3f} | "
              f"{sd / r['stof_wall_ms']:.2f} | {fl / r['stof_wall_ms']:.2f} | "
              f"{r['stof_err']:.1e} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
