"""The start of the Python GPU tests: the modules they need and a CUDA GPU,
or exit 77 (meson's skip) saying what is missing; then the source tree's
python/ first on sys.path, so that `import stof` is this tree's."""
import importlib
import os
import sys


def require(*modules):
    """Import `modules` (PyTorch first) or skip; skip without a CUDA GPU.
    Returns the imported modules, in order."""
    got = []
    for name in ("torch",) + modules:
        try:
            got.append(importlib.import_module(name))
        except ImportError as e:
            print(f"skip: {name} is not available ({e})")
            sys.exit(77)
    if not got[0].cuda.is_available():
        print("skip: no CUDA GPU")
        sys.exit(77)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "..", "python"))
    return got[1:]


def load_llama_layer(layer, f, hidden, kv_dim, ffn):
    """Copy stof's Llama-style layer weights f (stof_layer_weights names:
    w_qkv stacks q, k, v; w_ffn1 stacks gate and up) into transformers'
    LlamaDecoderLayer `layer` (no biases). Call under torch.no_grad()."""
    a, m = layer.self_attn, layer.mlp
    a.q_proj.weight.copy_(f["w_qkv"][:hidden])
    a.k_proj.weight.copy_(f["w_qkv"][hidden:hidden + kv_dim])
    a.v_proj.weight.copy_(f["w_qkv"][hidden + kv_dim:])
    a.o_proj.weight.copy_(f["w_o"])
    m.gate_proj.weight.copy_(f["w_ffn1"][:ffn])
    m.up_proj.weight.copy_(f["w_ffn1"][ffn:])
    m.down_proj.weight.copy_(f["w_ffn2"])
    layer.input_layernorm.weight.copy_(f["norm1_gamma"])
    layer.post_attention_layernorm.weight.copy_(f["norm2_gamma"])
