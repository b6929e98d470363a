"""A BERT-style layer over a mask family from Python, as a server uses it
(issue 12, the layer API with a per-call instance): planned once on
`dense` with the largest batch and length, then run batch after batch with
each batch's sequence lengths in int32 CUDA tensors, and as a graph stack
replayed after new lengths are written into the same tensors. Each valid
token's output is compared with the same layer in PyTorch (fp32, the key
padding mask of that batch). Nothing is planned again: the layer's
description does not change and the runs compile nothing.

Exit status 77 (skipped) without torch or a GPU."""
import math
import os
import tempfile

from gpu_test import require

require()
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import stof  # noqa: E402

B, S, HID, HEADS, FFN = 4, 192, 256, 4, 1024


def torch_layer(w, x, lens):
    """Post-norm BERT layer in fp32 with a key padding mask (B, S, HID)."""
    f = {k: v.float() for k, v in w.items()}
    x = x.float()
    qkv = x @ f["w_qkv"].T + f["b_qkv"]
    q, k, v = qkv.split(HID, dim=-1)
    hd = HID // HEADS

    def heads(t):
        return t.view(B, S, HEADS, hd).transpose(1, 2)
    pos = torch.arange(S, device=x.device)
    valid = pos[None, :] < lens[:, None]                  # (B, S)
    allowed = valid[:, None, None, :] & valid[:, None, :, None]
    s = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(hd)
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    a = (p @ heads(v)).transpose(1, 2).reshape(B, S, HID)
    h = F.layer_norm(x + a @ f["w_o"].T + f["b_o"], (HID,), f["norm1_gamma"],
                     f["norm1_beta"], 1e-5)
    u = F.gelu(h @ f["w_ffn1"].T + f["b_ffn1"])
    return F.layer_norm(h + u @ f["w_ffn2"].T + f["b_ffn2"], (HID,),
                        f["norm2_gamma"], f["norm2_beta"], 1e-5)


def check(y, ref, lens, what):
    worst = 0.0
    for b in range(B):
        n = int(lens[b])
        if n == 0:
            continue
        got, want = y[b, :n].float(), ref[b, :n]
        err = ((got - want).norm() / want.norm()).item()
        worst = max(worst, err)
        assert err < 2e-2, "%s: sequence %d (length %d): relative error %g" % (
            what, b, n, err)
    return worst


def main():
    torch.manual_seed(0)
    dt = torch.float16
    dev = torch.device("cuda")
    shapes = {"w_qkv": (3 * HID, HID), "b_qkv": (3 * HID,), "w_o": (HID, HID),
              "b_o": (HID,), "w_ffn1": (FFN, HID), "b_ffn1": (FFN,),
              "w_ffn2": (HID, FFN), "b_ffn2": (HID,)}
    w = {n: (torch.randn(s, device=dev) * (0.5 / math.sqrt(s[-1]) if len(s) == 2 else 0.1))
         .to(dt) for n, s in shapes.items()}
    for n in ("norm1", "norm2"):
        w[n + "_gamma"] = (1 + 0.1 * torch.randn(HID, device=dev)).to(dt)
        w[n + "_beta"] = (0.1 * torch.randn(HID, device=dev)).to(dt)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = stof.Context(user_db=os.path.join(tmp, "t.db"),
                           tuning_mode="cache-only")
        fam = ctx.mask_family("dense")
        layer = ctx.layer_plan(B, S, HID, HEADS, FFN, dt, "gelu_erf", "layer",
                               False, fam)
        assert layer.family
        desc0 = layer.describe()
        x = torch.randn(B, S, HID, device=dev, dtype=dt)
        y = torch.empty_like(x)
        lens = torch.empty(B, dtype=torch.int32, device=dev)
        worst = 0.0
        for it in range(3):
            lens.copy_(torch.randint(1, S + 1, (B,), dtype=torch.int32))
            layer.run(w, x, y, q_len=lens, k_len=lens)
            torch.cuda.synchronize()
            worst = max(worst, check(y, torch_layer(w, x, lens), lens,
                                     "run %d" % it))
        # A graph stack: recorded once, replayed with new lengths written
        # into the same tensor.
        for it in range(3):
            lens.copy_(torch.randint(1, S + 1, (B,), dtype=torch.int32))
            layer.stack_run([w], x, y, graph=True, q_len=lens, k_len=lens)
            torch.cuda.synchronize()
            worst = max(worst, check(y, torch_layer(w, x, lens), lens,
                                     "graph replay %d" % it))
        assert layer.describe() == desc0, "the layer changed"
        try:
            layer.run(w, x, y, q_len=lens.cpu())
            raise AssertionError("host lengths were accepted")
        except ValueError as e:
            assert "int32 CUDA tensor" in str(e), e
        print("family layer: worst relative error %.3g over 6 batches" % worst)
        layer.close()
        ctx.close()


if __name__ == "__main__":
    main()
