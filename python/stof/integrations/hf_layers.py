"""stof's fused layers from Hugging Face decoder layers of the Llama family
(model types llama, mistral, qwen2, qwen3): the arguments of
Context.layer_plan from a model's configuration, and each layer's weights
in the layout stof_layer_weights wants.

    import torch, stof
    from stof.integrations import hf_layers
    cfg = model.config
    ctx = stof.Context()
    mask = ctx.mask(hf_layers.mask_spec(cfg), seq, seq)
    L = ctx.layer_plan(batch, seq, dtype=torch.float16, mask=mask,
                       **hf_layers.layer_kwargs(cfg, seq))
    ws = [hf_layers.layer_weights(layer, cfg) for layer in model.model.layers]
    L.stack_run(ws, x, y)   # x, y: (batch, seq, hidden) hidden states

What stof then computes is what the model's decoder layers compute on
hidden states with positions 0..seq-1 in every sequence (no KV cache):
pre-norm RMSNorm, grouped-query attention with the model's rotary
embedding (any rope type rope_args knows: default, llama3, yarn, longrope,
dynamic, linear), Qwen3's per-head QK norm, SwiGLU. Projection biases
(Qwen2's on Q, K and V) are kept; those a model lacks while others have
them are zeros. The mask is the caller's: mask_spec says which spec the
configuration implies ("causal", or "causal_sliding:W" where a sliding
window applies to every layer). Other model types raise ValueError."""
from stof import qkv_weight, rope_args

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


def _model_type(config):
    mt = getattr(config, "model_type", None)
    if mt not in SUPPORTED:
        raise ValueError("hf_layers: model type %r is not one of %s (their "
                         "decoder layers are what stof's layer computes)"
                         % (mt, ", ".join(SUPPORTED)))
    return mt


def _has_biases(mt, config):
    """Whether the model type's layers have projection biases at all (those
    they lack while others have them are zeros in layer_weights): Qwen2's
    on Q, K and V; Llama's and Qwen3's as attention_bias (and Llama's
    mlp_bias) say; Mistral's never."""
    if mt == "qwen2":
        return True
    if mt == "mistral":
        return False
    return bool(getattr(config, "attention_bias", False)) or (
        mt == "llama" and bool(getattr(config, "mlp_bias", False)))


def layer_kwargs(config, seq):
    """Context.layer_plan's keyword arguments for a decoder layer of this
    configuration at sequences of `seq` tokens (all but batch, seq, dtype
    and mask): sizes, grouped-query heads, head_dim where heads * head_dim
    is not hidden, RMSNorm pre-norm with the model's eps, SwiGLU, biases,
    RoPE (rope_args) and Qwen3's QK norm."""
    mt = _model_type(config)
    act = getattr(config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError("hf_layers: hidden_act %r (stof's gated FFN here is "
                         "SwiGLU: silu)" % (act,))
    eps = float(config.rms_norm_eps)
    if not eps > 0.0:
        raise ValueError("hf_layers: rms_norm_eps %r (stof takes 0 as 1e-5)"
                         % (eps,))
    hidden, heads = config.hidden_size, config.num_attention_heads
    hd = getattr(config, "head_dim", None) or hidden // heads
    kw = dict(hidden=hidden, heads=heads, ffn=config.intermediate_size,
              act="silu", norm="rms", pre_norm=True, eps=eps,
              kv_heads=getattr(config, "num_key_value_heads", None) or heads,
              gated=True, bias=_has_biases(mt, config), qk_norm=mt == "qwen3")
    if hd * heads != hidden:
        kw["head_dim"] = hd
    rope = rope_args(config, seq)
    # These models rotate whole heads: their default rope type ignores a
    # partial_rotary_factor, and their rotation of a scaled type cannot
    # apply one.
    if rope.get("rope_dim"):
        if "rope_theta" not in rope:
            raise ValueError("hf_layers: a partial_rotary_factor with a "
                             "scaled rope type (these models rotate whole "
                             "heads)")
        rope["rope_dim"] = 0
    kw.update(rope)
    return kw


def mask_spec(config):
    """The stof mask spec of the configuration's attention: "causal", or
    "causal_sliding:W" when a sliding window of W keys (the query's own
    included, as transformers counts it) applies to every layer: Mistral's
    sliding_window; Qwen2's and Qwen3's only with use_sliding_window, on
    the layers layer_types names "sliding_attention" (else those from
    max_window_layers on). Llama has none. A window on some layers only
    raises ValueError (plan those layers apart)."""
    mt = _model_type(config)
    w = getattr(config, "sliding_window", None)
    if mt == "llama" or not w:
        return "causal"
    if mt == "mistral":
        return "causal_sliding:%d" % int(w)
    if not getattr(config, "use_sliding_window", False):
        return "causal"
    types = getattr(config, "layer_types", None)
    if types is None:  # (transformers 4: max_window_layers decides)
        n = config.num_hidden_layers
        first = getattr(config, "max_window_layers", 28)
        types = ["full_attention" if i < first else "sliding_attention"
                 for i in range(n)]
    kinds = set(types)
    if kinds == {"full_attention"}:
        return "causal"
    if kinds == {"sliding_attention"}:
        return "causal_sliding:%d" % int(w)
    raise ValueError("hf_layers: a sliding window on some layers only "
                     "(layer_types %s)" % sorted(kinds))


def layer_weights(layer, config):
    """One decoder layer's weights (a transformers LlamaDecoderLayer,
    MistralDecoderLayer, Qwen2DecoderLayer or Qwen3DecoderLayer) as the
    dict Layer.run and Layer.stack_run take, in the layer's dtype (plan
    the stof layer in it): w_qkv stacks q_proj, k_proj and v_proj (with
    Qwen3's q_norm and k_norm weights after them), w_ffn1 gate_proj and
    up_proj. New tensors where stacked, the layer's own otherwise."""
    import torch
    any_bias = _has_biases(_model_type(config), config)
    a, m = layer.self_attn, layer.mlp
    linears = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj,
               m.up_proj, m.down_proj)
    if not any_bias and any(lin.bias is not None for lin in linears):
        raise ValueError("hf_layers: the layer has projection biases its "
                         "configuration does not say")
    q, k, v = a.q_proj, a.k_proj, a.v_proj
    qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
    w = {"w_qkv": qkv_weight(q.weight, k.weight, v.weight,
                             qn.weight if qn is not None else None,
                             kn.weight if kn is not None else None),
         "w_o": a.o_proj.weight,
         "w_ffn1": torch.cat([m.gate_proj.weight, m.up_proj.weight]),
         "w_ffn2": m.down_proj.weight,
         "norm1_gamma": layer.input_layernorm.weight,
         "norm2_gamma": layer.post_attention_layernorm.weight}
    if any_bias:
        def b(lin):
            if lin.bias is not None:
                return lin.bias
            return torch.zeros(lin.out_features, dtype=lin.weight.dtype,
                               device=lin.weight.device)
        w["b_qkv"] = torch.cat([b(q), b(k), b(v)])
        w["b_o"] = b(a.o_proj)
        w["b_ffn1"] = torch.cat([b(m.gate_proj), b(m.up_proj)])
        w["b_ffn2"] = b(m.down_proj)
    return {name: t.detach().contiguous() for name, t in w.items()}
