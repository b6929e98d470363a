"""stof.attention, the torch.library operator (python/stof/ops.py), on the
GPU: against an fp32 reference in BHSD and BSHD layouts, with grouped-query
K/V and with an additive bias; a padded batch by its lengths (q_lens,
k_lens) and SDPA-style attn_mask (boolean, additive); inside
torch.compile(fullgraph=True) (a graph
break fails the compile), under a captured CUDA graph and under
mode="reduce-overhead"; and the operator's per-call overhead over a direct
Plan.run (printed). Skips (exit 77) without PyTorch or a GPU."""
import sys
import time

from gpu_test import require

require()
import torch  # noqa: E402
import stof  # noqa: E402


def reference(q, k, v, allowed, scale=None, bias=None):
    """fp32 attention, (B, H, S, D); K/V heads repeated for GQA; rows with no
    allowed key give zeros."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1).float(), v.repeat_interleave(g, 1).float()
    s = torch.einsum("bhqd,bhkd->bhqk", q.float(), k)
    s = s * (scale if scale is not None else q.shape[-1] ** -0.5)
    if bias is not None:
        s = s + bias.float()
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, -1).nan_to_num(0), v)


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def expect(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)
    print("ok:", what)


def main():
    torch.manual_seed(0)
    dev = "cuda"
    ctx = stof.Context()

    # BHSD, causal, fp16.
    q, k, v = (torch.randn(2, 8, 256, 64, device=dev, dtype=torch.float16)
               for _ in range(3))
    allowed = ctx.mask("causal", 256, 256).to_dense().to(dev)
    out = stof.attention(q, k, v, mask="causal")
    e = rel_err(out, reference(q, k, v, allowed))
    expect(out.shape == q.shape and e < 1e-2, f"BHSD causal fp16, rel err {e:.2e}")

    # BSHD, grouped-query K/V (2 heads for 8), sliding window, bf16,
    # explicit scale.
    q = torch.randn(1, 300, 8, 64, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 300, 2, 64, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, 300, 2, 64, device=dev, dtype=torch.bfloat16)
    allowed = ctx.mask("sliding:64", 300, 300).to_dense().to(dev)
    out = stof.attention(q, k, v, mask="sliding:64", scale=0.1, layout="bshd")
    want = reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                     allowed, scale=0.1).transpose(1, 2)
    e = rel_err(out, want)
    expect(out.shape == q.shape and out.stride() == q.stride() and e < 2e-2,
           f"BSHD GQA sliding bf16, rel err {e:.2e}")

    # An additive bias per head, broadcast over the batch.
    q, k, v = (torch.randn(2, 4, 128, 64, device=dev, dtype=torch.float16)
               for _ in range(3))
    bias = torch.randn(1, 4, 128, 128, device=dev, dtype=torch.float16)
    allowed = torch.ones(128, 128, dtype=torch.bool, device=dev)
    out = stof.attention(q, k, v, mask="dense", bias=bias)
    e = rel_err(out, reference(q, k, v, allowed, bias=bias))
    expect(e < 1e-2, f"additive bias, rel err {e:.2e}")

    # The registered operator called directly (what compiled graphs call).
    direct = torch.ops.stof.attention(q, k, v, "dense", 0.0, 0.0, bias)
    expect(torch.equal(direct, out), "torch.ops.stof.attention matches stof.attention")

    # torch.compile(fullgraph=True): any graph break raises.
    class Block(torch.nn.Module):
        def forward(self, x):
            y = stof.attention(x * 0.5, x, x, mask="causal")
            return y + 1.0

    x = torch.randn(2, 8, 256, 64, device=dev, dtype=torch.float16)
    eager = Block()(x)
    compiled = torch.compile(Block(), fullgraph=True)
    got = compiled(x)
    expect(torch.equal(got, eager), "torch.compile(fullgraph=True) matches eager")

    # A captured CUDA graph (the plan exists from the calls above).
    static_x = x.clone()
    stof.attention(static_x, static_x, static_x, mask="causal")  # warm-up
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = stof.attention(static_x, static_x, static_x, mask="causal")
    x2 = torch.randn_like(x)
    static_x.copy_(x2)
    g.replay()
    torch.cuda.synchronize()
    expect(torch.equal(static_y, stof.attention(x2, x2, x2, mask="causal")),
           "CUDA graph replay matches a direct call")

    # mode="reduce-overhead" (CUDA graphs under torch.compile).
    ro = torch.compile(Block(), mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        got = ro(x2)
    expect(torch.equal(got, Block()(x2)), "mode='reduce-overhead' matches eager")

    # A padded batch by its lengths (a mask family, planned once): key
    # lengths only (causal), then query and key lengths (dense; padded
    # query rows give zeros); lists and int64 tensors are taken too.
    B, S = 3, 200
    q, k, v = (torch.randn(B, 4, S, 64, device=dev, dtype=torch.float16)
               for _ in range(3))
    lens = torch.tensor([200, 130, 7], device=dev, dtype=torch.int32)
    pos = torch.arange(S, device=dev)
    kvalid = pos[None, :] < lens[:, None]                      # (B, S)
    causal = pos[:, None] >= pos[None, :]
    allowed = (causal[None] & kvalid[:, None, :])[:, None]     # (B, 1, S, S)
    out = stof.attention(q, k, v, mask="causal", k_lens=lens)
    e = rel_err(out, reference(q, k, v, allowed))
    expect(e < 1e-2, f"causal with k_lens, rel err {e:.2e}")
    qk = kvalid[:, :, None] & kvalid[:, None, :]
    out = stof.attention(q, k, v, mask="dense", q_lens=[200, 130, 7],
                         k_lens=lens.long())
    want = reference(q, k, v, qk[:, None])
    e = rel_err(out, want)
    pad_rows = out[1, :, 130:].abs().max().item() + out[2, :, 7:].abs().max().item()
    expect(e < 1e-2 and pad_rows == 0.0,
           f"dense with q_lens and k_lens, rel err {e:.2e}, padded rows zero")
    try:
        stof.attention(q, k, v, mask="causal", k_lens=lens[:2])
        expect(False, "k_lens of the wrong shape refused")
    except ValueError as err:
        expect("k_lens" in str(err), f"k_lens of the wrong shape refused ({err})")

    class Padded(torch.nn.Module):
        def forward(self, x, n):
            return stof.attention(x, x, x, mask="causal", k_lens=n) * 2.0

    lens2 = torch.tensor([S, 50, 120], device=dev, dtype=torch.int32)
    eager = Padded()(q, lens2)
    got = torch.compile(Padded(), fullgraph=True)(q, lens2)
    expect(torch.equal(got, eager), "k_lens under torch.compile(fullgraph=True)")

    # attn_mask as SDPA takes it: boolean (True = attend) and additive.
    keep = torch.rand(B, 1, S, S, device=dev) < 0.3
    keep[..., 0] = True
    out = stof.attention(q, k, v, attn_mask=keep)
    e = rel_err(out, reference(q, k, v, keep))
    expect(e < 1e-2, f"boolean attn_mask, rel err {e:.2e}")
    add = torch.randn(B, 4, S, S, device=dev, dtype=torch.float16)
    add = add.masked_fill(~keep, float("-inf"))
    out = stof.attention(q, k, v, mask="causal", attn_mask=add)
    want = reference(q, k, v, keep & causal[None, None],
                     bias=add.masked_fill(~keep, 0))
    e = rel_err(out, want)
    expect(e < 1e-2, f"additive attn_mask on top of a causal mask, rel err {e:.2e}")
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    e = rel_err(stof.attention(q, k, v, attn_mask=keep), sdpa)
    expect(e < 1e-2, f"boolean attn_mask matches SDPA, rel err {e:.2e}")

    # Overhead per call: the operator against Plan.run on the same plan, a
    # small problem (launch-bound), host time over many calls.
    q, k, v = (torch.randn(1, 8, 128, 64, device=dev, dtype=torch.float16)
               for _ in range(3))
    o = torch.empty_like(q)
    m = ctx.mask("causal", 128, 128)
    plan = ctx.attention_plan(q, k, v, m, out=o)
    n = 2000

    def per_call(fn):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / n * 1e6

    best_op = best_run = best_disp = float("inf")
    for _ in range(3):
        best_run = min(best_run, per_call(lambda: plan.run(q, k, v, o)))
        best_op = min(best_op, per_call(lambda: stof.attention(q, k, v, mask="causal")))
        best_disp = min(best_disp, per_call(
            lambda: torch.ops.stof.attention(q, k, v, "causal", 0.0, 0.0, None)))
    print(f"overhead: Plan.run {best_run:.1f} us/call; stof.attention "
          f"{best_op:.1f} us/call ({best_op - best_run:+.1f} us); "
          f"torch.ops.stof.attention through the dispatcher {best_disp:.1f} "
          f"us/call ({best_disp - best_run:+.1f} us) (1x8x128x64 causal, "
          f"{n} calls, best of 3)")
    check_streams()
    check_no_backward()
    check_compiled_grad_mode()
    check_threads_share_plans()
    print("all checks passed")
    return 0


def check_no_backward():
    """Inference only: with grad mode on and q requiring grad, the output
    is recorded and its backward raises by name (a model trained with it
    must not leave q, k, v untrained without a word), for the structured
    and the family path; the forward's values are the same."""
    dev = "cuda"
    q, k, v = (torch.randn(2, 4, 128, 64, device=dev, dtype=torch.float16)
               for _ in range(3))
    with torch.no_grad():
        want = stof.attention(q, k, v, mask="causal")
        want_f = stof.attention(q, k, v, mask="causal",
                                k_lens=torch.tensor([100, 128], dtype=torch.int32))
    for name, kw, ref in (("structured", {}, want),
                          ("family", {"k_lens": torch.tensor(
                              [100, 128], dtype=torch.int32)}, want_f)):
        qg = q.clone().requires_grad_()
        out = stof.attention(qg, k, v, mask="causal", **kw)
        expect(out.requires_grad and torch.equal(out.detach(), ref),
               f"{name}: recorded by autograd, same values")
        try:
            out.float().sum().backward()
        except RuntimeError as e:
            expect("inference" in str(e), f"{name}: backward raises: {e}")
        else:
            expect(False, f"{name}: backward ran (q's grad would be wrong)")
    # A forward outside no_grad (weights requiring grad) whose later layers
    # reuse the first one's format (after=, as the transformers backend
    # passes it): recorded, and not refused.
    lens = torch.tensor([100, 128], dtype=torch.int32, device=dev)
    qg = q.clone().requires_grad_()
    first = stof.ops.family_attention(qg, k, v, "causal", 0.0, k_lens=lens)
    second = stof.ops.family_attention(qg, k, v, "causal", 0.0, k_lens=lens,
                                       after=True)
    expect(second.requires_grad and torch.equal(first.detach(), second.detach())
           and torch.equal(first.detach(), want_f),
           "grad mode: a reused format (after=) runs through the operator")


def check_compiled_grad_mode():
    """torch.compile of a function calling stof.attention on projections
    whose weights require grad (eval outside no_grad): compiles (the
    backward is traced ahead of time with fakes) and gives the eager
    values; a backward that really runs raises by name."""
    dev = "cuda"
    torch.manual_seed(3)
    lin = torch.nn.Linear(64, 64, device=dev, dtype=torch.float16)
    x = torch.randn(2, 4, 128, 64, device=dev, dtype=torch.float16)

    def f(t):
        return stof.attention(lin(t), lin(t), lin(t), mask="causal")

    def g(t):
        return stof.attention(lin(t), lin(t), lin(t), mask="causal",
                              k_lens=torch.tensor([100, 128], dtype=torch.int32,
                                                  device=dev))

    for name, fn in (("structured", f), ("family", g)):
        with torch.no_grad():
            want = fn(x)
        try:
            out = torch.compile(fn)(x)
        except Exception as e:  # noqa: BLE001 (what compile raises varies)
            expect(False, f"compiled {name} in grad mode: {type(e).__name__}: {e}")
            continue
        expect(out.requires_grad and
               (out.detach().float() - want.float()).abs().max().item() < 2e-3,
               f"compiled {name} in grad mode: recorded, the eager values")
        try:
            out.float().sum().backward()
        except Exception as e:  # noqa: BLE001
            expect("inference" in str(e), f"compiled {name}: backward raises: "
                   f"{str(e)[:200]}")
        else:
            expect(False, f"compiled {name}: backward ran")


def check_threads_share_plans():
    """Threads calling stof.attention with the same shapes share one cached
    plan: a padded batch (its formats built each call) and a decode shape
    (split-KV partial results) from four threads, each its own data, on one
    stream: every output equals its one-thread run (the plan's enqueue is
    one step under its lock)."""
    import threading
    dev = "cuda"
    torch.manual_seed(4)
    cases = []
    for i in range(4):
        q = torch.randn(2, 4, 256, 64, device=dev, dtype=torch.float16)
        k = torch.randn(2, 4, 256, 64, device=dev, dtype=torch.float16)
        v = torch.randn(2, 4, 256, 64, device=dev, dtype=torch.float16)
        lens = torch.tensor([64 + 40 * i, 256 - 30 * i], dtype=torch.int32,
                            device=dev)
        qd = torch.randn(1, 8, 1, 64, device=dev, dtype=torch.float16)
        kd = torch.randn(1, 8, 8192, 64, device=dev, dtype=torch.float16)
        vd = torch.randn(1, 8, 8192, 64, device=dev, dtype=torch.float16)
        cases.append(((q, k, v, lens), (qd, kd, vd)))
    with torch.no_grad():
        want = [(stof.attention(q, k, v, mask="causal", k_lens=lens),
                 stof.attention(qd, kd, vd)) for (q, k, v, lens), (qd, kd, vd)
                in cases]
    torch.cuda.synchronize()
    got = [[] for _ in cases]
    errors = []

    def work(i):
        (q, k, v, lens), (qd, kd, vd) = cases[i]
        try:
            with torch.no_grad():
                for _ in range(40):
                    got[i].append((stof.attention(q, k, v, mask="causal", k_lens=lens),
                                   stof.attention(qd, kd, vd)))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    torch.cuda.synchronize()
    expect(not errors, f"threads: no errors ({errors[:1]})")
    bad = sum(1 for i in range(len(cases)) for a, b in got[i]
              if not (torch.equal(a, want[i][0]) and torch.equal(b, want[i][1])))
    expect(bad == 0, f"threads sharing plans: {bad} of "
           f"{sum(len(g) for g in got)} call pairs differ from one thread's")


def check_streams():
    """One cached plan used from two streams in turn (a padded batch by its
    lengths: the formats are rebuilt each call; a decode shape that runs
    split-KV partial results): each output equals its one-stream run."""
    dev = "cuda"
    q, k, v = (torch.randn(2, 4, 1024, 64, device=dev, dtype=torch.float16)
               for _ in range(3))
    lens = [torch.tensor(x, dtype=torch.int32, device=dev)
            for x in ([1024, 300], [17, 1000])]
    refs = [stof.attention(q, k, v, mask="causal", k_lens=l).clone() for l in lens]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = []
    for i in range(20):
        with torch.cuda.stream(streams[i % 2]):
            outs.append((stof.attention(q, k, v, mask="causal", k_lens=lens[i % 2]),
                         refs[i % 2]))
    torch.cuda.synchronize()
    worst = max((o.float() - r.float()).abs().max().item() for o, r in outs)
    expect(worst == 0.0, f"one family plan from two streams in turn (worst "
                         f"difference {worst:.3g})")
    q1 = torch.randn(8, 8, 1, 128, device=dev, dtype=torch.float16)
    k1, v1 = (torch.randn(8, 8, 8192, 128, device=dev, dtype=torch.float16)
              for _ in range(2))
    ref = stof.attention(q1, k1, v1, mask="dense").clone()
    outs = []
    for i in range(10):
        with torch.cuda.stream(streams[i % 2]):
            outs.append(stof.attention(q1, k1, v1, mask="dense"))
    torch.cuda.synchronize()
    worst = max((o.float() - ref.float()).abs().max().item() for o in outs)
    expect(worst == 0.0, f"a decode plan from two streams in turn (worst "
                         f"difference {worst:.3g})")


if __name__ == "__main__":
    sys.exit(main())
