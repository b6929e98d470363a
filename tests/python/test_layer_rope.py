"""Rotary position embeddings (RoPE) in a layer from Python: a Llama-style
layer (no biases, pre-RMSNorm, grouped-query attention with 4 query heads
on 2 K/V heads, SwiGLU, a causal mask, rope_theta 10000) planned in fp16.

- Where transformers is installed, its own LlamaDecoderLayer in fp32 on the
  same weights, with real rotary embeddings from its LlamaRotaryEmbedding
  (position_ids 0..seq-1 in every sequence of the batch), is the reference:
  stof's fp16 output must be about as close to it as the same
  LlamaDecoderLayer run in fp16 is. The hand-written reference below is
  checked against it too.
- Partial rotary (GPT-NeoX: rope_dim = head_dim / 2, the first half of each
  head's channels rotate, the rest pass) against the hand-written
  reference of rotate-half in fp32.
- Scaled rope types (Llama 3.1's "llama3", "yarn" with its attention
  factor), where transformers is installed: stof.rope_args turns the
  LlamaConfig into the layer's own frequencies and scale, and stof's output
  is checked against LlamaDecoderLayer in fp32 with that configuration's
  rotary embedding, as above; the layer with the unscaled base must be far
  from it.
- Each comparison first checks that it can see the rotation: the layer
  without RoPE, or rotating the whole head, is far outside its tolerance.
- Bad RoPE arguments are refused, naming the argument.

Exit status 77 (skipped) without torch or a GPU; the transformers part is
skipped, saying so, without transformers."""
import math

from gpu_test import load_llama_layer, require

require()
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import stof  # noqa: E402

B, S, HID, HEADS, KV, FFN = 2, 256, 256, 4, 2, 512
HD = HID // HEADS
EPS = 1e-5
THETA = 10000.0
DEVICE = "cuda"
# Weights N(0, WSCALE): large enough that the attention scores spread over
# a few units, so that the softmax (and so the output) depends on how Q and
# K were rotated; small ones would give a nearly uniform attention that
# hides any rotation.
WSCALE = 0.08


def weights(gen, hd=HD):
    """The layer's weights (no biases, RMSNorm: no betas) in fp16, drawn in
    fp32 and rounded: the fp32 references take the same rounded values.
    Heads of hd (HEADS * hd Q columns: hidden's when hd is HD)."""
    def rnd(*shape, mean=0.0, scale=WSCALE):
        t = torch.randn(*shape, generator=gen, device=DEVICE) * scale + mean
        return t.to(torch.float16).contiguous()
    qn = HEADS * hd + 2 * KV * hd
    return {"w_qkv": rnd(qn, HID), "w_o": rnd(HID, HEADS * hd),
            "w_ffn1": rnd(2 * FFN, HID), "w_ffn2": rnd(HID, FFN),
            "norm1_gamma": rnd(HID, mean=1.0, scale=0.05),
            "norm2_gamma": rnd(HID, mean=1.0, scale=0.05)}


def rope_tables(rope_dim, device):
    """(cos, sin), each (S, rope_dim) in fp32: position p, column j has the
    angle p * THETA^(-2 i / rope_dim), i = j mod rope_dim / 2 (both halves
    of the rotated channels share the frequencies)."""
    inv_freq = 1.0 / (THETA ** (torch.arange(0, rope_dim, 2, dtype=torch.float32,
                                             device=device) / rope_dim))
    pos = torch.arange(S, dtype=torch.float32, device=device)
    ang = pos[:, None] * inv_freq[None, :]            # (S, rope_dim / 2)
    ang = torch.cat((ang, ang), dim=-1)               # (S, rope_dim)
    return ang.cos(), ang.sin()


def rotate(t, cos, sin, rope_dim):
    """Rotate-half RoPE on the first rope_dim channels of t (.., S, HD):
    channel i and i + rope_dim / 2 form a pair, (a, b) -> (a cos - b sin,
    b cos + a sin); the channels after rope_dim pass unchanged."""
    r, keep = t[..., :rope_dim], t[..., rope_dim:]
    a, b = r[..., :rope_dim // 2], r[..., rope_dim // 2:]
    half = torch.cat((-b, a), dim=-1)
    return torch.cat((r * cos + half * sin, keep), dim=-1)


def reference(w, x, rope_dim, dt=torch.float32):
    """The layer computed in dt (fp32: the reference; fp16: how close a plain
    fp16 computation gets): pre-RMSNorm (in fp32, as Llama's), the QKV
    projection, RoPE on the first rope_dim channels of each Q and K head
    (0: none), causal GQA attention (softmax in fp32), the output projection,
    the residual, RMSNorm, SwiGLU."""
    f = {k: v.to(dt) for k, v in w.items()}
    x = x.to(dt)

    def rms(u, g):
        u32 = u.float()
        u32 = u32 * torch.rsqrt(u32.pow(2).mean(-1, keepdim=True) + EPS)
        return g * u32.to(dt)
    qkv = rms(x, f["norm1_gamma"]) @ f["w_qkv"].T
    q, k, v = qkv.split([HID, KV * HD, KV * HD], dim=-1)
    q = q.view(B, S, HEADS, HD).transpose(1, 2)
    k = k.view(B, S, KV, HD).transpose(1, 2)
    v = v.view(B, S, KV, HD).transpose(1, 2)
    if rope_dim:
        cos, sin = rope_tables(rope_dim, x.device)
        cos, sin = cos.to(dt), sin.to(dt)
        q, k = rotate(q, cos, sin, rope_dim), rotate(k, cos, sin, rope_dim)
    k = k.repeat_interleave(HEADS // KV, 1)
    v = v.repeat_interleave(HEADS // KV, 1)
    s = (q @ k.transpose(-1, -2)).float() / math.sqrt(HD)
    causal = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
    p = torch.softmax(s.masked_fill(~causal, float("-inf")), -1).to(dt)
    a = (p @ v).transpose(1, 2).reshape(B, S, HID)
    h = x + a @ f["w_o"].T
    g, u = (rms(h, f["norm2_gamma"]) @ f["w_ffn1"].T).split(FFN, dim=-1)
    return h + (F.silu(g) * u) @ f["w_ffn2"].T


def hf_theta(config):
    """The RoPE base of a transformers config: config.rope_parameters'
    (transformers 5), else config.rope_theta (4.x)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(config.rope_theta)


def hf_config(scaling=None):
    """A LlamaConfig of the layer, base THETA, with the rope type `scaling`
    (a dict as in a model's config.json: rope_type and its parameters), or
    None without transformers."""
    try:
        import transformers
        from transformers import LlamaConfig
    except ImportError as e:
        print("skip (transformers part): transformers is not available (%s)" % e)
        return None
    kw = dict(hidden_size=HID, intermediate_size=FFN,
              num_attention_heads=HEADS, num_key_value_heads=KV,
              rms_norm_eps=EPS, hidden_act="silu", attention_bias=False,
              mlp_bias=False, max_position_embeddings=4 * S)
    if int(transformers.__version__.split(".")[0]) >= 5:
        kw["rope_parameters"] = dict(scaling or {"rope_type": "default"},
                                     rope_theta=THETA)
    else:
        kw.update(rope_theta=THETA, rope_scaling=scaling)
    cfg = LlamaConfig(**kw)
    cfg._attn_implementation = "eager"
    assert hf_theta(cfg) == THETA, "LlamaConfig's rope base: %g" % hf_theta(cfg)
    return cfg


def hf_outputs(w, x, cfg):
    """transformers' LlamaDecoderLayer (eager attention) of configuration
    cfg on the same weights with its own rotary embeddings: (fp32 output,
    fp16 output)."""
    from transformers.models.llama.modeling_llama import (
        LlamaDecoderLayer, LlamaRotaryEmbedding)
    layer = LlamaDecoderLayer(cfg, layer_idx=0).to(DEVICE).float().eval()
    # Kept in fp32 (inv_freq is a buffer: .half() would round it), as in a
    # model loaded in fp16; its cos and sin come out in the input's dtype.
    rotary = LlamaRotaryEmbedding(config=cfg).to(DEVICE)
    f = {k: v.float() for k, v in w.items()}
    with torch.no_grad():
        load_llama_layer(layer, f, HID, KV * HD, FFN)
    return run_causal(layer, rotary, x)


def run_causal(layer, rotary, x):
    """A loaded decoder layer on x with its rotary embedding, positions
    0..S-1 in every sequence and a causal mask: [fp32 output, fp16
    output] (the layer is left in fp16)."""
    # Position p of each sequence, as the models number a batch's tokens.
    pos = torch.arange(S, device=DEVICE).unsqueeze(0).expand(B, S)
    causal = torch.ones(S, S, dtype=torch.bool, device=DEVICE).tril()
    outs = []
    with torch.no_grad():
        for dt in (torch.float32, torch.float16):
            layer = layer.to(dt)
            xx = x.to(dt)
            # An additive mask: 0 where attended, the dtype's minimum
            # elsewhere, as transformers' mask builders make it.
            mask = torch.zeros(B, 1, S, S, device=DEVICE, dtype=dt).masked_fill(
                ~causal, torch.finfo(dt).min)
            out = layer(xx, attention_mask=mask, position_ids=pos,
                        position_embeddings=rotary(xx, pos))
            outs.append(out[0] if isinstance(out, tuple) else out)
    return outs


def check_qwen3(ctx, mask, w, x, gen, hd):
    try:
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import (
            Qwen3DecoderLayer, Qwen3RotaryEmbedding)
    except ImportError as e:
        print("skip (Qwen3 part): transformers has no Qwen3 (%s)" % e)
        return
    theta = 1e6
    cfg = Qwen3Config(hidden_size=HID, intermediate_size=FFN,
                      num_attention_heads=HEADS, num_key_value_heads=KV,
                      head_dim=hd, rms_norm_eps=EPS, hidden_act="silu",
                      attention_bias=False, max_position_embeddings=4 * S,
                      rope_theta=theta)
    cfg._attn_implementation = "eager"
    qn = (torch.randn(hd, generator=gen, device=DEVICE) * 0.3 + 1.0).to(torch.float16)
    kn = (torch.randn(hd, generator=gen, device=DEVICE) * 0.3 + 1.0).to(torch.float16)
    qd = HEADS * hd
    ww = dict(w)
    ww["w_qkv"] = stof.qkv_weight(w["w_qkv"][:qd], w["w_qkv"][qd:qd + KV * hd],
                                  w["w_qkv"][qd + KV * hd:], qn, kn)
    kw = stof.rope_args(cfg, S)
    assert kw == {"rope_dim": 0, "rope_theta": theta}, kw
    hkw = {"head_dim": hd} if qd != HID else {}
    L = ctx.layer_plan(B, S, HID, HEADS, FFN, torch.float16, "silu", "rms", True,
                       mask, eps=EPS, kv_heads=KV, bias=False, gated=True,
                       qk_norm=True, **kw, **hkw)
    d = L.describe()
    assert L.qk_norm and d["desc"]["qk_norm"] is True, d["desc"]
    assert L.head_dim == hd and d["desc"]["head_dim"] == hd, d["desc"]
    assert any(k.get("qk_norm") == "kernel" for k in d["kernels"]), d["kernels"]
    y = torch.full_like(x, float("nan"))
    L.run(ww, x, y)
    torch.cuda.synchronize()
    L.close()
    L0 = ctx.layer_plan(B, S, HID, HEADS, FFN, torch.float16, "silu", "rms", True,
                        mask, eps=EPS, kv_heads=KV, bias=False, gated=True, **kw,
                        **hkw)
    y0 = torch.full_like(x, float("nan"))
    L0.run(w, x, y0)
    torch.cuda.synchronize()
    L0.close()
    layer = Qwen3DecoderLayer(cfg, layer_idx=0).to(DEVICE).float().eval()
    rotary = Qwen3RotaryEmbedding(config=cfg).to(DEVICE)
    f = {k: v.float() for k, v in w.items()}
    with torch.no_grad():
        load_llama_layer(layer, f, qd, KV * hd, FFN)
        layer.self_attn.q_norm.weight.copy_(qn.float())
        layer.self_attn.k_norm.weight.copy_(kn.float())
    hf32, hf16 = run_causal(layer, rotary, x)
    e, e16, e0 = rel(y, hf32), rel(hf16, hf32), rel(y0, hf32)
    limit = max(5 * e16, 5e-3)
    print("qk_norm, heads of %d (%d columns over %d): stof fp16 vs "
          "Qwen3DecoderLayer fp32 %.3g (Qwen3DecoderLayer fp16: %.3g; stof "
          "without the QK norm: %.3g)" % (hd, qd, HID, e, e16, e0))
    assert e0 > 10 * limit, "the check cannot see the QK norm: %g" % e0
    assert e < limit, e


def rel(a, b):
    """|a - b| / |b| (Frobenius), inf where a has a NaN or an infinity."""
    a, b = a.float(), b.float()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).norm() / b.norm()).item()


def run_layer(ctx, mask, w, x, rope_dim):
    """Plan the layer with RoPE (rope_dim 0: the whole head), check what it
    says of itself, run it once on an output poisoned with NaN: (the layer,
    its output)."""
    L = ctx.layer_plan(B, S, HID, HEADS, FFN, torch.float16, "silu", "rms",
                       True, mask, eps=EPS, kv_heads=KV, bias=False, gated=True,
                       rope_theta=THETA, rope_dim=rope_dim)
    dim = rope_dim or HD
    assert L.rope_theta == THETA and L.rope_dim == dim, (L.rope_theta, L.rope_dim)
    desc = L.describe()
    assert desc["desc"]["rope"] == {"theta": THETA, "dim": dim, "scale": 1.0,
                                    "freq": "theta"}, desc["desc"]["rope"]
    print("rope_dim %d: plan %s" % (dim, desc["kernels"]))
    y = torch.full_like(x, float("nan"))
    L.run(w, x, y)
    torch.cuda.synchronize()
    return L, y


def expect_error(fn, kind, *words):
    try:
        fn()
    except kind as e:
        msg = str(e)
        for word in words:
            assert word in msg, "%r not in the message: %s" % (word, msg)
        print("refused: %s" % msg)
        return
    raise AssertionError("no %s raised" % kind.__name__)


def main():
    ctx = stof.Context()
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(11)
    mask = ctx.mask("causal", S, S)
    x = torch.randn(B, S, HID, generator=gen, device=DEVICE).to(torch.float16)
    w = weights(gen)

    # The whole head rotates (Llama).
    L, y = run_layer(ctx, mask, w, x, 0)
    y_full = y
    ref = reference(w, x, HD)
    e_ref16 = rel(reference(w, x, HD, torch.float16), ref)
    e_norope = rel(reference(w, x, 0), ref)
    e = rel(y, ref)
    print("full RoPE: stof fp16 vs fp32 reference %.3g (the reference in fp16: "
          "%.3g; without RoPE: %.3g)" % (e, e_ref16, e_norope))
    limit = max(5 * e_ref16, 5e-3)
    assert e_norope > 10 * limit, "the check cannot see RoPE: %g" % e_norope
    assert e < limit, e
    cfg = hf_config()
    if cfg is not None:
        hf32, hf16 = hf_outputs(w, x, cfg)
        e_hf, e_hf16, e_refhf = rel(y, hf32), rel(hf16, hf32), rel(ref, hf32)
        print("full RoPE: stof fp16 vs LlamaDecoderLayer fp32 %.3g "
              "(LlamaDecoderLayer fp16: %.3g; the fp32 reference: %.3g)"
              % (e_hf, e_hf16, e_refhf))
        assert e_refhf < 1e-4, "the references disagree: %g" % e_refhf
        assert e_hf < max(5 * e_hf16, 5e-3), e_hf

    # Two layers as a stack (one CUDA graph; a pre-norm stack may fold the
    # second layer's input norm into the first's last GEMM): each rotates
    # its own Q and K from position 0.
    y2 = torch.full_like(x, float("nan"))
    L.stack_run([w, w], x, y2)
    torch.cuda.synchronize()
    L.close()
    ref2 = reference(w, ref, HD)
    e_ref16 = rel(reference(w, reference(w, x, HD, torch.float16), HD,
                            torch.float16), ref2)
    e = rel(y2, ref2)
    print("full RoPE, a stack of 2: stof fp16 vs fp32 reference %.3g (the "
          "reference in fp16: %.3g)" % (e, e_ref16))
    assert e < max(5 * e_ref16, 5e-3), e

    # Partial rotary: the first half of each head's channels.
    rd = HD // 2
    L, y = run_layer(ctx, mask, w, x, rd)
    L.close()
    ref = reference(w, x, rd)
    e_ref16 = rel(reference(w, x, rd, torch.float16), ref)
    e_full = rel(reference(w, x, HD), ref)
    e = rel(y, ref)
    print("rope_dim %d: stof fp16 vs fp32 reference %.3g (the reference in "
          "fp16: %.3g; rotating the whole head: %.3g)" % (rd, e, e_ref16, e_full))
    limit = max(5 * e_ref16, 5e-3)
    assert e_full > 10 * limit, "the check cannot tell rope_dim: %g" % e_full
    assert e < limit, e

    # Scaled rope types from a LlamaConfig through stof.rope_args: llama3
    # (wavelengths above 32 positions divided by 8, those between 8 and 32
    # blended), yarn (factor 4 over S positions: its attention factor
    # 0.1 ln 4 + 1 scales cos and sin). The unscaled layer's output (y_full)
    # must be far from each.
    for scaling in ({"rope_type": "llama3", "factor": 8.0,
                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 32},
                    {"rope_type": "yarn", "factor": 4.0,
                     "original_max_position_embeddings": S}):
        cfg = hf_config(scaling)
        if cfg is None:
            break
        kw = stof.rope_args(cfg, S)
        assert "rope_freq" in kw and "rope_theta" not in kw, kw
        assert len(kw["rope_freq"]) == HD // 2, kw
        name = scaling["rope_type"]
        print("%s: rope_scale %.6g, frequencies %s..." % (
            name, kw["rope_scale"], ["%.4g" % f for f in kw["rope_freq"][:4]]))
        Ls = ctx.layer_plan(B, S, HID, HEADS, FFN, torch.float16, "silu", "rms",
                            True, mask, eps=EPS, kv_heads=KV, bias=False,
                            gated=True, **kw)
        r = Ls.describe()["desc"]["rope"]
        assert (r["theta"] is None and r["dim"] == HD and r["freq"] == "table"
                and abs(r["scale"] - (kw["rope_scale"] or 1.0)) < 1e-6), r
        assert abs(Ls.rope_scale - (kw["rope_scale"] or 1.0)) < 1e-6
        assert Ls.rope_freq is not None and len(Ls.rope_freq) == HD // 2
        ys = torch.full_like(x, float("nan"))
        Ls.run(w, x, ys)
        torch.cuda.synchronize()
        Ls.close()
        hf32, hf16 = hf_outputs(w, x, cfg)
        e, e_hf16, e_plain = rel(ys, hf32), rel(hf16, hf32), rel(y_full, hf32)
        limit = max(5 * e_hf16, 5e-3)
        print("%s: stof fp16 vs LlamaDecoderLayer fp32 %.3g (LlamaDecoderLayer "
              "fp16: %.3g; stof unscaled: %.3g)" % (name, e, e_hf16, e_plain))
        assert e_plain > 10 * limit, "the check cannot see %s: %g" % (name, e_plain)
        assert e < limit, e

    # A QK norm (Qwen3): transformers' Qwen3DecoderLayer on the same weights
    # with its own q_norm and k_norm (weights near 1) and rotary embedding
    # (theta 1e6), in fp32, the reference; stof's layer planned with
    # qk_norm=True and w_qkv from stof.qkv_weight. The layer without the
    # norm must be far from it.
    check_qwen3(ctx, mask, w, x, gen, HD)
    # Qwen3 0.6B's shape: heads wider than hidden (4 heads of 128 over 256:
    # layer_plan(head_dim=128), w_o (256, 512))
    check_qwen3(ctx, mask, weights(gen, 2 * HD), x, gen, 2 * HD)

    # rope_args for the sequence-dependent types gives what the model's own
    # rotary embedding uses after a forward at that length, bit for bit:
    # dynamic (beyond max_position_embeddings: a scaled base) and longrope
    # (its long factors beyond the original length, else its short ones).
    for scaling in ({"rope_type": "dynamic", "factor": 2.0},
                    {"rope_type": "longrope", "original_max_position_embeddings": S // 2,
                     "long_factor": [1.0 + 0.1 * i for i in range(HD // 2)],
                     "short_factor": [1.0] * (HD // 2)}):
        cfg = hf_config(scaling)
        if cfg is None:
            break
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        for seq in (S // 4, 8 * S):
            kw = stof.rope_args(cfg, seq)
            rotary = LlamaRotaryEmbedding(config=cfg)
            rotary(torch.zeros(1, seq, HD), torch.arange(seq)[None])
            assert torch.equal(torch.tensor(kw["rope_freq"]), rotary.inv_freq.float()), \
                (scaling["rope_type"], seq)
            assert kw["rope_scale"] == rotary.attention_scaling, (kw, rotary.attention_scaling)
        print("%s: rope_args matches the model's rotary embedding" % scaling["rope_type"])

    # Bad arguments are refused before anything is planned, naming them.
    def plan(**kw):
        return ctx.layer_plan(B, S, HID, HEADS, FFN, torch.float16, "silu",
                              "rms", True, mask, eps=EPS, kv_heads=KV,
                              bias=False, gated=True, **kw)
    expect_error(lambda: plan(rope_theta=-1.0), stof.StofError, "rope_theta", "-1")
    expect_error(lambda: plan(rope_theta=1.0), stof.StofError, "rope_theta")
    expect_error(lambda: plan(rope_theta=float("nan")), stof.StofError, "rope_theta")
    expect_error(lambda: plan(rope_theta=float("inf")), stof.StofError, "rope_theta")
    expect_error(lambda: plan(rope_theta=THETA, rope_dim=22), stof.StofError,
                 "rope_dim", "22")
    expect_error(lambda: plan(rope_theta=THETA, rope_dim=HD + 16), stof.StofError,
                 "rope_dim", str(HD + 16))
    expect_error(lambda: plan(rope_theta=THETA, rope_dim=-16), stof.StofError,
                 "rope_dim")
    expect_error(lambda: plan(rope_dim=16), stof.StofError, "rope_dim",
                 "rope_theta")
    expect_error(lambda: plan(rope_freq=[0.1] * (HD // 2), rope_theta=THETA),
                 stof.StofError, "rope_theta", "rope_freq")
    expect_error(lambda: plan(rope_freq=[0.1] * (HD // 2 - 1)), ValueError,
                 "rope_freq")
    expect_error(lambda: plan(rope_freq=[float("inf")] * (HD // 2)),
                 stof.StofError, "rope_freq[0]")
    expect_error(lambda: plan(rope_theta=THETA, rope_scale=float("nan")),
                 stof.StofError, "rope_scale")
    expect_error(lambda: plan(rope_theta="10000"), TypeError, "rope_theta")
    expect_error(lambda: plan(rope_theta=1e39), ValueError, "rope_theta")
    expect_error(lambda: plan(rope_theta=THETA, rope_dim=16.0), TypeError, "rope_dim")
    expect_error(lambda: plan(rope_theta=THETA, rope_dim=2 ** 32 + 16), ValueError,
                 "rope_dim")
    print("ok")


if __name__ == "__main__":
    main()
