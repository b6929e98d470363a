#!/usr/bin/env python3
"""End to end: stacks of stof Transformer layers against PyTorch, same inputs.

Models (fp16, random weights, seeded): BERT-base and BERT-large (post-norm),
GPT-2 and ViT-base (pre-norm), LayerNorm eps 1e-5, tanh-GELU (--act erf for
BERT's exact GELU); with --models ...,llama also a Llama-style stack in the
TinyLlama-1.1B shape (22 layers, hidden 2048, 32 heads of which 4 K/V heads,
FFN 5632 SwiGLU, pre-norm RMSNorm eps 1e-5, no biases, rotary position
embeddings on Q and K with rope_theta 10000, positions 0..seq-1 in every
sequence), and with --models ...,qwen3 a Qwen3-style stack in the
Qwen3-1.7B shape (28 layers, hidden 2048, 16 heads of head_dim 128 of which
8 K/V heads, FFN 6144 SwiGLU, pre-norm RMSNorm eps 1e-6, no biases, RoPE
with rope_theta 1e6, and a QK norm: Q and K RMS-normalised per head, with a
weight of head_dim for Q's heads and one for K's, before RoPE, as
Qwen3Attention's q_norm and k_norm). The bigbird mask bigbird:64:3:2:3:1
built by stof, at (batch, seq) = (1,128), (8,512), (16,2048)
(../shared/BENCH.md, "End-to-end peer figures"). For each model and size,
these stacks over the same weights and the same input:

  eager    PyTorch, F.linear / F.layer_norm or F.rms_norm / F.gelu or F.silu,
           attention by F.scaled_dot_product_attention with stof's mask as a
           dense bool tensor (grouped-query K/V heads repeated to the query
           heads); llama's rotary embedding as Hugging Face's LlamaModel does
           it: cos and sin computed once a forward of the stack (fp32
           angles, then the dtype) and given to every layer, which rotates Q
           and K (rotate-half) in the dtype (qwen3: after normalising each
           head of Q and K as Qwen3RMSNorm does: fp32 math, rounded to the
           dtype, times the weight in the dtype); also captured in a CUDA
           graph and replayed ("graph", not bound by the host:
           --no-eager-graph skips it);
  compile  the same layer under torch.compile(dynamic=False), attention by
           flex_attention (enable_gqa for grouped-query) with a BlockMask
           whose mask_mod looks that dense tensor up; compiled once a layer
           and as the whole stack in one function (--compile-scope), in
           each --compile-mode: the fastest of these is the peer (a stack
           compiled whole issues far fewer launches: at 8x512 the layer-wise
           stacks are bound by the host); llama's cos and sin are computed
           once a stack, compiled with it (or on their own, layer-wise);
  hf-eager with --hf: Hugging Face transformers' own layer classes (BertLayer,
  hf-sdpa  GPT2Block, ViTLayer, LlamaDecoderLayer, Qwen3DecoderLayer) built
           from a config, loaded with the same weights, under
           config._attn_implementation "eager" and "sdpa", given the mask
           as an additive [1, 1, S, S] float mask (0 where attended, the
           dtype's minimum elsewhere). The Llama layers get real rotary
           embeddings as LlamaModel gives them: its LlamaRotaryEmbedding
           (rope_theta from the config, 10000, its inverse frequencies kept
           in fp32) makes cos and sin once a forward of the stack from
           position_ids 0..seq-1, timed with it, and every layer takes them
           (position_embeddings); the Qwen3 layers likewise from
           Qwen3RotaryEmbedding (1e6), with their q_norm and k_norm loaded
           too;
  stof     Context.layer_plan once (cold plan seconds reported; llama with
           rope_theta 10000: the library rotates Q and K itself, in the QKV
           projection's epilogue or a kernel after it; qwen3 with
           qk_norm=True: its w_qkv is then stof.qkv_weight's flat buffer,
           the projections' rows followed by q_norm's and k_norm's
           weights), then Layer.stack_run(graph=True): the whole stack as
           one CUDA graph.

stof's output is checked against eager (and all of them against an fp32 run
of the eager stack) before timing; rel err = |out - ref| / |ref| (Frobenius).
"x best" is the fastest peer's time over stof's, "x list" the same without
the eager stack in a CUDA graph (the peers the Hopper-GEMM issue's targets
name: eager, SDPA, torch.compile, Hugging Face). Timing: CUDA events around
the whole stack, warm-ups first, median of --reps; the SM clock NVML reads
meanwhile is reported per system (back to back, a stack that keeps the GPU at
its power limit runs at a lower clock). --energy SECONDS also runs each stack
back to back for that long and reports its sustained time, the board's energy
a stack (NVML's counter) and the mean power: at 16x2048 every system runs at
the power limit, where time follows energy. Each stack's floor is measured in
the same run (--no-floor skips it): the layer's GEMM FLOPs at the best rate
cuBLAS reaches on its GEMM shapes (at 32768 tokens), the attention's FLOPs
times the mask's density at the rate of SDPA's dense kernel (16 x 2048), two
norms a layer at the bandwidth of a device copy; stof's time is reported
against it. --bound estimates a second bound: the stack's GEMMs alone
through cuBLAS (plain, chained, one CUDA graph) plus stof's own attention
kernels (their time in its stack, from torch.profiler; the two are timed
apart, each at the clock its own run leaves): the best peer over it is about
the highest ratio a stack with GEMMs at cuBLAS's speed could reach with every
other op free. Where the plan launches its kernels programmatically (at most
2048 tokens by default; the plan's "pdl"), the attention kernel starts while
the GEMM before it ends and its profiled span includes that wait: the bound
is then too high (x bound too low) by up to that overlap.

    PYTHONPATH=python python3 bench/bench_layers.py [--models bert-base,gpt2,llama,qwen3]
        [--sizes 1x128,8x512] [--no-compile] [--hf] [--peers-only] [--json FILE]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback

import torch
import torch._dynamo
import torch.nn.functional as F

import stof

MODELS = {
    # layers, hidden, heads, ffn, pre_norm; and where a model differs from
    # the BERT/GPT-2 kind: kv_heads (grouped-query attention, default heads),
    # norm ("layer" or "rms"), gated (gated FFN), bias (projection biases),
    # act (its own activation, else the GELU of --act), eps (its own norm
    # eps, else --eps), rope_theta (rotary position embeddings on Q and K
    # with this base; default none), qk_norm (Q and K RMS-normalised per
    # head before RoPE, Qwen3's q_norm and k_norm; default no); hf: the
    # family of its Hugging Face peer (--hf)
    "bert-base": dict(layers=12, hidden=768, heads=12, ffn=3072, pre_norm=False,
                      hf="bert"),
    "bert-large": dict(layers=24, hidden=1024, heads=16, ffn=4096, pre_norm=False,
                       hf="bert"),
    "gpt2": dict(layers=12, hidden=768, heads=12, ffn=3072, pre_norm=True, hf="gpt2"),
    "vit-base": dict(layers=12, hidden=768, heads=12, ffn=3072, pre_norm=True,
                     hf="vit"),
    # TinyLlama-1.1B: SwiGLU FFN, RMSNorm, 4 K/V heads, no biases, RoPE
    # (its config's rope_theta: 10000, LlamaConfig's default)
    "llama": dict(layers=22, hidden=2048, heads=32, ffn=5632, pre_norm=True,
                  kv_heads=4, norm="rms", gated=True, bias=False, act="silu",
                  eps=1e-5, rope_theta=10000.0, hf="llama"),
    # Qwen3-1.7B: as llama, with a QK norm (per-head RMSNorm of Q and K
    # before RoPE), 8 K/V heads, RMSNorm eps 1e-6 and rope_theta 1e6 (its
    # config's); head_dim 128 = hidden / heads (this script's peers build
    # their layers with hidden / heads; stof takes other head_dims too)
    "qwen3": dict(layers=28, hidden=2048, heads=16, ffn=6144, pre_norm=True,
                  kv_heads=8, norm="rms", gated=True, bias=False, act="silu",
                  eps=1e-6, rope_theta=1000000.0, qk_norm=True, hf="qwen3"),
}
# The models run when --models is not given: the ones from before llama
# (and qwen3) was added, so that old command lines measure the same thing.
DEFAULT_MODELS = "bert-base,bert-large,gpt2,vit-base"
SIZES = "1x128,8x512,16x2048"
MASK_SPEC = "bigbird:64:3:2:3:1"
FAIL_REL_ERR = 2e-2
PEER_TIMES = ("eager_ms", "eager_graph_ms", "compile_ms", "hf_eager_ms",
              "hf_sdpa_ms")
# The peers the Hopper-GEMM issue's targets name (eager, SDPA, torch.compile,
# Hugging Face's own layers): all of the above but the eager stack replayed
# as a CUDA graph, a stronger peer this script adds ("x list").
ISSUE_PEER_TIMES = tuple(k for k in PEER_TIMES if k != "eager_graph_ms")
# Each peer's output check against the eager stack (the eager stack is the
# reference itself): a peer whose output fails it does other work, and its
# time is left out of every ratio ("peers_excluded").
PEER_ERRS = {"eager_graph_ms": "eager_graph_err", "compile_ms": "compile_err",
             "hf_eager_ms": "hf_eager_err", "hf_sdpa_ms": "hf_sdpa_err"}
# The QK norm's weights in make_weights' dicts (the peers' names, none of
# stof's LAYER_WEIGHT_NAMES): stof takes them inside w_qkv (stof_weights)
QK_NORM_NAMES = ("q_norm", "k_norm")


class Cfg:
    def __init__(self, name, batch, seq, act, eps):
        m = MODELS[name]
        self.name = name
        self.layers, self.hidden = m["layers"], m["hidden"]
        self.heads, self.ffn, self.pre_norm = m["heads"], m["ffn"], m["pre_norm"]
        self.kv_heads = m.get("kv_heads", self.heads)
        self.norm = m.get("norm", "layer")      # "layer" or "rms"
        self.gated = m.get("gated", False)
        self.bias = m.get("bias", True)
        self.rope_theta = m.get("rope_theta", 0.0)  # 0: no rotary embedding
        self.qk_norm = m.get("qk_norm", False)    # per-head RMSNorm of Q, K
        self.hf = m.get("hf")
        self.batch, self.seq = batch, seq
        self.head_dim = self.hidden // self.heads
        # stof's name of the activation: the model's own (llama: "silu"),
        # else the GELU that --act picks ("tanh" or "erf")
        self.act = m.get("act") or ("gelu_tanh" if act == "tanh" else "gelu_erf")
        self.eps = m.get("eps", eps)


def make_weights(cfg, dtype, seed):
    """cfg.layers dicts of contiguous CUDA tensors, named like
    stof_layer_weights: weights N(0, 0.02), biases and betas N(0, 0.02),
    gammas 1 + N(0, 0.02). w_qkv has hidden + 2 kv_heads head_dim rows (Q's,
    then K's, then V's); a gated FFN's w_ffn1 has 2 ffn rows (gate, then up).
    Without biases the b_* keys are left out, with RMSNorm the *_beta keys.
    A model with a QK norm also has "q_norm" and "k_norm" (head_dim each,
    1 + N(0, 0.1): Qwen3Attention's q_norm.weight and k_norm.weight), names
    stof does not take: these dicts are the PyTorch peers' (w_qkv 2-D),
    stof_weights makes stof's from them."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    h, f = cfg.hidden, cfg.ffn
    qn = h + 2 * cfg.kv_heads * cfg.head_dim
    f1 = 2 * f if cfg.gated else f

    def rnd(*shape, mean=0.0, std=0.02):
        t = torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32)
        return (t * std + mean).to(dtype).contiguous()

    # (name, shape, mean[, std]), in the order the generator draws them: the
    # order of before, so that the older models keep the weights they had
    # (the QK norm's weights come last, drawn only for a model that has one)
    spec = [("w_qkv", (qn, h), 0.0), ("b_qkv", (qn,), 0.0),
            ("w_o", (h, h), 0.0), ("b_o", (h,), 0.0),
            ("w_ffn1", (f1, h), 0.0), ("b_ffn1", (f1,), 0.0),
            ("w_ffn2", (h, f), 0.0), ("b_ffn2", (h,), 0.0),
            ("norm1_gamma", (h,), 1.0), ("norm1_beta", (h,), 0.0),
            ("norm2_gamma", (h,), 1.0), ("norm2_beta", (h,), 0.0),
            ("q_norm", (cfg.head_dim,), 1.0, 0.1),
            ("k_norm", (cfg.head_dim,), 1.0, 0.1)]
    layers = []
    for _ in range(cfg.layers):
        w = {}
        for name, shape, mean, *std in spec:
            if name.startswith("b_") and not cfg.bias:
                continue
            if name.endswith("_beta") and cfg.norm == "rms":
                continue
            if name in QK_NORM_NAMES and not cfg.qk_norm:
                continue
            w[name] = rnd(*shape, mean=mean, std=std[0] if std else 0.02)
        layers.append(w)
    return layers


def stof_weights(cfg, weights):
    """The dicts stof's Layer.run / stack_run take for make_weights'
    weights: without a QK norm the very same dicts; with one, each layer's
    w_qkv is stof.qkv_weight's flat buffer (w_qkv's rows, then q_norm's
    and k_norm's weights: a new tensor, hidden + 2 kv_heads head_dim rows
    of hidden then 2 head_dim values) and q_norm / k_norm are left out, the
    other tensors shared with the peers'."""
    if not cfg.qk_norm:
        return weights
    h, kvd = cfg.hidden, cfg.kv_heads * cfg.head_dim
    out = []
    for w in weights:
        sw = {k: t for k, t in w.items() if k not in QK_NORM_NAMES}
        q, k, v = w["w_qkv"].split((h, kvd, kvd))
        sw["w_qkv"] = stof.qkv_weight(q, k, v, w["q_norm"], w["k_norm"])
        out.append(sw)
    return out


def make_rope_fn(cfg):
    """The rotary embedding of a forward of the stack, as Hugging Face's
    LlamaModel makes it once and gives to every layer (LlamaRotaryEmbedding
    with the default rope type): rope(x) -> (cos, sin), each [1, S, D] in
    x's dtype, the angle of position p (0..seq-1, the same in every
    sequence) and column j being p * inv_freq[j mod D/2] in fp32, inv_freq =
    1 / theta^(2i / D) computed once in fp32. None for a model without
    RoPE."""
    if not cfg.rope_theta:
        return None
    S, D = cfg.seq, cfg.head_dim
    # on the CPU, then moved, as transformers makes its buffer
    inv_freq = 1.0 / (cfg.rope_theta ** (
        torch.arange(0, D, 2, dtype=torch.float32) / D))
    inv_freq = inv_freq.to("cuda")

    def rope(x):
        pos = torch.arange(S, device=x.device).unsqueeze(0)  # [1, S]
        freqs = pos[..., None].float() * inv_freq             # [1, S, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return rope


def rotate_half(t):
    d = t.shape[-1] // 2
    return torch.cat((-t[..., d:], t[..., :d]), dim=-1)


def make_layer_fn(cfg, attention):
    """One encoder layer (x [B, S, hidden], w, m, pe) -> [B, S, hidden]
    with the semantics of stof_layer_desc. attention(q, k, v, m) takes
    (B, H, S, D) queries, (B, kv_heads, S, D) keys and values, and the mask
    object m passed to the layer; pe: make_rope_fn's (cos, sin) of this
    forward, with which Q and K rotate (rotate-half, in the dtype, as
    Hugging Face's apply_rotary_pos_emb), or None (no RoPE). With cfg.qk_norm
    each head of Q and K is RMS-normalised first, as Qwen3Attention's q_norm
    and k_norm (Qwen3RMSNorm) do it: in fp32, rounded to the dtype, times
    the weight (w["q_norm"], w["k_norm"]) in the dtype."""
    B, S, h, H, D = cfg.batch, cfg.seq, cfg.hidden, cfg.heads, cfg.head_dim
    KV, f = cfg.kv_heads, cfg.ffn
    eps = cfg.eps

    if cfg.act == "silu":
        act = F.silu
    elif cfg.act == "gelu_erf":
        def act(t):
            return F.gelu(t)
    else:
        def act(t):
            return F.gelu(t, approximate="tanh")

    if cfg.norm == "rms":
        def ln(u, w, which):
            return F.rms_norm(u, (h,), w[which + "_gamma"], eps)
    else:
        def ln(u, w, which):
            return F.layer_norm(u, (h,), w[which + "_gamma"], w[which + "_beta"], eps)

    def head_norm(t, weight):
        """Qwen3RMSNorm over the last dimension (a head's D values)."""
        t32 = t.float()
        t32 = t32 * torch.rsqrt(t32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * t32.to(t.dtype)

    # w.get: a model without biases has no b_* keys, and F.linear takes None
    def attn(u, w, m, pe):
        qkv = F.linear(u, w["w_qkv"], w.get("b_qkv"))     # [B, S, h + 2 KV D]
        # rows [0,h) of w_qkv make Q, the next KV*D rows K, the last KV*D V;
        # head i is columns i*D..(i+1)*D of each
        q, k, v = qkv.split((h, KV * D, KV * D), dim=-1)
        q, k = q.view(B, S, H, D), k.view(B, S, KV, D)
        if cfg.qk_norm:                                    # before RoPE
            q, k = head_norm(q, w["q_norm"]), head_norm(k, w["k_norm"])
        q = q.transpose(1, 2)
        k = k.transpose(1, 2)
        v = v.view(B, S, KV, D).transpose(1, 2)
        if pe is not None:                                 # RoPE on Q and K
            cos, sin = pe[0].unsqueeze(1), pe[1].unsqueeze(1)  # [1, 1, S, D]
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        o = attention(q, k, v, m)                          # [B, H, S, D]
        o = o.transpose(1, 2).reshape(B, S, h)
        return F.linear(o, w["w_o"], w.get("b_o"))

    def ffn(u, w):
        t = F.linear(u, w["w_ffn1"], w.get("b_ffn1"))
        if cfg.gated:
            gate, up = t.split(f, dim=-1)                  # gate rows come first
            t = act(gate) * up
        else:
            t = act(t)
        return F.linear(t, w["w_ffn2"], w.get("b_ffn2"))

    if cfg.pre_norm:
        def layer(x, w, m, pe=None):
            hdn = x + attn(ln(x, w, "norm1"), w, m, pe)
            return hdn + ffn(ln(hdn, w, "norm2"), w)
    else:
        def layer(x, w, m, pe=None):
            hdn = ln(x + attn(x, w, m, pe), w, "norm1")
            return ln(hdn + ffn(hdn, w), w, "norm2")
    return layer


def sdpa_attention(q, k, v, dense):
    if k.shape[1] != q.shape[1]:
        # Grouped-query: query head i reads K/V head i // (H / KV). Repeat the
        # K/V heads rather than pass enable_gqa=True: with a mask, SDPA's
        # memory-efficient kernel may not take enable_gqa and the math path
        # would make this peer slower than it need be.
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=dense)


def flex_attention_fn():
    from torch.nn.attention.flex_attention import flex_attention

    def attention(q, k, v, block_mask):
        if k.shape[1] != q.shape[1]:  # grouped-query: the kernel maps heads itself
            return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)
        return flex_attention(q, k, v, block_mask=block_mask)
    return attention


def run_stack(layer, x, weights, m, rope=None):
    """One forward of the stack: the rotary embedding's cos and sin once
    (rope: make_rope_fn's, None without RoPE), then every layer."""
    pe = rope(x) if rope is not None else None
    for w in weights:
        x = layer(x, w, m, pe)
    return x


def rel_err(out, ref):
    out, ref = out.float(), ref.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def max_abs_err(out, ref):
    d = (out.float() - ref.float()).abs()
    return float("inf") if not torch.isfinite(d).all() else d.max().item()


class _Nvml:
    """The GPU's SM clock through NVML (libnvidia-ml, loaded with ctypes;
    device 0, or CUDA_VISIBLE_DEVICES' first): None where it is missing."""

    def __init__(self):
        self.lib = self.dev = None
        try:
            import ctypes
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            dev = ctypes.c_void_p()
            idx = int((os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0])
            if (lib.nvmlInit_v2() == 0 and
                    lib.nvmlDeviceGetHandleByIndex_v2(idx, ctypes.byref(dev)) == 0):
                self.lib, self.dev, self.ct = lib, dev, ctypes
        except (OSError, ValueError, AttributeError):
            pass

    def sm_mhz(self):
        if self.lib is None:
            return None
        v = self.ct.c_uint()
        ok = self.lib.nvmlDeviceGetClockInfo(self.dev, 1, self.ct.byref(v)) == 0
        return v.value if ok else None

    def energy_mj(self):
        """The board's energy counter (mJ since the driver loaded; Volta and
        newer), or None."""
        if self.lib is None:
            return None
        v = self.ct.c_ulonglong()
        ok = self.lib.nvmlDeviceGetTotalEnergyConsumption(self.dev, self.ct.byref(v)) == 0
        return v.value if ok else None


_NVML = None
# The median SM clock (MHz) NVML read while the last time_ms call's runs
# were on the GPU (None without NVML or without a sample).
LAST_MHZ = [None]


def time_ms(fn, reps, warmup):
    """Median ms of `reps` runs of fn (the whole stack), CUDA events; the SM
    clock sampled meanwhile into LAST_MHZ (the stacks run back to back, so a
    power-dense stack runs at the clock the GPU's power limit leaves it)."""
    global _NVML
    if _NVML is None:
        _NVML = _Nvml()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    clocks = []
    for i, (a, b) in enumerate(ev):
        a.record()
        fn()
        b.record()
        if i >= reps // 2 and i % 4 == 0:  # while the host issues (eager)
            clocks.append(_NVML.sm_mhz())
    while not ev[-1][1].query():           # while the GPU catches up
        clocks.append(_NVML.sm_mhz())
        time.sleep(0.002)
    torch.cuda.synchronize()
    clocks = [c for c in clocks if c]
    LAST_MHZ[0] = statistics.median(clocks) if clocks else None
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def sustained(r, key, fn, seconds, ms):
    """--energy: fn (one stack) back to back for about `seconds`, after a
    second of warm-up at that load: r[key + "_sus_ms"] (wall time a stack,
    the GPU at whatever clock its power limit leaves), key + "_j" (the
    board's energy a stack, NVML's counter: it moves in coarse steps, so
    take seconds), key + "_w" (mean power) and key + "_sus_mhz" (median SM
    clock). Nothing without NVML's energy counter."""
    global _NVML
    if _NVML is None:
        _NVML = _Nvml()
    if seconds <= 0 or not ms or _NVML.energy_mj() is None:
        return
    n = max(3, int(seconds * 1000.0 / ms))
    for _ in range(max(2, int(1000.0 / ms))):
        fn()
    torch.cuda.synchronize()
    clocks = []
    e0, t0 = _NVML.energy_mj(), time.perf_counter()
    for i in range(n):
        fn()
        if i % 8 == 0:
            clocks.append(_NVML.sm_mhz())
    torch.cuda.synchronize()
    e1, t1 = _NVML.energy_mj(), time.perf_counter()
    clocks = [c for c in clocks if c]
    r[key + "_sus_ms"] = (t1 - t0) * 1000.0 / n
    r[key + "_j"] = (e1 - e0) / 1000.0 / n
    r[key + "_w"] = (e1 - e0) / 1000.0 / (t1 - t0)
    r[key + "_sus_mhz"] = statistics.median(clocks) if clocks else None


_PEAKS = {}


def _gemm_shapes(cfg):
    h, f = cfg.hidden, cfg.ffn
    qn = h + 2 * cfg.kv_heads * cfg.head_dim
    return [(qn, h), (h, h), ((2 * f if cfg.gated else f), h), (h, f)]


def _gemm_ms(M, shapes, dtype, reps, warmup):
    """[(ms, flops)] of F.linear (cuBLAS, plain) on each (N, K) with M rows."""
    import torch.nn.functional as F
    g = torch.Generator(device="cuda")
    g.manual_seed(7)
    out = []
    for n, k in shapes:
        a = torch.randn(M, k, device="cuda", generator=g).to(dtype)
        w = torch.randn(n, k, device="cuda", generator=g).to(dtype)
        out.append((time_ms(lambda: F.linear(a, w), reps, warmup), 2.0 * M * n * k))
        del a, w
    return out


def device_peaks(cfg, dtype, reps, warmup):
    """The rates this GPU reaches on the model's shapes, measured once per
    model at a size that fills it: the best TFLOP/s of cuBLAS (F.linear) on
    the layer's four GEMM shapes at 32768 tokens, SDPA's dense attention at
    16 x heads x 2048 x head_dim, and a device-to-device copy's TB/s."""
    import torch.nn.functional as F
    key = (cfg.name, dtype)
    if key not in _PEAKS:
        gemm = max(fl / ms / 1e9 for ms, fl in
                   _gemm_ms(32768, _gemm_shapes(cfg), dtype, reps, warmup))
        q = torch.randn(16, cfg.heads, 2048, cfg.head_dim, device="cuda").to(dtype)
        k, v = torch.randn_like(q), torch.randn_like(q)
        ams = time_ms(lambda: F.scaled_dot_product_attention(q, k, v), reps, warmup)
        attn = 4.0 * q.numel() * 2048 / ams / 1e9
        del q, k, v
        big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        copy = 2.0 * big.numel() / time_ms(lambda: big.clone(), reps, warmup) / 1e9
        del big
        _PEAKS[key] = (gemm, attn, copy)
    return _PEAKS[key]


def stack_floor(cfg, dtype, density, reps, warmup):
    """The stack's floor as the Hopper-GEMM issue defines it (ms a stack):
    the layer's GEMM FLOPs at the peak cuBLAS reaches (device_peaks), plus
    the attention's FLOPs (4 B H S^2 D times the mask's density) at SDPA's
    dense rate, plus two norms a layer, each reading and writing tokens x
    hidden, at the copy bandwidth. Also "cublas_gemm_ms": the layer's plain
    GEMMs through cuBLAS at this size, each shape timed alone, summed."""
    gemm_peak, attn_peak, copy = device_peaks(cfg, dtype, reps, warmup)
    M = cfg.batch * cfg.seq
    B, H, S, D = cfg.batch, cfg.heads, cfg.seq, cfg.head_dim
    at_size = _gemm_ms(M, _gemm_shapes(cfg), dtype, reps, warmup)
    flops = sum(fl for _, fl in at_size)
    esz = torch.finfo(dtype).bits // 8
    gemm = flops / (gemm_peak * 1e9)
    attn = 4.0 * B * H * S * S * D * density / (attn_peak * 1e9)
    norm = 2 * 2.0 * M * cfg.hidden * esz / (copy * 1e9)
    n = cfg.layers
    return {"gemm_peak_tflops": gemm_peak, "attn_tflops": attn_peak,
            "copy_tbps": copy, "cublas_gemm_ms": sum(ms for ms, _ in at_size) * n,
            "floor_gemm_ms": gemm * n, "floor_attn_ms": attn * n,
            "floor_norm_ms": norm * n, "floor_ms": (gemm + attn + norm) * n}


def cublas_stack_ms(cfg, weights, dtype, reps, warmup, profile=False):
    """The stack's GEMMs alone through cuBLAS (torch.matmul, plain: no bias,
    activation, residual or norm), chained as the layer chains them (QKV,
    output projection, FFN1, FFN2; each layer's own weights) and replayed as
    one CUDA graph: ms a stack. About what a stack whose GEMMs run at the
    vendor library's speed spends before any of its other work. With
    profile, (ms, profile_kernels' rows and span of the graph)."""
    M, h, f = cfg.batch * cfg.seq, cfg.hidden, cfg.ffn
    g = torch.Generator(device="cuda")
    g.manual_seed(11)
    qn = h + 2 * cfg.kv_heads * cfg.head_dim
    f1 = 2 * f if cfg.gated else f

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)
    x, att = rnd(M, h), rnd(M, h)
    qkv = torch.empty(M, qn, device="cuda", dtype=dtype)
    o = torch.empty(M, h, device="cuda", dtype=dtype)
    hh = torch.empty(M, f1, device="cuda", dtype=dtype)

    def stack():
        for w in weights:
            torch.matmul(x, w["w_qkv"].t(), out=qkv)
            torch.matmul(att, w["w_o"].t(), out=o)
            torch.matmul(o, w["w_ffn1"].t(), out=hh)
            torch.matmul(hh[:, :f], w["w_ffn2"].t(), out=x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        stack()
        stack()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        stack()
    ms = time_ms(graph.replay, reps, warmup)
    prof = profile_kernels(graph.replay, len(weights)) if profile else None
    del graph, x, att, qkv, o, hh
    return (ms, *prof) if profile else ms


def attention_ms(rows, layers):
    """ms a stack of the attention kernels in profile_kernels' rows (us a
    layer): stof's kernels whose name has "attn" in it (stof_attn_wgmma,
    stof_attn_block, split-KV's stof_attn_combine)."""
    return sum(us for name, us in rows if "stof_attn" in name) * layers * 1e-3


def fp32_reference(cfg, x, weights, dense):
    """The eager stack in fp32 (weights converted one layer at a time, the
    QK norm's too; the rotary embedding's cos and sin in fp32)."""
    layer = make_layer_fn(cfg, sdpa_attention)
    rope = make_rope_fn(cfg)
    h = x.float()
    pe = rope(h) if rope is not None else None
    for w in weights:
        h = layer(h, {k: t.float() for k, t in w.items()}, dense, pe)
    return h


def short(e):
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:200]


def hf_stack(cfg, weights, dtype):
    """The stack as Hugging Face transformers layers (imported here, so that
    the script needs transformers only with --hf): (config, modules,
    prepare), each module on CUDA in dtype, in eval mode, holding a copy of
    weights; prepare(x) gives the keyword arguments of every layer's call
    but the mask, made once a forward of the stack as the model makes them
    (llama, qwen3: the rotary embedding's cos and sin, from
    LlamaRotaryEmbedding / Qwen3RotaryEmbedding).
    The attention implementation is config._attn_implementation, read by
    the layers at each call, so one stack serves both "eager" and "sdpa"."""
    h, H, f, KV, D, eps = (cfg.hidden, cfg.heads, cfg.ffn, cfg.kv_heads,
                           cfg.head_dim, cfg.eps)
    S = cfg.seq
    # "gelu_new" is HF's tanh approximation (GPT-2's own), "gelu" the exact one
    hf_act = "gelu_new" if cfg.act == "gelu_tanh" else "gelu"
    rotary = None  # llama's LlamaRotaryEmbedding, qwen3's Qwen3RotaryEmbedding
    if cfg.hf == "bert":
        from transformers import BertConfig
        from transformers.models.bert.modeling_bert import BertLayer
        config = BertConfig(hidden_size=h, num_attention_heads=H, intermediate_size=f,
                            hidden_act=hf_act, layer_norm_eps=eps,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

        def make(i):
            return BertLayer(config)

        def pairs(m, w):
            a = m.attention
            q, k, v = w["w_qkv"].split(h)
            bq, bk, bv = w["b_qkv"].split(h)
            return [(a.self.query.weight, q), (a.self.query.bias, bq),
                    (a.self.key.weight, k), (a.self.key.bias, bk),
                    (a.self.value.weight, v), (a.self.value.bias, bv),
                    (a.output.dense.weight, w["w_o"]), (a.output.dense.bias, w["b_o"]),
                    (a.output.LayerNorm.weight, w["norm1_gamma"]),
                    (a.output.LayerNorm.bias, w["norm1_beta"]),
                    (m.intermediate.dense.weight, w["w_ffn1"]),
                    (m.intermediate.dense.bias, w["b_ffn1"]),
                    (m.output.dense.weight, w["w_ffn2"]),
                    (m.output.dense.bias, w["b_ffn2"]),
                    (m.output.LayerNorm.weight, w["norm2_gamma"]),
                    (m.output.LayerNorm.bias, w["norm2_beta"])]
    elif cfg.hf == "gpt2":
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block
        config = GPT2Config(n_embd=h, n_head=H, n_inner=f, activation_function=hf_act,
                            layer_norm_epsilon=eps, resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0)

        def make(i):
            return GPT2Block(config, layer_idx=i)

        # GPT-2's Conv1D keeps its weight as [in, out], nn.Linear's transposed.
        # Its attention is causal only through the mask it is given (the
        # model builds that mask): given ours, it attends as the others do.
        def pairs(m, w):
            return [(m.ln_1.weight, w["norm1_gamma"]), (m.ln_1.bias, w["norm1_beta"]),
                    (m.attn.c_attn.weight, w["w_qkv"].t()),
                    (m.attn.c_attn.bias, w["b_qkv"]),
                    (m.attn.c_proj.weight, w["w_o"].t()), (m.attn.c_proj.bias, w["b_o"]),
                    (m.ln_2.weight, w["norm2_gamma"]), (m.ln_2.bias, w["norm2_beta"]),
                    (m.mlp.c_fc.weight, w["w_ffn1"].t()), (m.mlp.c_fc.bias, w["b_ffn1"]),
                    (m.mlp.c_proj.weight, w["w_ffn2"].t()),
                    (m.mlp.c_proj.bias, w["b_ffn2"])]
    elif cfg.hf == "vit":
        from transformers import ViTConfig
        from transformers.models.vit.modeling_vit import ViTLayer
        config = ViTConfig(hidden_size=h, num_attention_heads=H, intermediate_size=f,
                           hidden_act=hf_act, layer_norm_eps=eps,
                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

        def make(i):
            return ViTLayer(config)

        # the layout of transformers 5 (q_proj ... o_proj, mlp.fc1/fc2); an
        # older one has other names and ends as hf_error
        def pairs(m, w):
            a = m.attention
            q, k, v = w["w_qkv"].split(h)
            bq, bk, bv = w["b_qkv"].split(h)
            return [(m.layernorm_before.weight, w["norm1_gamma"]),
                    (m.layernorm_before.bias, w["norm1_beta"]),
                    (a.q_proj.weight, q), (a.q_proj.bias, bq),
                    (a.k_proj.weight, k), (a.k_proj.bias, bk),
                    (a.v_proj.weight, v), (a.v_proj.bias, bv),
                    (a.o_proj.weight, w["w_o"]), (a.o_proj.bias, w["b_o"]),
                    (m.layernorm_after.weight, w["norm2_gamma"]),
                    (m.layernorm_after.bias, w["norm2_beta"]),
                    (m.mlp.fc1.weight, w["w_ffn1"]), (m.mlp.fc1.bias, w["b_ffn1"]),
                    (m.mlp.fc2.weight, w["w_ffn2"]), (m.mlp.fc2.bias, w["b_ffn2"])]
    elif cfg.hf in ("llama", "qwen3"):
        if cfg.hf == "llama":
            from transformers import LlamaConfig
            from transformers.models.llama.modeling_llama import (
                LlamaDecoderLayer as DecoderLayer,
                LlamaRotaryEmbedding as RotaryEmbedding)
            config = LlamaConfig(hidden_size=h, intermediate_size=f,
                                 num_attention_heads=H, num_key_value_heads=KV,
                                 rms_norm_eps=eps, hidden_act="silu",
                                 attention_bias=False, mlp_bias=False,
                                 rope_theta=cfg.rope_theta)
        else:
            # Qwen3: Llama's layer with q_norm and k_norm (Qwen3RMSNorm of
            # head_dim on each head of Q and K, before RoPE). head_dim given
            # (its default is 128 whatever the hidden size); num_hidden_layers
            # the stack's, so that config.layer_types names every layer (all
            # full attention: no sliding window, checked below)
            from transformers import Qwen3Config
            from transformers.models.qwen3.modeling_qwen3 import (
                Qwen3DecoderLayer as DecoderLayer,
                Qwen3RotaryEmbedding as RotaryEmbedding)
            config = Qwen3Config(hidden_size=h, intermediate_size=f,
                                 num_attention_heads=H, num_key_value_heads=KV,
                                 head_dim=D, num_hidden_layers=cfg.layers,
                                 rms_norm_eps=eps, hidden_act="silu",
                                 attention_bias=False, use_sliding_window=False,
                                 max_position_embeddings=max(40960, S),
                                 rope_theta=cfg.rope_theta)
        # transformers 5 keeps the base in config.rope_parameters, 4.x in
        # config.rope_theta; a config that lost it would rotate differently
        params = getattr(config, "rope_parameters", None)
        if not isinstance(params, dict):
            params = {"rope_theta": getattr(config, "rope_theta", None)}
        theta, rope_type = params.get("rope_theta"), params.get("rope_type", "default")
        if theta is None or float(theta) != cfg.rope_theta or rope_type != "default":
            raise ValueError("HF %s config: RoPE %s base %s, not the default "
                             "rope with base %g" % (cfg.hf, rope_type, theta,
                                                    cfg.rope_theta))
        if getattr(config, "head_dim", None) not in (None, D):
            raise ValueError("HF %s config: head_dim %s, not %d"
                             % (cfg.hf, config.head_dim, D))

        def make(i):
            m = DecoderLayer(config, layer_idx=i)
            if getattr(m.self_attn, "sliding_window", None):
                raise ValueError("HF %s layer %d: a sliding window of %s"
                                 % (cfg.hf, i, m.self_attn.sliding_window))
            return m

        def pairs(m, w):
            a = m.self_attn
            q, k, v = w["w_qkv"].split((h, KV * D, KV * D))
            gate, up = w["w_ffn1"].split(f)
            got = [(m.input_layernorm.weight, w["norm1_gamma"]),
                   (a.q_proj.weight, q), (a.k_proj.weight, k), (a.v_proj.weight, v),
                   (a.o_proj.weight, w["w_o"]),
                   (m.post_attention_layernorm.weight, w["norm2_gamma"]),
                   (m.mlp.gate_proj.weight, gate), (m.mlp.up_proj.weight, up),
                   (m.mlp.down_proj.weight, w["w_ffn2"])]
            if cfg.qk_norm:  # (a layer without q_norm fails here)
                got += [(a.q_norm.weight, w["q_norm"]), (a.k_norm.weight, w["k_norm"])]
            return got
        # The model's rotary embedding (prepare). Its inverse frequencies
        # stay in fp32: a buffer that .to(dtype) would round (a model
        # loaded in fp16 keeps them in fp32 too).
        rotary = RotaryEmbedding(config=config).to("cuda")
    else:
        raise ValueError("no Hugging Face peer for %s" % cfg.name)

    def prepare(x):
        """What a forward gives every layer but the mask, made once as the
        model makes it: llama's and qwen3's rotary embedding from
        position_ids 0..S-1 ([1, S], as LlamaModel makes them without a
        cache: every sequence of the batch has the same positions), cos and
        sin [1, S, D] in x's dtype; nothing for the other models."""
        if rotary is None:
            return {}
        pos = torch.arange(S, device=x.device).unsqueeze(0)
        return {"position_embeddings": rotary(x, pos), "position_ids": pos}

    modules = []
    with torch.no_grad():
        for i, w in enumerate(weights):
            # Made on the GPU (the fp32 init of one layer at a time, then
            # dtype), not on the CPU: llama's 22 layers are 1.1 G parameters.
            with torch.device("cuda"):
                m = make(i)
            m = m.to(dtype=dtype).eval().requires_grad_(False)
            done = set()
            for param, src in pairs(m, w):
                if tuple(param.shape) != tuple(src.shape):
                    raise ValueError("HF %s layer: parameter of shape %s for a weight "
                                     "of shape %s" % (cfg.hf, tuple(param.shape),
                                                      tuple(src.shape)))
                param.copy_(src)
                done.add(id(param))
            # every parameter must come from our weights, none left at its init
            left = [n for n, p in m.named_parameters() if id(p) not in done]
            if left:
                raise ValueError("HF %s layer: parameters not loaded: %s"
                                 % (cfg.hf, ", ".join(left)))
            modules.append(m)
    return config, modules, prepare


def bench_hf(args, cfg, r, x, weights, dense, y_eager, ref32, dtype):
    """Time the Hugging Face stack (hf_stack) under the "eager" and "sdpa"
    attention implementations into r; failures go to r["hf_error"]. All its
    tensors and modules are locals here, freed when it returns."""
    B, S = cfg.batch, cfg.seq
    errors = []
    try:
        import transformers
        r["hf_version"] = transformers.__version__
        t0 = time.perf_counter()
        config, modules, prepare = hf_stack(cfg, weights, dtype)
        torch.cuda.synchronize()
        r["hf_build_s"] = time.perf_counter() - t0
        # HF layers add the mask to the scores (eager) or give it to SDPA as
        # attn_mask: an additive float mask in the dtype, 0 where dense is
        # True, the dtype's minimum (not -inf) where False, as HF's own
        # mask builders make it. Every bigbird row attends somewhere.
        ext = torch.zeros(S, S, device="cuda", dtype=dtype)
        ext.masked_fill_(~dense, torch.finfo(dtype).min)
        ext = ext.view(1, 1, S, S)

        def run():
            hh = x
            kw = prepare(hh)  # once a forward, as the model does
            for m in modules:
                out = m(hh, attention_mask=ext, **kw)
                hh = out[0] if isinstance(out, tuple) else out  # older versions: tuples
            return hh
    except Exception as e:  # no transformers, or its classes changed: go on
        r["hf_error"] = short(e)
        print(f"# {cfg.name} {B}x{S}: Hugging Face peer failed: {short(e)}",
              file=sys.stderr, flush=True)
        if args.verbose:
            traceback.print_exc()
        return
    for impl in ("eager", "sdpa"):
        try:
            config._attn_implementation = impl
            with torch.no_grad():
                y = run()
                torch.cuda.synchronize()
                r[f"hf_{impl}_err"] = rel_err(y, y_eager)
                if ref32 is not None:
                    r[f"hf_{impl}_err_fp32"] = rel_err(y, ref32)
                del y
                r[f"hf_{impl}_ms"] = time_ms(run, args.reps, args.warmup)
                r[f"hf_{impl}_mhz"] = LAST_MHZ[0]
                sustained(r, f"hf_{impl}", run, args.energy, r[f"hf_{impl}_ms"])
        except Exception as e:  # e.g. out of memory in HF's eager attention
            errors.append(f"{impl}: {short(e)}")
            print(f"# {cfg.name} {B}x{S}: Hugging Face {impl} failed: {short(e)}",
                  file=sys.stderr, flush=True)
            if args.verbose:
                traceback.print_exc()
    if errors:
        r["hf_error"] = "; ".join(errors)


def bench_case(args, ctx, cfg, dtype, seed):
    B, S = cfg.batch, cfg.seq
    r = {"model": cfg.name, "batch": B, "seq": S, "layers": cfg.layers,
         "hidden": cfg.hidden, "heads": cfg.heads, "kv_heads": cfg.kv_heads,
         "ffn": cfg.ffn, "pre_norm": cfg.pre_norm, "norm": cfg.norm,
         "gated": cfg.gated, "bias": cfg.bias, "act": cfg.act, "eps": cfg.eps,
         "rope_theta": cfg.rope_theta, "qk_norm": cfg.qk_norm, "dtype": args.dtype,
         "mask": MASK_SPEC}
    mask = ctx.mask(MASK_SPEC, S, S)
    r["density"] = mask.density
    dense = mask.to_dense().cuda()
    weights = make_weights(cfg, dtype, seed)
    g = torch.Generator(device="cuda")
    g.manual_seed(seed + 1)
    x = torch.randn(B, S, cfg.hidden, generator=g, device="cuda",
                    dtype=torch.float32).to(dtype)

    # eager (the reference of the checks); rope: the rotary embedding of a
    # forward (llama), computed once a stack by every PyTorch peer's stack
    eager_layer = make_layer_fn(cfg, sdpa_attention)
    rope = make_rope_fn(cfg)
    y_eager = run_stack(eager_layer, x, weights, dense, rope)
    torch.cuda.synchronize()
    if not args.no_fp32_ref:
        ref32 = fp32_reference(cfg, x, weights, dense)
        r["eager_err_fp32"] = rel_err(y_eager, ref32)
    else:
        ref32 = None
    r["eager_ms"] = time_ms(lambda: run_stack(eager_layer, x, weights, dense, rope),
                            args.reps, args.warmup)
    r["eager_mhz"] = LAST_MHZ[0]
    sustained(r, "eager", lambda: run_stack(eager_layer, x, weights, dense, rope),
              args.energy, r["eager_ms"])

    # The eager stack captured in a CUDA graph and replayed (what a server
    # that captures its PyTorch model runs: no host work a call; at small
    # sizes the eager stack is bound by the host issuing it)
    if not args.no_eager_graph:
        try:
            sx = x.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    run_stack(eager_layer, sx, weights, dense, rope)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y_g = run_stack(eager_layer, sx, weights, dense, rope)
            graph.replay()
            torch.cuda.synchronize()
            r["eager_graph_err"] = rel_err(y_g, y_eager)
            r["eager_graph_ms"] = time_ms(graph.replay, args.reps, args.warmup)
            r["eager_graph_mhz"] = LAST_MHZ[0]
            del graph, y_g, sx
        except Exception as e:  # report and go on
            r["eager_graph_error"] = short(e)
            print(f"# {cfg.name} {B}x{S}: eager in a CUDA graph failed: "
                  f"{short(e)}", file=sys.stderr, flush=True)
            if args.verbose:
                traceback.print_exc()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    # torch.compile with FlexAttention, in each of the --compile-mode modes,
    # each layer compiled (called once a layer) and/or the whole stack as
    # one function (--compile-scope); compile_ms is the fastest's (the best
    # of them is the peer)
    if not args.no_compile:
        runs = [(mode, scope) for scope in args.compile_scope.split(",")
                for mode in args.compile_mode.split(",")]
        for mode, scope in runs:
            name = mode if scope == "layer" else f"{mode} (stack)"
            try:
                from torch.nn.attention.flex_attention import create_block_mask
                table = dense

                def mask_mod(b, hh, q, k):
                    return table[q, k]
                t0 = time.perf_counter()
                bm = create_block_mask(mask_mod, None, None, S, S, device="cuda")
                layer = make_layer_fn(cfg, flex_attention_fn())
                kw = {} if mode == "default" else {"mode": mode}
                if scope == "stack":
                    # the rotary embedding compiled into the stack
                    stack_c = torch.compile(
                        lambda xx, ws, m: run_stack(layer, xx, ws, m, rope),
                        dynamic=False, **kw)
                    fn = lambda: stack_c(x, weights, bm)  # noqa: E731
                else:
                    # the rotary embedding compiled on its own, called once
                    # a stack as the eager stack calls it
                    layer_c = torch.compile(layer, dynamic=False, **kw)
                    rope_c = (torch.compile(rope, dynamic=False, **kw)
                              if rope is not None else None)
                    fn = lambda: run_stack(layer_c, x, weights, bm, rope_c)  # noqa: E731
                y_c = fn()
                torch.cuda.synchronize()
                m = {"first_s": time.perf_counter() - t0,
                     "err": rel_err(y_c, y_eager)}
                if ref32 is not None:
                    m["err_fp32"] = rel_err(y_c, ref32)
                del y_c
                m["ms"] = time_ms(fn, args.reps, args.warmup)
                m["mhz"] = LAST_MHZ[0]
                sustained(m, "c", fn, args.energy, m["ms"])
                del fn, bm
                r.setdefault("compile_modes", {})[name] = m
                if "compile_ms" not in r or m["ms"] < r["compile_ms"]:
                    r["compile_ms"], r["compile_mode"] = m["ms"], name
                    r["compile_mhz"] = m["mhz"]
                    for k in ("sus_ms", "j", "w", "sus_mhz"):
                        if "c_" + k in m:
                            r["compile_" + k] = m["c_" + k]
                    r["compile_first_s"], r["compile_err"] = m["first_s"], m["err"]
                    if "err_fp32" in m:
                        r["compile_err_fp32"] = m["err_fp32"]
            except Exception as e:  # report and go on
                err = f"{name}: {short(e)}"
                r["compile_error"] = (r["compile_error"] + "; " + err
                                      if "compile_error" in r else err)
                print(f"# {cfg.name} {B}x{S}: torch.compile ({name}) failed: "
                      f"{short(e)}", file=sys.stderr, flush=True)
                if args.verbose:
                    traceback.print_exc()
            torch._dynamo.reset()  # each mode compiles afresh

    # Hugging Face transformers' own layers
    if args.hf:
        if cfg.hf is not None:
            bench_hf(args, cfg, r, x, weights, dense, y_eager, ref32, dtype)
        else:
            r["hf_error"] = "no Hugging Face peer for " + cfg.name
        # drop the HF stack's copy of the weights (llama: 2 GiB) before stof
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    # stof
    if not args.peers_only:
        layer = sweights = None

        def plan():
            # kv_heads 0 means "= heads": the older models keep the very
            # descriptor (and tuning database entries) they had before
            kv = 0 if cfg.kv_heads == cfg.heads else cfg.kv_heads
            return ctx.layer_plan(B, S, cfg.hidden, cfg.heads, cfg.ffn, dtype, cfg.act,
                                  cfg.norm, cfg.pre_norm, mask, eps=cfg.eps,
                                  kv_heads=kv, bias=cfg.bias, gated=cfg.gated,
                                  rope_theta=cfg.rope_theta, qk_norm=cfg.qk_norm)
        try:
            # stof's weight dicts (qwen3: w_qkv with the QK norm's weights in
            # it, a copy; the other models: the peers' very dicts)
            sweights = stof_weights(cfg, weights)
            t0 = time.perf_counter()
            layer = plan()
            r["stof_plan_s"] = time.perf_counter() - t0
            desc = layer.describe()
            r["stof_describe"] = desc
            r["stof_source"] = desc.get("source")
            r["stof_scheme"] = desc.get("scheme", desc)
            if args.warm_plan:
                t0 = time.perf_counter()
                l2 = plan()
                r["stof_warm_plan_s"] = time.perf_counter() - t0
                d2 = l2.describe()
                r["stof_warm_source"] = d2.get("source")
                # its parts (ms): the attention plan, the buffers, the kernels
                r["stof_warm_plan_parts"] = d2.get("plan_ms")
                l2.close()
                del l2
            y = torch.empty_like(x)
            # one layer, then the stack without and with the graph
            y1_ref = eager_layer(x, weights[0], dense,
                                 rope(x) if rope is not None else None)
            y.fill_(float("nan"))
            layer.run(sweights[0], x, y)
            torch.cuda.synchronize()
            r["stof_layer1_err"] = rel_err(y, y1_ref)
            del y1_ref
            y.fill_(float("nan"))
            layer.stack_run(sweights, x, y, graph=False)
            torch.cuda.synchronize()
            r["stof_nograph_err"] = rel_err(y, y_eager)
            y.fill_(float("nan"))
            layer.stack_run(sweights, x, y, graph=True)
            torch.cuda.synchronize()
            r["rel_err"] = rel_err(y, y_eager)
            r["max_abs_err"] = max_abs_err(y, y_eager)
            if ref32 is not None:
                r["stof_err_fp32"] = rel_err(y, ref32)
            r["stof_ok"] = (r["rel_err"] <= FAIL_REL_ERR and
                            r["stof_nograph_err"] <= FAIL_REL_ERR)
            r["stof_ms"] = time_ms(lambda: layer.stack_run(sweights, x, y, graph=True),
                                   args.reps, args.warmup)
            r["stof_mhz"] = LAST_MHZ[0]
            sustained(r, "stof", lambda: layer.stack_run(sweights, x, y, graph=True),
                      args.energy, r["stof_ms"])
            # the graph replays of the timing must still give the same output
            r["stof_replay_err"] = rel_err(y, y_eager)
            r["stof_ok"] = r["stof_ok"] and r["stof_replay_err"] <= FAIL_REL_ERR
            if args.profile or args.bound:
                # (the bound takes the attention's time from it)
                try:
                    rows, span = profile_kernels(
                        lambda: layer.stack_run(sweights, x, y, graph=True),
                        r["layers"])
                    r["stof_attn_ms"] = attention_ms(rows, r["layers"])
                    if args.profile:
                        r["stof_profile"], r["stof_span_us"] = rows, span
                    if args.bound and not r["stof_attn_ms"]:
                        r["bound_error"] = "no attention kernel in the profile"
                except Exception as e:  # the profiler's, not stof's
                    r["bound_error"] = "profile: " + short(e)
            if not args.no_graph_compare:
                r["stof_nograph_ms"] = time_ms(
                    lambda: layer.stack_run(sweights, x, y, graph=False),
                    args.reps, args.warmup)
            del y
        except Exception as e:  # report and go on
            r["stof_error"] = short(e)
            r["stof_ok"] = False
            print(f"# {cfg.name} {B}x{S}: stof failed: {short(e)}",
                  file=sys.stderr, flush=True)
            if args.verbose:
                traceback.print_exc()
        finally:
            if layer is not None:
                layer.close()
            del layer, sweights
    peers = {k: r[k] for k in PEER_TIMES if k in r}
    for k in list(peers):
        e = r.get(PEER_ERRS.get(k, ""))
        if e is not None and not e <= FAIL_REL_ERR:
            r.setdefault("peers_excluded", []).append(k[:-len("_ms")])
            del peers[k]
            print(f"# {cfg.name} {B}x{S}: {k[:-3]} left out of the ratios: its "
                  f"output is {e:.2g} from the eager stack's", file=sys.stderr,
                  flush=True)
    if "stof_ms" in r and peers:
        best = min(peers, key=peers.get)
        r["best_peer"] = best[:-len("_ms")]
        r["speedup"] = peers[best] / r["stof_ms"]
        listed = [peers[k] for k in ISSUE_PEER_TIMES if k in peers]
        if listed:
            r["speedup_issue"] = min(listed) / r["stof_ms"]
    if not args.no_floor:
        try:
            r.update(stack_floor(cfg, dtype, r["density"], args.reps, args.warmup))
        except Exception as e:  # e.g. out of memory: report and go on
            print(f"# {cfg.name} {B}x{S}: floor failed: {short(e)}",
                  file=sys.stderr, flush=True)
    if args.bound and r.get("stof_ok") and r.get("stof_attn_ms"):
        try:
            got = cublas_stack_ms(cfg, weights, dtype, args.reps,
                                  args.warmup, profile=args.profile)
            if args.profile:
                (r["cublas_stack_ms"], r["cublas_profile"],
                 r["cublas_span_us"]) = got
            else:
                r["cublas_stack_ms"] = got
            r["bound_ms"] = r["cublas_stack_ms"] + r["stof_attn_ms"]
            if peers:
                r["bound_speedup"] = min(peers.values()) / r["bound_ms"]
        except Exception as e:  # e.g. out of memory: report and go on
            r["bound_error"] = "cuBLAS stack: " + short(e)
    if "bound_error" in r:
        print(f"# {cfg.name} {B}x{S}: bound failed: {r['bound_error']}",
              file=sys.stderr, flush=True)
    return r  # the tensors go with this frame


def profile_kernels(fn, layers, replays=3):
    """Kernel times of one call of fn (a stack of `layers` layers) under
    torch.profiler, `replays` calls after one untimed: by position in a
    layer, [(name, us a layer, averaged over the layers and calls)], in
    launch order, or by name when the kernels do not split into equal
    layers; and the mean span of a call on the GPU (its first kernel's
    start to its last kernel's end, us), so that the time between the
    kernels shows against their sum."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.events()
           if str(getattr(e, "device_type", "")).endswith("CUDA") and
           "Memset" not in e.name and "Memcpy" not in e.name]
    evs.sort(key=lambda e: e.time_range.start)
    span = None
    if evs and len(evs) % replays == 0:
        n = len(evs) // replays
        span = sum(max(e.time_range.end for e in evs[i:i + n]) -
                   evs[i].time_range.start
                   for i in range(0, len(evs), n)) / replays
    per = len(evs) // (replays * layers) if layers else 0
    if per and len(evs) == per * replays * layers:
        rows = []
        for k in range(per):
            ts = [evs[i].time_range.elapsed_us() for i in range(k, len(evs), per)]
            rows.append((evs[k].name, sum(ts) / len(ts)))
        return rows, span
    # layers of different kernels (a fused stack ending: the first layer
    # runs one norm more): by kernel name, in order of first launch
    by = {}
    for e in evs:
        by[e.name] = by.get(e.name, 0.0) + e.time_range.elapsed_us()
    n = replays * max(layers, 1)
    return [(name + " (all calls)", us / n) for name, us in by.items()], span


def print_profiles(results):
    for r in results:
        for who, what in (("stof", "stof kernels"),
                          ("cublas", "the --bound's cuBLAS GEMMs")):
            rows = r.get(who + "_profile")
            if not rows:
                continue
            total = sum(t[1] for t in rows)
            print()
            print(f"{what} of a layer, {r['model']} {r['batch']}x{r['seq']} "
                  f"(torch.profiler, mean over the stack's {r['layers']} "
                  f"layers: {total:.1f} us a layer)")
            span = r.get(who + "_span_us")
            if span:
                gap = span / r['layers'] - total
                print(f"  a stack's span on the GPU {span:.1f} us, its kernels "
                      f"{total * r['layers']:.1f} us: {gap:.1f} us a layer "
                      f"between kernels" +
                      (" (they overlap: programmatic launches)"
                       if gap < 0 else ""))
            for name, us in rows:
                print(f"{us:9.1f} us {100 * us / total:5.1f}%  {name[:90]}")


def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else format("-", ">" +
                                                                        spec.split(".")[0])


def print_table(results):
    print()
    print(f"{'model':>10} {'BxS':>8} {'eager ms':>9} {'graph ms':>9} {'compile ms':>10} "
          f"{'stof ms':>8} "
          f"{'x best':>7} {'x list':>7} {'stof err':>9} {'max abs':>8} {'plan s':>7} {'source':>8} "
          f"{'compile 1st s':>13} {'hf eager ms':>11} {'hf sdpa ms':>10}")
    for r in results:
        bs = f"{r['batch']}x{r['seq']}"
        err = r.get("rel_err")
        flag = "" if r.get("stof_ok", True) or "stof_error" in r else " FAIL"
        print(f"{r['model']:>10} {bs:>8} {fmt(r.get('eager_ms'), '9.3f')} "
              f"{fmt(r.get('eager_graph_ms'), '9.3f')} "
              f"{fmt(r.get('compile_ms'), '10.3f')} {fmt(r.get('stof_ms'), '8.3f')} "
              f"{fmt(r.get('speedup'), '7.2f')} "
              f"{fmt(r.get('speedup_issue'), '7.2f')} {fmt(err, '9.1e')} "
              f"{fmt(r.get('max_abs_err'), '8.1e')} {fmt(r.get('stof_plan_s'), '7.2f')} "
              f"{str(r.get('stof_source') or '-'):>8} "
              f"{fmt(r.get('compile_first_s'), '13.2f')} "
              f"{fmt(r.get('hf_eager_ms'), '11.3f')} {fmt(r.get('hf_sdpa_ms'), '10.3f')}"
              f"{flag}")
    print("graph = the eager stack captured in a CUDA graph, replayed; "
          "x best = the fastest peer (eager, graph, compile, hf eager, hf sdpa) / "
          "stof (whole stack, median; a peer whose output fails the check is "
          "left out); x list = the same without graph (the "
          "peers the Hopper-GEMM issue names; torch.compile in the modes "
          "--compile-mode names, none captured in a CUDA graph); "
          f"stof err = |stof - eager| / |eager|, FAIL above {FAIL_REL_ERR:g}")
    clk = [r for r in results if any(r.get(k) for k in
                                     ("stof_mhz", "eager_mhz", "compile_mhz"))]
    if clk:
        print()
        print("SM clock while each stack was timed, MHz (NVML, median of samples; "
              "back to back, a stack that keeps the GPU at its power limit runs "
              "at a lower clock):")
        print(f"{'model':>10} {'BxS':>8} {'eager':>6} {'compile':>7} {'hf eager':>8} "
              f"{'hf sdpa':>7} {'stof':>6}")
        for r in clk:
            bs = f"{r['batch']}x{r['seq']}"
            print(f"{r['model']:>10} {bs:>8} {fmt(r.get('eager_mhz'), '6.0f')} "
                  f"{fmt(r.get('compile_mhz'), '7.0f')} "
                  f"{fmt(r.get('hf_eager_mhz'), '8.0f')} "
                  f"{fmt(r.get('hf_sdpa_mhz'), '7.0f')} {fmt(r.get('stof_mhz'), '6.0f')}")
    fl = [r for r in results if r.get("floor_ms")]
    if fl:
        print()
        print("Floor of each stack, measured in this run (GEMM FLOPs at the best "
              "rate cuBLAS reaches on the layer's GEMM shapes at 32768 tokens + "
              "attention FLOPs x density at SDPA's dense rate at 16 x 2048 + two "
              "norms a layer at copy bandwidth), ms a stack; stof's fraction of "
              "the floor's speed; cuBLAS = the layer's plain GEMMs at this size, "
              "each shape timed alone:")
        print(f"{'model':>10} {'BxS':>8} {'GEMM TF/s':>9} {'attn TF/s':>9} "
              f"{'TB/s':>5} {'gemm':>7} {'attn':>7} {'norms':>7} {'floor':>7} "
              f"{'cuBLAS':>7} {'stof':>7} {'floor/stof':>10}")
        for r in fl:
            bs = f"{r['batch']}x{r['seq']}"
            print(f"{r['model']:>10} {bs:>8} {r['gemm_peak_tflops']:9.0f} "
                  f"{r['attn_tflops']:9.0f} {r['copy_tbps']:5.2f} "
                  f"{r['floor_gemm_ms']:7.3f} {r['floor_attn_ms']:7.3f} "
                  f"{r['floor_norm_ms']:7.3f} {r['floor_ms']:7.3f} "
                  f"{r['cublas_gemm_ms']:7.3f} {fmt(r.get('stof_ms'), '7.3f')} "
                  f"{fmt(r['floor_ms'] / r['stof_ms'] if r.get('stof_ms') else None, '10.2f')}")
    bd = [r for r in results if r.get("bound_ms")]
    if bd:
        print()
        print("Bound with the vendor's GEMMs (--bound), ms a stack: cuBLAS = "
              "the stack's GEMMs alone through cuBLAS, plain, chained and "
              "replayed as one CUDA graph; attn = stof's attention kernels in "
              "its stack (torch.profiler); bound = their sum (timed apart, an "
              "estimate), about what a stack with GEMMs at cuBLAS's speed and "
              "stof's attention takes with every bias, activation, residual "
              "and norm free; x bound = the best peer over it, about the "
              "highest ratio such a stack could reach:")
        print(f"{'model':>10} {'BxS':>8} {'cuBLAS':>8} {'attn':>7} {'bound':>8} "
              f"{'stof':>8} {'bound/stof':>10} {'x best':>7} {'x bound':>7}")
        for r in bd:
            bs = f"{r['batch']}x{r['seq']}"
            print(f"{r['model']:>10} {bs:>8} {r['cublas_stack_ms']:8.3f} "
                  f"{r['stof_attn_ms']:7.3f} {r['bound_ms']:8.3f} "
                  f"{fmt(r.get('stof_ms'), '8.3f')} "
                  f"{fmt(r['bound_ms'] / r['stof_ms'] if r.get('stof_ms') else None, '10.2f')} "
                  f"{fmt(r.get('speedup'), '7.2f')} "
                  f"{fmt(r.get('bound_speedup'), '7.2f')}")
    en = [r for r in results if r.get("stof_j") is not None]
    if en:
        print()
        print("Sustained (--energy: each stack back to back for seconds): ms a "
              "stack / J a stack (NVML board energy) / mean W; x best = the "
              "best peer's sustained time over stof's, and its energy over "
              "stof's:")
        sysn = ("eager", "compile", "hf_eager", "hf_sdpa", "stof")
        print(f"{'model':>10} {'BxS':>8} " + " ".join(f"{k:>20}" for k in sysn) +
              f" {'x best':>7} {'x J':>6}")
        for r in en:
            bs = f"{r['batch']}x{r['seq']}"
            cells = []
            for k in sysn:
                if r.get(k + "_j") is None:
                    cells.append(f"{'-':>20}")
                else:
                    cells.append(f"{r[k + '_sus_ms']:7.2f}/{r[k + '_j']:6.3f}/"
                                 f"{r[k + '_w']:5.0f}")
            peers = [k for k in sysn[:-1] if r.get(k + "_sus_ms")]
            best = min(peers, key=lambda k: r[k + "_sus_ms"]) if peers else None
            xs = (f"{r[best + '_sus_ms'] / r['stof_sus_ms']:7.2f} "
                  f"{r[best + '_j'] / r['stof_j']:6.2f}") if best else ""
            print(f"{r['model']:>10} {bs:>8} " + " ".join(cells) + " " + xs)
    multi = [r for r in results if len(r.get("compile_modes", {})) > 1]
    if multi:
        print()
        print("torch.compile per mode, ms (first call s):")
        for r in multi:
            bs = f"{r['batch']}x{r['seq']}"
            modes = "  ".join(f"{k} {v['ms']:.3f} ({v['first_s']:.1f})"
                              for k, v in r["compile_modes"].items())
            print(f"{r['model']:>10} {bs:>8}  {modes}")
    errkeys = ("stof_error", "eager_graph_error", "compile_error", "hf_error",
               "bound_error")
    errs = [r for r in results if any(k in r for k in errkeys)]
    if errs:
        print()
        for r in errs:
            for k in errkeys:
                if k in r:
                    print(f"{r['model']} {r['batch']}x{r['seq']} {k}: {r[k]}")
    schemes = [r for r in results if "stof_scheme" in r]
    if schemes:
        print()
        print("stof fusion schemes:")
        for r in schemes:
            print(f"{r['model']} {r['batch']}x{r['seq']}: {json.dumps(r['stof_scheme'])}")
    acc = [r for r in results if "eager_err_fp32" in r]
    if acc:
        print()
        print("error against the fp32 eager stack (|out - ref32| / |ref32|):")
        print(f"{'model':>10} {'BxS':>8} {'eager':>9} {'compile':>9} {'stof':>9} "
              f"{'stof 1 layer':>12} {'stof no graph':>13}")
        for r in acc:
            bs = f"{r['batch']}x{r['seq']}"
            print(f"{r['model']:>10} {bs:>8} {fmt(r.get('eager_err_fp32'), '9.1e')} "
                  f"{fmt(r.get('compile_err_fp32'), '9.1e')} "
                  f"{fmt(r.get('stof_err_fp32'), '9.1e')} "
                  f"{fmt(r.get('stof_layer1_err'), '12.1e')} "
                  f"{fmt(r.get('stof_nograph_err'), '13.1e')}")
        print("(stof 1 layer and stof no graph are against eager fp16)")
    hf = [r for r in results if "hf_eager_err" in r or "hf_sdpa_err" in r]
    if hf:
        # A large error here means the weights went to the wrong HF parameters
        # (or the mask was not applied): the HF times would then not be of
        # the same work, so the rows are marked.
        print()
        print("Hugging Face layers against the eager stack (|hf - eager| / |eager|) "
              "and the fp32 one:")
        print(f"{'model':>10} {'BxS':>8} {'hf eager':>9} {'hf sdpa':>9} "
              f"{'eager fp32':>10} {'sdpa fp32':>10}")
        for r in hf:
            bs = f"{r['batch']}x{r['seq']}"
            bad = [r.get(k) for k in ("hf_eager_err", "hf_sdpa_err")
                   if r.get(k) is not None and not r[k] <= FAIL_REL_ERR]
            print(f"{r['model']:>10} {bs:>8} {fmt(r.get('hf_eager_err'), '9.1e')} "
                  f"{fmt(r.get('hf_sdpa_err'), '9.1e')} "
                  f"{fmt(r.get('hf_eager_err_fp32'), '10.1e')} "
                  f"{fmt(r.get('hf_sdpa_err_fp32'), '10.1e')}"
                  f"{' MISMATCH' if bad else ''}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=DEFAULT_MODELS,
                    help="comma-separated, from %s (default: %%(default)s)"
                    % ", ".join(MODELS))
    ap.add_argument("--sizes", default=SIZES, help="comma-separated BATCHxSEQ "
                    "(default: %(default)s)")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--act", default="tanh", choices=["tanh", "erf"],
                    help="GELU: tanh approximation (the protocol) or exact erf")
    ap.add_argument("--eps", type=float, default=1e-5,
                    help="LayerNorm eps (llama and qwen3 keep their RMSNorm "
                    "eps, 1e-5 and 1e-6)")
    ap.add_argument("--reps", type=int, default=20, help="timed runs (median)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed runs first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--hf", action="store_true",
                    help="also time Hugging Face transformers' own layers (eager and "
                    "sdpa attention) with the same weights")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile mode, or several comma-separated, each "
                    "timed (default, max-autotune-no-cudagraphs, ...); the "
                    "fastest is the compile peer")
    ap.add_argument("--no-eager-graph", action="store_true",
                    help="skip the eager stack captured in a CUDA graph")
    ap.add_argument("--compile-scope", default="layer,stack",
                    help="what torch.compile compiles: 'layer' (one layer, "
                    "called once a layer), 'stack' (the whole stack as one "
                    "function, as torch.compile(model) does), or both "
                    "comma-separated (default; the faster is the peer)")
    ap.add_argument("--compile-stack", action="store_true",
                    help="the same as --compile-scope stack")
    ap.add_argument("--peers-only", action="store_true",
                    help="only PyTorch (stof still builds the mask)")
    ap.add_argument("--no-fp32-ref", action="store_true",
                    help="skip the fp32 eager reference")
    ap.add_argument("--no-graph-compare", action="store_true",
                    help="skip timing stof's stack without the CUDA graph")
    ap.add_argument("--profile", action="store_true",
                    help="print stof's kernels of one stack (torch.profiler; "
                    "with --bound also the cuBLAS GEMM chain's)")
    ap.add_argument("--warm-plan", action="store_true",
                    help="also time a second (database-hit) plan")
    ap.add_argument("--user-db", default=os.environ.get("STOF_USER_DB"),
                    help="tuning database (default: $STOF_USER_DB, else a new "
                    "temporary file, so plans are cold)")
    ap.add_argument("--tuning-mode", default="default",
                    choices=["default", "cache-only", "force"])
    ap.add_argument("--energy", type=float, default=0.0, metavar="SECONDS",
                    help="also run each stack back to back for about SECONDS "
                         "and report its sustained time, the board's energy a "
                         "stack (NVML) and mean power")
    ap.add_argument("--no-floor", action="store_true",
                    help="skip measuring each stack's floor (cuBLAS GEMMs, "
                         "SDPA's dense rate, copy bandwidth)")
    ap.add_argument("--bound", action="store_true",
                    help="estimate each stack's bound with the vendor's GEMMs: "
                         "the stack's GEMMs through cuBLAS in one CUDA graph + "
                         "stof's attention kernels (profiles stof's stack with "
                         "torch.profiler)")
    ap.add_argument("--json", help="write all results to this file")
    ap.add_argument("--verbose", action="store_true", help="tracebacks of failures")
    args = ap.parse_args()

    if args.compile_stack:
        args.compile_scope = "stack"
    scopes = [v.strip() for v in args.compile_scope.split(",")]
    if not scopes or any(v not in ("layer", "stack") for v in scopes):
        ap.error("bad --compile-scope %r (layer, stack or both)" %
                 args.compile_scope)
    args.compile_scope = ",".join(dict.fromkeys(scopes))
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            ap.error("unknown model %r (known: %s)" % (m, ", ".join(MODELS)))
    sizes = []
    for s in args.sizes.split(","):
        try:
            b, n = (int(v) for v in s.lower().split("x"))
        except ValueError:
            ap.error("bad size %r (BATCHxSEQ)" % s)
        sizes.append((b, n))

    if not args.no_compile:
        # Each (model, size) brings a new mask_mod and shapes: leave room
        # for the recompiles, else dynamo falls back to eager silently.
        torch._dynamo.config.cache_size_limit = 1024
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 1024
        if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
            torch._dynamo.config.accumulated_cache_size_limit = 4096

    user_db = args.user_db
    if user_db is None:
        user_db = os.path.join(tempfile.mkdtemp(prefix="stof-bench-layers-"), "tuning.db")
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    ctx = stof.Context(user_db=user_db, tuning_mode=args.tuning_mode)
    dev = ctx.device()
    notes = [n for m, n in (("llama", "llama: SwiGLU, RoPE"),
                            ("qwen3", "qwen3: SwiGLU, RoPE, QK norm"))
             if m in models]
    print(f"# {dev.get('name')}, torch {torch.__version__}, "
          f"stof {stof._load().stof_version_string().decode()}, db {user_db}, "
          f"mask {MASK_SPEC}, {args.dtype}, gelu_{args.act}"
          f"{' (%s)' % '; '.join(notes) if notes else ''}, reps {args.reps}",
          flush=True)

    results = []
    with torch.no_grad():
        for mi, m in enumerate(models):
            for (b, n) in sizes:
                cfg = Cfg(m, b, n, args.act, args.eps)
                try:
                    r = bench_case(args, ctx, cfg, dtype, args.seed + 1000 * mi)
                except Exception as e:  # e.g. out of memory in a peer
                    r = {"model": m, "batch": b, "seq": n, "error": short(e)}
                    print(f"# {m} {b}x{n}: failed: {short(e)}", file=sys.stderr,
                          flush=True)
                    if args.verbose:
                        traceback.print_exc()
                results.append(r)
                line = {k: v for k, v in r.items()
                        if k not in ("stof_describe", "stof_profile",
                                     "cublas_profile")}
                print(json.dumps(line), file=sys.stderr, flush=True)
                torch.cuda.synchronize()
                if not args.no_compile:
                    torch._dynamo.reset()  # drop the compiled code of this case
                torch.cuda.empty_cache()
    print_table([r for r in results if "error" not in r])
    print_profiles(results)
    for r in results:
        if "error" in r:
            print(f"{r['model']} {r['batch']}x{r['seq']}: failed: {r['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    bad = [r for r in results if "error" in r or
           (not args.peers_only and not r.get("stof_ok", False))]
    if bad:
        print(f"{len(bad)} case(s) failed or did not pass the {FAIL_REL_ERR:g} check",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
