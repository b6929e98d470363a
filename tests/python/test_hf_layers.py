"""stof.integrations.hf_layers: stof's layer stack planned and loaded from a
Hugging Face model against that model's own decoder layers.

For four small models built from configurations (random weights, norms'
weights and biases perturbed so that they matter): Qwen2 (biases on Q, K
and V only), Qwen3 (the QK norm, heads of 128 over a hidden of 256:
head_dim), Llama with Llama 3.1's rope scaling and Mistral with a sliding
window of 32 (mask_spec's causal_sliding:32), two layers each, the model's
own forward on input embeddings in fp32 (its masks, positions and rotary
embedding; the output of its last layer, taken before the final norm) is
the reference; stof's fp16 stack (layer_plan(**layer_kwargs(config,
seq)), mask_spec's mask, layer_weights of each layer) must be about as
close to it as the same model run in fp16 is.

Exit status 77 (skipped) without torch, transformers or a GPU."""
from gpu_test import require

require("transformers")
import torch  # noqa: E402
import transformers  # noqa: E402
import stof  # noqa: E402
from stof.integrations import hf_layers  # noqa: E402

B, S, HID, HEADS, KV, FFN, LAYERS = 2, 128, 256, 4, 2, 512, 2
DEVICE = "cuda"


def rel(a, b):
    a, b = a.float(), b.float()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).norm() / b.norm()).item()


def config(kind):
    common = dict(hidden_size=HID, intermediate_size=FFN,
                  num_attention_heads=HEADS, num_key_value_heads=KV,
                  num_hidden_layers=LAYERS, rms_norm_eps=1e-6,
                  max_position_embeddings=4 * S, initializer_range=0.08,
                  vocab_size=64)
    v5 = int(transformers.__version__.split(".")[0]) >= 5
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(rope_theta=1e6, **common)
    elif kind == "mistral":
        cfg = transformers.MistralConfig(sliding_window=32, rope_theta=1e6,
                                         **common)
    elif kind == "qwen3":
        cfg = transformers.Qwen3Config(head_dim=128, rope_theta=1e6, **common)
    else:
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
        if v5:
            common["rope_parameters"] = dict(scaling, rope_theta=500000.0)
        else:
            common.update(rope_theta=500000.0, rope_scaling=scaling)
        cfg = transformers.LlamaConfig(**common)
    cfg._attn_implementation = "eager"
    return cfg


def model_of(cfg):
    cls = {"qwen2": transformers.Qwen2Model, "qwen3": transformers.Qwen3Model,
           "llama": transformers.LlamaModel,
           "mistral": transformers.MistralModel}[cfg.model_type]
    torch.manual_seed(5)
    model = cls(cfg).to(DEVICE).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.2)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.2)
    return model


def hf_run(model, x, dt):
    """The model's forward on input embeddings x in dt: the input of its
    final norm (the last decoder layer's output)."""
    model = model.to(dt)
    seen = []
    hook = model.norm.register_forward_hook(
        lambda mod, inp, out: seen.append(inp[0]))
    with torch.no_grad():
        model(inputs_embeds=x.to(dt))
    hook.remove()
    return seen[0]


def main():
    ctx = stof.Context()
    for kind in ("qwen2", "qwen3", "llama", "mistral"):
        cfg = config(kind)
        kw = hf_layers.layer_kwargs(cfg, S)
        spec = hf_layers.mask_spec(cfg)
        assert spec == ("causal_sliding:32" if kind == "mistral" else "causal"), spec
        model = model_of(cfg)
        x = torch.randn(B, S, HID, device=DEVICE)
        ref = hf_run(model, x, torch.float32)
        hf16 = hf_run(model, x, torch.float16)
        model = model.half()  # (the weights stof takes: fp16)
        ws = [hf_layers.layer_weights(layer, cfg) for layer in model.layers]
        L = ctx.layer_plan(B, S, dtype=torch.float16, mask=ctx.mask(spec, S, S),
                           **kw)
        y = torch.full((B, S, HID), float("nan"), device=DEVICE,
                       dtype=torch.float16)
        L.stack_run(ws, x.half(), y)
        torch.cuda.synchronize()
        d = L.describe()["desc"]
        L.close()
        e, e16 = rel(y, ref), rel(hf16, ref)
        print("%s (%s): stof fp16 vs the model's layers in fp32 %.3g (in "
              "fp16: %.3g); plan %s" % (kind, ", ".join(
                  "%s=%s" % (k, v) for k, v in sorted(kw.items())
                  if k not in ("rope_freq",)), e, e16,
                  {k: d[k] for k in ("biases", "qk_norm", "head_dim", "rope")}))
        assert e < max(5 * e16, 5e-3), (kind, e, e16)
    print("ok")


if __name__ == "__main__":
    main()
