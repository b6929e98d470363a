"""stof-tune hf-workload and stof.integrations.hf_layers read a Hugging Face
config.json the same way: for each configuration below (published ones and
edge cases), the workload's layer line and mask name the same descriptor
fields (the database key's) as layer_kwargs and mask_spec give layer_plan,
after the same conversions (eps and the RoPE base as C floats, kv_heads
equal to heads as none). Scaled rope types need transformers for
layer_kwargs (rope_args): those configurations are compared on their
"rope=table" alone where it is missing. No GPU, no torch needed."""
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "python"))
from stof.integrations import hf_layers  # noqa: E402

TUNE = os.environ.get("STOF_TUNE", "stof-tune")

CONFIGS = {
    "llama2": {"model_type": "llama", "hidden_act": "silu", "hidden_size": 4096,
               "intermediate_size": 11008, "num_attention_heads": 32,
               "num_hidden_layers": 32, "num_key_value_heads": 32,
               "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
               "attention_bias": False, "mlp_bias": False},
    "llama31": {"model_type": "llama", "hidden_act": "silu", "hidden_size": 4096,
                "intermediate_size": 14336, "num_attention_heads": 32,
                "num_hidden_layers": 32, "num_key_value_heads": 8,
                "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
                "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192,
                                 "rope_type": "llama3"}},
    "qwen2.5": {"model_type": "qwen2", "hidden_act": "silu", "hidden_size": 3584,
                "intermediate_size": 18944, "num_attention_heads": 28,
                "num_hidden_layers": 28, "num_key_value_heads": 4,
                "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                "sliding_window": 131072, "use_sliding_window": False,
                "max_window_layers": 28},
    "qwen3-0.6b": {"model_type": "qwen3", "hidden_act": "silu", "hidden_size": 1024,
                   "intermediate_size": 3072, "num_attention_heads": 16,
                   "num_hidden_layers": 28, "num_key_value_heads": 8,
                   "head_dim": 128, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
                   "attention_bias": False, "sliding_window": None,
                   "use_sliding_window": False},
    "qwen3-1.7b": {"model_type": "qwen3", "hidden_act": "silu", "hidden_size": 2048,
                   "intermediate_size": 6144, "num_attention_heads": 16,
                   "num_hidden_layers": 28, "num_key_value_heads": 8,
                   "head_dim": 128, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
                   "attention_bias": True},
    "mistral": {"model_type": "mistral", "hidden_act": "silu", "hidden_size": 4096,
                "intermediate_size": 14336, "num_attention_heads": 32,
                "num_hidden_layers": 32, "num_key_value_heads": 8,
                "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
                "sliding_window": 4096, "attention_bias": True},
    "qwen2-sliding": {"model_type": "qwen2", "hidden_act": "swish",
                      "hidden_size": 256, "intermediate_size": 512,
                      "num_attention_heads": 4, "num_hidden_layers": 4,
                      "num_key_value_heads": 2, "rms_norm_eps": 3e-07,
                      "rope_parameters": {"rope_type": "default",
                                          "rope_theta": 12345.678,
                                          "partial_rotary_factor": 0.5},
                      "sliding_window": 64, "use_sliding_window": True,
                      "max_window_layers": 0},
    # (a window in layer_types but not use_sliding_window: none; Qwen2's
    # default max_window_layers, 28, over 28 layers: none either)
    "qwen2-types-only": {"model_type": "qwen2", "hidden_act": "silu",
                         "hidden_size": 256, "intermediate_size": 512,
                         "num_attention_heads": 4, "num_hidden_layers": 2,
                         "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
                         "rope_theta": 1e6, "sliding_window": 64,
                         "layer_types": ["sliding_attention"] * 2},
    "qwen2-mwl-default": {"model_type": "qwen2", "hidden_act": "silu",
                          "hidden_size": 256, "intermediate_size": 512,
                          "num_attention_heads": 4, "num_hidden_layers": 28,
                          "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
                          "rope_theta": 1e6, "sliding_window": 64,
                          "use_sliding_window": True},
}


def c_float(v):
    return ctypes.c_float(v).value


def workload(cfg):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
    try:
        out = subprocess.run([TUNE, "hf-workload", f.name], capture_output=True,
                             text=True)
    finally:
        os.unlink(f.name)
    assert out.returncode == 0, out.stderr
    lines = [l for l in out.stdout.splitlines() if l and not l.startswith("#")]
    mask = [l.split(None, 1)[1] for l in lines if l.startswith("mask ")]
    layer = [l.split()[2:] for l in lines if l.startswith("layer ")]
    assert len(mask) == 1 and len(layer) == 1, out.stdout
    fields = {}
    for tok in layer[0]:
        k, _, v = tok.partition("=")
        fields[k] = v if _ else True
    return mask[0], fields


def config_of(cfg):
    """transformers' own configuration of cfg where transformers is here
    (its rope functions want one), else the plain attributes."""
    try:
        import transformers
    except ImportError:
        return SimpleNamespace(**cfg)
    rest = {k: v for k, v in cfg.items() if k != "model_type"}
    return transformers.AutoConfig.for_model(cfg["model_type"], **rest)


def main():
    try:
        subprocess.run([TUNE, "--version"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print("skip: no stof-tune (%s)" % e)
        sys.exit(77)
    for name, cfg in CONFIGS.items():
        spec, w = workload(cfg)
        ns = config_of(cfg)
        assert spec == hf_layers.mask_spec(ns), (name, spec)
        scaled = "rope_scaling" in cfg and cfg["rope_scaling"]
        try:
            kw = hf_layers.layer_kwargs(ns, 128)
        except ImportError:
            assert scaled and w["rope"] == "table", (name, w)
            print("%s: mask %s, rope=table (transformers is not here to "
                  "compare the rest)" % (name, spec))
            continue
        heads = kw["heads"]
        want = {
            "hidden": kw["hidden"], "heads": heads, "ffn": kw["ffn"],
            "kv_heads": kw["kv_heads"] if kw["kv_heads"] != heads else None,
            "no_bias": not kw["bias"], "qk_norm": kw["qk_norm"],
            "head_dim": kw.get("head_dim"),
            "eps": c_float(kw["eps"]),
            "rope": "table" if "rope_freq" in kw else c_float(kw["rope_theta"]),
        }
        got = {
            "hidden": int(w["hidden"]), "heads": int(w["heads"]),
            "ffn": int(w["ffn"]),
            "kv_heads": int(w["kv_heads"]) if "kv_heads" in w else None,
            "no_bias": "no_bias" in w, "qk_norm": "qk_norm" in w,
            "head_dim": int(w["head_dim"]) if "head_dim" in w else None,
            "eps": c_float(float(w["eps"])),
            "rope": w["rope"] if w["rope"] == "table" else c_float(float(w["rope"])),
        }
        assert got == want, (name, got, want)
        assert w["act"] == "silu" and w["norm"] == "rms" and "pre" in w and \
            "gated" in w and "rope_dim" not in w, (name, w)
        assert kw["rope_dim"] == 0, (name, kw)
        print("%s: the same layer (mask %s)" % (name, spec))
    print("ok")


if __name__ == "__main__":
    main()
