"""attn_implementation="stof" in Hugging Face transformers
(stof.integrations.transformers), on real model classes built from
configurations with random weights (fp16, eval): a BERT-base encoder on a
padded batch of mixed lengths and on full sequences, a left-padded
Llama-style decoder, and a Mistral-style
decoder with grouped-query attention and a sliding window. Outputs against
the same model with attn_implementation="sdpa" (same seed, same weights);
forward times of stof, sdpa and flex_attention printed (--bench times more
sizes). Skips (exit 77) without PyTorch, transformers or a GPU."""
import copy
import statistics
import sys

from gpu_test import require

(transformers,) = require("transformers")
import torch  # noqa: E402
from transformers import AutoConfig, AutoModel  # noqa: E402
import stof  # noqa: E402
import stof.integrations.transformers  # noqa: E402,F401  (registers "stof")

DEV = "cuda"


def build(cfg, impl):
    torch.manual_seed(0)
    # A copy each: models keep their config, and the implementation is set
    # on it (a shared config would switch every model to the last one's).
    m = AutoModel.from_config(copy.deepcopy(cfg), attn_implementation=impl)
    if m.config._attn_implementation != impl:
        raise RuntimeError(f"asked for {impl}, got {m.config._attn_implementation}")
    return m.half().to(DEV).eval()


def fwd_ms(model, kw, reps=10):
    with torch.no_grad():
        for _ in range(3):
            model(**kw)
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            model(**kw)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
    return statistics.median(times)


def compare(name, cfg, kw, valid, impls=("sdpa", "flex_attention"), tol=2e-2):
    """Outputs of stof against sdpa on the valid (unpadded) positions, and
    the forward times of stof and each peer."""
    models = {"stof": build(cfg, "stof")}
    for impl in impls:
        try:
            models[impl] = build(cfg, impl)
        except Exception as e:  # a peer this model class does not support
            print(f"  ({impl} unavailable for {name}: {type(e).__name__}: {e})")
    calls = stof.integrations.transformers.calls
    with torch.no_grad():
        outs = {}
        for k, m in models.items():
            before = calls[0]
            outs[k] = m(**kw).last_hidden_state
            # stof's forward ran exactly for the stof model, once per layer.
            ran = calls[0] - before
            layers = m.config.num_hidden_layers
            if ran != (layers if k == "stof" else 0):
                print(f"FAIL: {name}: the {k} model called stof's attention "
                      f"{ran} times ({layers} layers)")
                sys.exit(1)
    ref = outs["sdpa"].float()[valid]
    err = ((outs["stof"].float()[valid] - ref).norm() / ref.norm()).item()
    times = {k: fwd_ms(m, kw) for k, m in models.items()}
    peers = " ".join(f"{k} {t:.3f} ms ({t / times['stof']:.2f}x)"
                     for k, t in times.items() if k != "stof")
    print(f"{name}: rel err vs sdpa {err:.2e}; stof {times['stof']:.3f} ms; "
          f"{peers}")
    if not err < tol:
        print(f"FAIL: {name}: stof differs from sdpa by {err:.2e} (>= {tol})")
        sys.exit(1)
    del models
    torch.cuda.empty_cache()
    return err, times


def main():
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    bench = "--bench" in sys.argv
    bert = AutoConfig.for_model("bert", hidden_size=768, num_hidden_layers=12,
                                num_attention_heads=12, intermediate_size=3072,
                                hidden_act="gelu", max_position_embeddings=4096,
                                vocab_size=30522)
    g = torch.Generator().manual_seed(1)
    sizes = [(8, 512)] + ([(16, 2048), (1, 4096)] if bench else [])
    for b, s in sizes:
        ids = torch.randint(0, 30522, (b, s), generator=g).to(DEV)
        # Mixed lengths: sequence i keeps s - i * s / (2 b) tokens.
        lens = [s - (i * s) // (2 * b) for i in range(b)]
        am = torch.zeros(b, s, dtype=torch.long)
        for i, n in enumerate(lens):
            am[i, :n] = 1
        am = am.to(DEV)
        compare(f"BERT-base {b}x{s} padded (lengths {lens[-1]}..{s})", bert,
                {"input_ids": ids, "attention_mask": am}, am.bool())
        compare(f"BERT-base {b}x{s} full", bert, {"input_ids": ids},
                torch.ones(b, s, dtype=torch.bool, device=DEV))

    mistral = AutoConfig.for_model("mistral", hidden_size=1024,
                                   num_hidden_layers=8, num_attention_heads=16,
                                   num_key_value_heads=4, intermediate_size=2816,
                                   sliding_window=256, vocab_size=32000,
                                   max_position_embeddings=8192)
    for b, s in [(2, 2048)] + ([(1, 8192)] if bench else []):
        ids = torch.randint(0, 32000, (b, s), generator=g).to(DEV)
        compare(f"Mistral-style decoder {b}x{s} (GQA 16/4, sliding window 256)",
                mistral, {"input_ids": ids},
                torch.ones(b, s, dtype=torch.bool, device=DEV))
    # Left padding (batched generation's prefill): a Llama-style decoder,
    # sequences padded at the start; compared on the valid positions.
    llama = AutoConfig.for_model("llama", hidden_size=1024, num_hidden_layers=4,
                                 num_attention_heads=16, num_key_value_heads=4,
                                 intermediate_size=2816, vocab_size=32000,
                                 max_position_embeddings=4096)
    b, s = 4, 1024
    ids = torch.randint(0, 32000, (b, s), generator=g).to(DEV)
    lens = [s, s - 100, s // 2, 37]
    am = torch.zeros(b, s, dtype=torch.long)
    for i, n in enumerate(lens):
        am[i, s - n:] = 1
    am = am.to(DEV)
    compare(f"Llama-style decoder {b}x{s} left-padded (lengths {lens[-1]}..{s})",
            llama, {"input_ids": ids, "attention_mask": am}, am.bool())
    path = stof.integrations.transformers._last["plan"]
    print(f"  stof's path for the left-padded mask: "
          f"{path[0] if path else None}")
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
