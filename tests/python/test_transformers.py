"""attn_implementation="stof" in Hugging Face transformers
(stof.integrations.transformers), on real model classes built from
configurations with random weights (fp16, eval): a BERT-base encoder on a
padded batch of mixed lengths and on full sequences, a left-padded
Llama-style decoder, and a Mistral-style
decoder with grouped-query attention and a sliding window. Outputs against
the same model with attn_implementation="sdpa" (same seed, same weights);
forward times of stof, sdpa and flex_attention printed (--bench times more
sizes, and each eager forward's GPU time apart from its host issue time:
gpu_times). Skips (exit 77) without PyTorch, transformers or a GPU."""
import contextlib
import copy
import statistics
import sys
import time

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


def interleaved(fns, rounds=5, reps=4):
    """Median ms per call of each function (name -> callable), timed with
    CUDA events in interleaved rounds (the order alternating), so the
    host's and the GPU's drift falls on all alike."""
    times = {k: [] for k in fns}
    keys = list(fns)
    for r in range(rounds):
        for k in (keys if r % 2 == 0 else keys[::-1]):
            for _ in range(reps):
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                fns[k]()
                b.record()
                b.synchronize()
                times[k].append(a.elapsed_time(b))
    return {k: statistics.median(v) for k, v in times.items()}


def eager_times(models, kw):
    """Whole forward passes of each model (after 3 warm-ups), interleaved."""
    with torch.no_grad():
        for m in models.values():
            for _ in range(3):
                m(**kw)
        torch.cuda.synchronize()
        return interleaved({k: (lambda m=m: m(**kw)) for k, m in models.items()})


def gpu_times(models, kw, n=9):
    """Median GPU time (ms, or None) and host issue time (ms) of each
    model's eager forward: each forward is issued while the GPU spins on a
    long kernel, so that its kernels run back to back once the spin ends,
    and events recorded after the spin and after the forward time the
    GPU's work alone. (transformers' eager forwards take about as long to
    issue as to run on slower hosts, so their wall time mixes the two.)
    A forward that waits for the GPU on the host (reading a padding mask,
    say) waits for the spin too: its GPU time is None (not separable)."""
    out = {}
    with torch.no_grad():
        for k, m in models.items():
            host, gpu, waited = [], [], False
            for _ in range(n):
                torch.cuda.synchronize()
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                ev[0].record()
                torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning
                ev[1].record()
                t0 = time.perf_counter()
                m(**kw)
                host.append((time.perf_counter() - t0) * 1e3)
                ev[2].record()
                ev[2].synchronize()
                waited |= host[-1] >= 0.8 * ev[0].elapsed_time(ev[1])
                gpu.append(ev[1].elapsed_time(ev[2]))
            out[k] = (None if waited else statistics.median(gpu),
                      statistics.median(host))
    return out


def graphed(model, kw, impl):
    """The model's forward captured in a CUDA graph (after warm-up
    forwards on a side stream; stof's under capture_safe, so the captured
    forward's plans exist): (graph, static output), or (None, reason)."""
    safe = (stof.integrations.transformers.capture_safe() if impl == "stof"
            else contextlib.nullcontext())
    try:
        with torch.no_grad():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), safe:
                for _ in range(3):
                    model(**kw)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = model(**kw).last_hidden_state
        g.replay()
        torch.cuda.synchronize()
        return g, out
    except Exception as e:  # a peer whose forward cannot be captured
        torch.cuda.synchronize()
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"


def graph_times(graphs):
    """Median ms per replay of each graph, interleaved."""
    return interleaved({k: g.replay for k, g in graphs.items()}, reps=10)


def compare(name, cfg, kw, valid, impls=("sdpa", "flex_attention"), tol=2e-2,
            graphs=False, gpu=False):
    """Outputs of stof against sdpa on the valid (unpadded) positions, and
    the forward times of stof and each peer (graphs: also of each model's
    forward captured in a CUDA graph, and the captured stof forward's
    output against sdpa's; gpu: also the GPU time and host issue time of
    each eager forward, gpu_times)."""
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
    path = stof.integrations.transformers.last["path"]
    times = eager_times(models, kw)
    peers = " ".join(f"{k} {t:.3f} ms ({t / times['stof']:.2f}x)"
                     for k, t in times.items() if k != "stof")
    print(f"{name}: rel err vs sdpa {err:.2e}; stof ({path}) "
          f"{times['stof']:.3f} ms; {peers}")
    if not err < tol:
        print(f"FAIL: {name}: stof differs from sdpa by {err:.2e} (>= {tol})")
        sys.exit(1)
    if gpu:
        gt = gpu_times(models, kw)
        g0 = gt["stof"][0]
        each = " ".join(
            f"{k} n/a" if g is None else f"{k} {g:.3f}" +
            (f" ({g / g0:.2f}x)" if g0 and k != "stof" else "")
            for k, (g, _) in gt.items())
        issue = " ".join(f"{k} {h:.2f}" for k, (_, h) in gt.items())
        print(f"  GPU time per eager forward (ms; n/a: the forward waits for "
              f"the GPU): {each}; host issue ms: {issue}")
    if graphs:
        caught = {k: graphed(m, kw, k) for k, m in models.items()}
        if caught["stof"][0] is None:
            print(f"FAIL: {name}: stof's forward could not be captured: "
                  f"{caught['stof'][1]}")
            sys.exit(1)
        gout = caught["stof"][1].float()[valid]
        gerr = ((gout - ref).norm() / ref.norm()).item()
        gpath = stof.integrations.transformers.last["path"]
        ok = {k: g for k, (g, _) in caught.items() if g is not None}
        gt = graph_times(ok)
        peers = " ".join(
            f"{k} {gt[k]:.3f} ms ({gt[k] / gt['stof']:.2f}x)" if k in gt else
            f"{k} n/a ({caught[k][1]})" for k in models if k != "stof")
        print(f"  CUDA graphs: rel err vs sdpa {gerr:.2e}; stof ({gpath}) "
              f"{gt['stof']:.3f} ms; {peers}")
        if not gerr < tol:
            print(f"FAIL: {name}: captured stof differs from sdpa by {gerr:.2e}")
            sys.exit(1)
        del caught, ok
    del models
    torch.cuda.empty_cache()
    return err, times, path


def main():
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    bench = "--bench" in sys.argv
    graphs = bench or "--graphs" in sys.argv
    bert = AutoConfig.for_model("bert", hidden_size=768, num_hidden_layers=12,
                                num_attention_heads=12, intermediate_size=3072,
                                hidden_act="gelu", max_position_embeddings=4096,
                                vocab_size=30522)
    g = torch.Generator().manual_seed(1)
    sizes = [(8, 512)] + ([(16, 2048), (1, 4096), (2, 4096)] if bench
                          else [])
    for b, s in sizes:
        ids = torch.randint(0, 30522, (b, s), generator=g).to(DEV)
        # Mixed lengths: sequence i keeps s - i * s / (2 b) tokens (one
        # sequence: no padding, so only the full row).
        lens = [s - (i * s) // (2 * b) for i in range(b)]
        am = torch.zeros(b, s, dtype=torch.long)
        for i, n in enumerate(lens):
            am[i, :n] = 1
        am = am.to(DEV)
        if b > 1:
            compare(f"BERT-base {b}x{s} padded (lengths {lens[-1]}..{s})", bert,
                    {"input_ids": ids, "attention_mask": am}, am.bool(),
                    graphs=graphs, gpu=bench)
        compare(f"BERT-base {b}x{s} full", bert, {"input_ids": ids},
                torch.ones(b, s, dtype=torch.bool, device=DEV), graphs=graphs,
                gpu=bench)

    mistral = AutoConfig.for_model("mistral", hidden_size=1024,
                                   num_hidden_layers=8, num_attention_heads=16,
                                   num_key_value_heads=4, intermediate_size=2816,
                                   sliding_window=256, vocab_size=32000,
                                   max_position_embeddings=8192)
    for b, s in [(2, 2048)] + ([(1, 8192)] if bench else []):
        ids = torch.randint(0, 32000, (b, s), generator=g).to(DEV)
        compare(f"Mistral-style decoder {b}x{s} (GQA 16/4, sliding window 256)",
                mistral, {"input_ids": ids, "use_cache": False},
                torch.ones(b, s, dtype=torch.bool, device=DEV), graphs=graphs,
                gpu=bench)
    if bench:
        # The same decoder on a batch of mixed lengths, padded on the left
        # (batched generation's prefill): sliding window and padding.
        b, s = 8, 2048
        ids = torch.randint(0, 32000, (b, s), generator=g).to(DEV)
        lens = [s - (i * s) // (2 * b) for i in range(b)]
        am = torch.zeros(b, s, dtype=torch.long)
        for i, n in enumerate(lens):
            am[i, s - n:] = 1
        am = am.to(DEV)
        compare(f"Mistral-style decoder {b}x{s} left-padded (lengths "
                f"{lens[-1]}..{s}; GQA 16/4, sliding window 256)", mistral,
                {"input_ids": ids, "attention_mask": am, "use_cache": False},
                am.bool(), graphs=graphs, gpu=bench)
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
    path = compare(
        f"Llama-style decoder {b}x{s} left-padded (lengths {lens[-1]}..{s})",
        llama, {"input_ids": ids, "attention_mask": am, "use_cache": False},
        am.bool(), graphs=True, gpu=bench)[2]
    if path != "family:causal&!prefix":
        print(f"FAIL: the left-padded batch took {path}, not the "
              "causal&!prefix family")
        sys.exit(1)
    # Packed sequences (position ids restarting within a row, as
    # transformers' data collators with flattening give them): each token
    # sees its own sequence only: stof's "causal&docs" family.
    b, s = 2, 2048
    ids = torch.randint(0, 32000, (b, s), generator=g).to(DEV)
    pos = torch.cat([torch.arange(n) for n in (700, 900, 448)])
    pos = pos[None].repeat(b, 1).to(DEV)
    path = compare(
        f"Llama-style decoder {b}x{s} packed (sequences of 700, 900, 448)",
        llama, {"input_ids": ids, "position_ids": pos, "use_cache": False},
        torch.ones(b, s, dtype=torch.bool, device=DEV), graphs=True,
        gpu=bench)[2]
    if path != "family:causal&docs":
        print(f"FAIL: the packed batch took {path}, not the causal&docs family")
        sys.exit(1)
    static_cache_decode(llama, g, bench)
    print("all checks passed")
    return 0


def static_cache_decode(cfg, g, bench):
    """Generation with a static cache (what generate(cache_implementation=
    "static") and compiled decoding use): a left-padded prefill, then two
    decode steps, the logits of stof's model against sdpa's; then one
    decode step captured in a CUDA graph per backend and timed."""
    from transformers import AutoModelForCausalLM, StaticCache
    b, prompt, max_cache = (8, 6000, 8192) if bench else (4, 1000, 2048)
    ids = torch.randint(0, 32000, (b, prompt), generator=g).to(DEV)
    lens = [prompt - (i * prompt) // (2 * b) for i in range(b)]
    am = torch.zeros(b, prompt, dtype=torch.long)
    for i, n in enumerate(lens):
        am[i, prompt - n:] = 1
    am = am.to(DEV)
    steps = torch.randint(0, 32000, (2, b, 1), generator=g).to(DEV)
    logits, paths, models = {}, {}, {}
    with torch.no_grad():
        for impl in ("stof", "sdpa"):
            torch.manual_seed(0)
            m = AutoModelForCausalLM.from_config(copy.deepcopy(cfg),
                                                 attn_implementation=impl)
            m = m.half().to(DEV).eval()
            cache = StaticCache(config=m.config, max_cache_len=max_cache)
            out = [m(input_ids=ids, attention_mask=am, past_key_values=cache,
                     use_cache=True, logits_to_keep=1).logits[:, -1].float()]
            mask = am
            for t in range(2):
                mask = torch.cat([mask, torch.ones(b, 1, dtype=mask.dtype,
                                                   device=DEV)], 1)
                out.append(m(input_ids=steps[t], attention_mask=mask,
                             past_key_values=cache, use_cache=True)
                           .logits[:, -1].float())
            logits[impl] = out
            paths[impl] = stof.integrations.transformers.last["path"]
            models[impl] = (m, cache, mask)
    name = (f"Llama-style decoder, static cache of {max_cache}, left-padded "
            f"prefill {b}x{prompt} (lengths {lens[-1]}..{prompt}) + 2 decode steps")
    errs = [((a - r).norm() / r.norm()).item()
            for a, r in zip(logits["stof"], logits["sdpa"])]
    print(f"{name}: logits rel err vs sdpa {', '.join(f'{e:.2e}' for e in errs)}; "
          f"stof's decode path {paths['stof']}")
    if paths["stof"] != "family:causal&!prefix" or not max(errs) < 2e-2:
        print(f"FAIL: {name}: path {paths['stof']}, errors {errs}")
        sys.exit(1)
    # One decode step captured per backend (the cache's position advances
    # at each replay; the padding mask stays the same, so each replay does
    # the same work in both).
    graphs = {}
    with torch.no_grad():
        for impl, (m, cache, mask) in models.items():
            kw = {"input_ids": steps[0], "attention_mask": mask,
                  "past_key_values": cache, "use_cache": True}
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                m(**kw)
            torch.cuda.current_stream().wait_stream(side)
            gr = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(gr):
                    m(**kw)
            except Exception as e:
                print(f"  {impl}: decode step not captured: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:120]}")
                if impl == "stof":
                    print(f"FAIL: {name}: stof's decode step could not be captured")
                    sys.exit(1)
                continue
            graphs[impl] = gr
    # Few replays: each advances the static cache by one position.
    t = interleaved({k: gr.replay for k, gr in graphs.items()}, rounds=4, reps=5)
    peers = " ".join(f"{k} {v:.3f} ms ({v / t['stof']:.2f}x)" for k, v in t.items()
                     if k != "stof")
    print(f"  decode step in a CUDA graph: stof {t['stof']:.3f} ms; {peers}")
    del models, graphs
    torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
