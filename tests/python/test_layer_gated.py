"""A Llama-style layer from Python (issue 14: layers for current models):
no biases, pre-RMSNorm, grouped-query attention (4 query heads on 2 K/V
heads), a gated FFN (SwiGLU: w_ffn1 stacks gate_proj and up_proj), a
causal mask, bf16. stof's output is compared with the same layer in
PyTorch (fp32) and, where transformers is installed, with its own
LlamaDecoderLayer run in fp32 on the same weights with the rotary
embedding made the identity (cos 1, sin 0: this layer is planned without
RoPE; test_layer_rope.py checks the rotary embedding). Wrong shapes of the gated weights are refused by name. The
same layer with GeGLU (tanh GELU) and biases is checked against PyTorch.

Exit status 77 (skipped) without torch or a GPU."""
import math

from gpu_test import load_llama_layer, require

require()
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import stof  # noqa: E402

B, S, HID, HEADS, KV, FFN = 2, 256, 256, 4, 2, 512
HD = HID // HEADS
EPS = 1e-5


def weights(gen, bias):
    def rnd(*shape, mean=0.0, scale=0.05):
        t = torch.randn(*shape, generator=gen, device="cuda") * scale + mean
        return t.to(torch.bfloat16).contiguous()
    qn = HID + 2 * KV * HD
    w = {"w_qkv": rnd(qn, HID), "w_o": rnd(HID, HID),
         "w_ffn1": rnd(2 * FFN, HID), "w_ffn2": rnd(HID, FFN),
         "norm1_gamma": rnd(HID, mean=1.0), "norm2_gamma": rnd(HID, mean=1.0)}
    if bias:
        w.update({"b_qkv": rnd(qn), "b_o": rnd(HID), "b_ffn1": rnd(2 * FFN),
                  "b_ffn2": rnd(HID)})
    return w


def torch_layer(w, x, act):
    """The same layer in fp32: pre-RMSNorm, GQA causal attention, gated
    FFN act(gate) * up."""
    f = {k: v.float() for k, v in w.items()}
    x = x.float()

    def lin(u, name):
        b = f.get("b_" + name[2:])
        return u @ f[name].T + (b if b is not None else 0)

    def rms(u, g):
        return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + EPS) * g
    qkv = lin(rms(x, f["norm1_gamma"]), "w_qkv")
    q, k, v = qkv.split([HID, KV * HD, KV * HD], dim=-1)
    q = q.view(B, S, HEADS, HD).transpose(1, 2)
    k = k.view(B, S, KV, HD).transpose(1, 2).repeat_interleave(HEADS // KV, 1)
    v = v.view(B, S, KV, HD).transpose(1, 2).repeat_interleave(HEADS // KV, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(HD)
    causal = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
    p = torch.softmax(s.masked_fill(~causal, float("-inf")), -1)
    a = (p @ v).transpose(1, 2).reshape(B, S, HID)
    h = x + lin(a, "w_o")
    g, u = lin(rms(h, f["norm2_gamma"]), "w_ffn1").split(FFN, dim=-1)
    t = F.silu(g) if act == "silu" else F.gelu(g, approximate="tanh")
    return h + lin(t * u, "w_ffn2")


def hf_layer_output(w, x):
    """transformers' LlamaDecoderLayer (fp32, eager attention) on the same
    weights with the identity rotary embedding, or None without
    transformers."""
    try:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    except ImportError as e:
        print("transformers not available (%s): PyTorch reference only" % e)
        return None
    cfg = LlamaConfig(hidden_size=HID, intermediate_size=FFN,
                      num_attention_heads=HEADS, num_key_value_heads=KV,
                      rms_norm_eps=EPS, hidden_act="silu",
                      attention_bias=False, mlp_bias=False)
    cfg._attn_implementation = "eager"
    layer = LlamaDecoderLayer(cfg, layer_idx=0).cuda().float().eval()
    f = {k: v.float() for k, v in w.items()}
    qn, kn = HID, KV * HD
    with torch.no_grad():
        load_llama_layer(layer, f, qn, kn, FFN)
        cos = torch.ones(B, S, HD, device="cuda")
        sin = torch.zeros(B, S, HD, device="cuda")
        causal = torch.ones(S, S, dtype=torch.bool, device="cuda").tril()
        mask = torch.zeros(B, 1, S, S, device="cuda").masked_fill(
            ~causal, float("-inf"))
        out = layer(x.float(), attention_mask=mask,
                    position_embeddings=(cos, sin))
    return out[0] if isinstance(out, tuple) else out


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    ctx = stof.Context()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(5)
    mask = ctx.mask("causal", S, S)
    x = torch.randn(B, S, HID, generator=gen, device="cuda").to(torch.bfloat16)

    # SwiGLU, Llama-style.
    w = weights(gen, bias=False)
    L = ctx.layer_plan(B, S, HID, HEADS, FFN, torch.bfloat16, "silu", "rms",
                       True, mask, eps=EPS, kv_heads=KV, bias=False, gated=True)
    assert L.gated and L.describe()["desc"]["gated"]
    print("plan:", L.describe()["kernels"])
    y = torch.empty_like(x)
    L.run(w, x, y)
    torch.cuda.synchronize()
    ref = torch_layer(w, x, "silu")
    e = rel(y, ref)
    print("SwiGLU: stof vs PyTorch fp32: %.3g" % e)
    assert e < 2e-2, e
    hf = hf_layer_output(w, x)
    if hf is not None:
        e_hf, e_ref = rel(y, hf), rel(ref, hf)
        print("SwiGLU: stof vs LlamaDecoderLayer fp32: %.3g (PyTorch fp32 "
              "vs it: %.3g)" % (e_hf, e_ref))
        assert e_ref < 1e-4, "the references disagree: %g" % e_ref
        assert e_hf < 2e-2, e_hf

    # The gated weights' shapes are checked by name.
    bad = dict(w)
    bad["w_ffn1"] = w["w_ffn1"][:FFN].contiguous()
    try:
        L.run(bad, x, y)
    except ValueError as err:
        assert "w_ffn1" in str(err) and str(2 * FFN) in str(err), err
    else:
        raise AssertionError("a w_ffn1 of ffn rows was accepted")
    L.close()

    # GeGLU (tanh) with biases.
    w = weights(gen, bias=True)
    L = ctx.layer_plan(B, S, HID, HEADS, FFN, torch.bfloat16, "gelu_tanh",
                       "rms", True, mask, eps=EPS, kv_heads=KV, bias=True,
                       gated=True)
    L.run(w, x, y)
    torch.cuda.synchronize()
    e = rel(y, torch_layer(w, x, "gelu_tanh"))
    print("GeGLU with biases: stof vs PyTorch fp32: %.3g" % e)
    assert e < 2e-2, e
    L.close()
    print("ok")


if __name__ == "__main__":
    main()
