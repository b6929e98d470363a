"""Layer.stack_run from Python: a stack of four small layers (post-norm,
erf GELU, a causal mask, fp16) against the same layers run one by one;
the fast path of weights that are the very tensors of a recent call (not
checked again, only their addresses, whatever x and y are), which still
reads weights changed in place, checks a dict whose tensor was replaced,
and checks again a weight given new storage in place (a wrong shape there
is refused by name). The host time a stack call takes is printed.

Exit status 77 (skipped) without torch or a GPU."""
import time

from gpu_test import require

require()
import torch  # noqa: E402
import stof  # noqa: E402

B, S, HID, HEADS, FFN, N_LAYERS = 2, 128, 128, 2, 256, 4


def layer_weights(gen):
    def rnd(*shape, mean=0.0, scale=0.05):
        t = torch.randn(*shape, generator=gen, device="cuda") * scale + mean
        return t.to(torch.float16).contiguous()
    return {"w_qkv": rnd(3 * HID, HID), "b_qkv": rnd(3 * HID),
            "w_o": rnd(HID, HID), "b_o": rnd(HID),
            "w_ffn1": rnd(FFN, HID), "b_ffn1": rnd(FFN),
            "w_ffn2": rnd(HID, FFN), "b_ffn2": rnd(HID),
            "norm1_gamma": rnd(HID, mean=1.0), "norm1_beta": rnd(HID),
            "norm2_gamma": rnd(HID, mean=1.0), "norm2_beta": rnd(HID)}


def one_by_one(L, ws, x):
    """The stack as run() layer by layer (post-norm: the same rounding)."""
    a, b = x.clone(), torch.empty_like(x)
    for w in ws:
        L.run(w, a, b)
        a, b = b, a
    torch.cuda.synchronize()
    return a


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    ctx = stof.Context()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(11)
    mask = ctx.mask("causal", S, S)
    L = ctx.layer_plan(B, S, HID, HEADS, FFN, torch.float16, "gelu_erf",
                       "layer", False, mask)
    ws = [layer_weights(gen) for _ in range(N_LAYERS)]
    x = torch.randn(B, S, HID, generator=gen, device="cuda").to(torch.float16)
    y = torch.empty_like(x)

    # Count the weight checks (Layer._weights: one a layer on a full call).
    checks = [0]
    full = L._weights

    def counting(w, device):
        checks[0] += 1
        return full(w, device)
    L._weights = counting

    def stack(expect_checks, what):
        before = checks[0]
        y.fill_(float("nan"))
        L.stack_run(ws, x, y, graph=True)
        torch.cuda.synchronize()
        assert checks[0] - before == expect_checks, \
            "%s: %d weight checks, expected %d" % (what, checks[0] - before,
                                                   expect_checks)
        e = rel(y, one_by_one(L, ws, x))
        print("%s: stack vs one by one: %.3g" % (what, e))
        assert e < 1e-3, (what, e)

    stack(N_LAYERS, "first call")
    stack(0, "the same tensors again")
    # New dicts holding the same tensors: still the fast path.
    ws = [dict(w) for w in ws]
    stack(0, "new dicts of the same tensors")
    # Values changed in place: read as they are now, nothing checked.
    ws[0]["b_o"].add_(0.5)
    ws[3]["norm2_gamma"].mul_(1.5)
    stack(0, "weights changed in place")
    # A tensor replaced in a dict: checked again.
    ws[1]["w_o"] = layer_weights(gen)["w_o"]
    stack(N_LAYERS, "a weight replaced")
    stack(0, "that call again")
    # A weight given new storage in place: checked again (here of the
    # wrong shape: refused by name).
    ws[2]["w_ffn1"].set_(torch.zeros(FFN + 8, HID, device="cuda",
                                     dtype=torch.float16))
    try:
        L.stack_run(ws, x, y, graph=True)
    except ValueError as err:
        assert "w_ffn1" in str(err), err
        print("new storage of the wrong shape refused:", err)
    else:
        raise AssertionError("a weight with new storage was not checked")
    # Right-shaped storage again: checked (the refused call forgot them).
    ws[2]["w_ffn1"].set_(layer_weights(gen)["w_ffn1"])
    stack(N_LAYERS, "new storage of the right shape")
    # A new output tensor each call, as a server allocates: the weights are
    # not checked again.
    for i in range(3):
        y = torch.empty_like(x)
        stack(0, "a new y (%d)" % i)

    # Host time a call (graph replays, the GPU catching up at the end).
    L._weights = full
    for fast in (True, False):
        n = 200
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            if not fast:
                L._checked.clear()  # every call checks its weights again
            L.stack_run(ws, x, y, graph=True)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        print("%s: %.1f us a stack_run call on the host (%d layers)"
              % ("fast path" if fast else "full checks",
                 (t1 - t0) / n * 1e6, N_LAYERS))
    L.close()
    print("ok")


if __name__ == "__main__":
    main()
