"""The "stof" mask interface of stof.integrations.transformers, on the CPU:
transformers' own mask builders (create_causal_mask, create_bidirectional_
mask, create_sliding_window_causal_mask) called for a config whose
attention implementation is "stof", on padded and unpadded batches; the
StofMask they return checked against transformers' SDPA mask of the same
arguments (the spec's pattern, restricted to each sequence's key span, must
equal it exactly), and the patterns stof has no kernel for must come back
as SDPA's tensor. Needs PyTorch and transformers, no GPU (skips, exit 77,
without them)."""
import copy
import sys

from cpu_test import check, finish, leaf, require

st = require()
import torch  # noqa: E402
from transformers import AutoConfig  # noqa: E402
from transformers import masking_utils as mu  # noqa: E402


def spec_allowed(spec, sq, sk, q_offset):
    """The boolean (sq, sk) pattern of a stof spec, queries at q_offset."""
    return leaf(spec, torch.arange(sq)[:, None] + q_offset,
                torch.arange(sk)[None, :])


def stof_allowed(m, batch):
    """What a StofMask lets each sequence see: (batch, 1, sq, sk)."""
    base = spec_allowed(m.spec, m.q_length, m.kv_length, m.q_offset)
    out = base[None, None].repeat(batch, 1, 1, 1)
    k = torch.arange(m.kv_length)
    if "k_lens" in m.data:
        out &= (k[None, :] < m.data["k_lens"][:, None].long())[:, None, None, :]
    if "prefix" in m.data:
        out &= (k[None, :] >= m.data["prefix"][:, None].long())[:, None, None, :]
    if "doc_id" in m.data:
        d = m.data["doc_id"].long()
        out &= (d[:, :, None] == d[:, None, :])[:, None]
    return out


def config(kind, impl, **kw):
    cfg = AutoConfig.for_model(kind, **kw)
    cfg = copy.deepcopy(cfg)
    cfg._attn_implementation = impl
    return cfg


def both(builder, cfg_kind, kw, emb, am, **extra):
    """The mask the builder makes for "stof" and for "sdpa" (materialised:
    sdpa_mask's skips turned off by comparing against the full pattern)."""
    out = {}
    for impl in ("stof", "sdpa"):
        cfg = config(cfg_kind, impl, **kw)
        out[impl] = builder(cfg, emb, am, past_key_values=None, **extra)
    return out["stof"], out["sdpa"]


def sdpa_dense(sdpa, batch, sq, sk, spec):
    """sdpa's mask as a (batch, 1, sq, sk) boolean tensor (None: its
    skip, i.e. the plain pattern)."""
    if sdpa is None:
        return spec_allowed(spec, sq, sk, 0)[None, None].repeat(batch, 1, 1, 1)
    return sdpa.expand(batch, 1, sq, sk)


def compiled_reuse():
    """A BERT model compiled (fullgraph, inductor, on the CPU) with stof's
    family implementation recorded: every layer gets the same instance
    tensors and the later layers say same_data, as in eager."""
    from transformers import AutoModel
    rec = []

    def fake_impl(q, k, v, family, scale, q_lens, k_lens, q_offset=None,
                  prefix=None, doc_id=None, same_data=False):
        rec.append((family, same_data, k_lens.data_ptr(), prefix.data_ptr()))
        return torch.zeros_like(q)

    real = st._ops._family_impl
    st._ops._family_impl = fake_impl
    try:
        torch.manual_seed(0)
        cfg = config("bert", "stof", hidden_size=64, num_hidden_layers=3,
                     num_attention_heads=4, intermediate_size=128, vocab_size=100)
        m = AutoModel.from_config(cfg, attn_implementation="stof").eval()
        ids = torch.randint(0, 100, (2, 16))
        am = torch.ones(2, 16, dtype=torch.long)
        am[1, 10:] = 0
        try:
            cm = torch.compile(m, fullgraph=True)
            with torch.no_grad():
                cm(input_ids=ids, attention_mask=am)
                rec.clear()
                cm(input_ids=ids, attention_mask=am)
        except Exception as e:  # no C++ compiler for inductor here
            print(f"skip: torch.compile on the CPU failed ({type(e).__name__}: "
                  f"{str(e).splitlines()[0][:100]})")
            return
        ptrs = {r[2:] for r in rec}
        check(len(rec) == 3 and [r[1] for r in rec] == [False, True, True] and
              len(ptrs) == 1 and all(r[0] == "!prefix" for r in rec),
              f"compiled: one format build a forward, the same instance "
              f"tensors for every layer ({[r[:2] for r in rec]}, "
              f"{len(ptrs)} distinct pointer pairs)")
    finally:
        st._ops._family_impl = real


def check_mask_plans():
    """_mask_plan, the attention's reading of a 4-D mask tensor: an additive
    mask is a pattern only when its elements are 0 or mask (a soft
    penalty, ALiBi-like slopes, make it a bias, as SDPA adds them); an
    integer mask is refused; under torch.inference_mode (no version
    counter) a mask rewritten in place is worked out again when asked
    (the first layer of each forward), and a cached plan is one entry."""
    n = 6
    qi = torch.arange(n)[:, None]
    ki = torch.arange(n)[None, :]
    causal = (ki <= qi)[None, None].expand(2, 1, n, n)
    soft = torch.where(causal, 0.0, -2.0).to(torch.float32)
    plan = st._mask_plan(soft, torch.float16, n, None)
    check(plan[0] == "dense" and isinstance(plan[1], torch.Tensor),
          f"0 / -2 additive mask is a bias, not causal ({plan[0]})")
    slopes = (-0.5 * (qi - ki).abs().float())[None, None].expand(2, 1, n, n)
    plan = st._mask_plan(slopes.contiguous(), torch.float16, n, None)
    check(plan[0] == "dense" and isinstance(plan[1], torch.Tensor),
          f"ALiBi-like additive mask is a bias ({plan[0]})")
    lowest = torch.finfo(torch.float32).min
    hard = torch.where(causal, 0.0, lowest).to(torch.float32).contiguous()
    plan = st._mask_plan(hard, torch.float16, n, None)
    check(plan[0] == "causal" and plan[1] is None,
          f"0 / lowest additive mask is causal ({plan[0]})")
    try:
        st._mask_plan(causal.to(torch.int64).contiguous(), torch.float16, n, None)
    except TypeError as e:
        check("boolean" in str(e), f"an integer mask is refused: {e}")
    else:
        check(False, "an integer mask is refused")
    with torch.inference_mode():
        m = causal.clone()
        first = st._mask_plan(m, torch.float16, n, None, recheck=True)
        m[1, :, :, 4:] = False  # sequence 1's keys 4.. become padding
        again = st._mask_plan(m, torch.float16, n, None, recheck=True)
    check(first[0] == "causal" and again[0] != "causal",
          f"inference mode: a mask rewritten in place is worked out again "
          f"({first[0]} -> {again[0]})")
    check(isinstance(st._last["entry"], tuple) and len(st._last["entry"]) == 3,
          "the cached plan is one (key, mask, plan) entry")


def main():
    b, s = 4, 48
    emb = torch.zeros(b, s, 8)
    right = torch.zeros(b, s, dtype=torch.long)
    left = torch.zeros(b, s, dtype=torch.long)
    for i, n in enumerate([s, 40, 17, 1]):
        right[i, :n] = 1
        left[i, s - n:] = 1
    holes = torch.ones(b, s, dtype=torch.long)
    holes[1, 5] = 0
    cases = [("no mask", None), ("all ones", torch.ones(b, s, dtype=torch.long)),
             ("right padding", right), ("left padding", left)]

    # Recognised mask functions.
    check(st.mask_spec(mu.causal_mask_function) == "causal", "causal recognised")
    check(st.mask_spec(mu.bidirectional_mask_function) == "dense",
          "bidirectional recognised")
    check(st.mask_spec(mu.sliding_window_causal_mask_function(7)) ==
          "causal_sliding:7", "causal sliding window 7 recognised")
    if hasattr(mu, "sliding_window_bidirectional_mask_function"):
        check(st.mask_spec(mu.sliding_window_bidirectional_mask_function(7)) ==
              "sliding:8", "bidirectional window 7 is stof's sliding:8")
    check(st.mask_spec(mu.and_masks(mu.causal_mask_function,
                                    mu.sliding_window_overlay(7))) is None,
          "the overlay in the other order is not claimed")
    check(st.mask_spec(mu.or_masks(mu.causal_mask_function,
                                   mu.bidirectional_mask_function)) is None,
          "or_masks is not claimed")
    check(st.mask_spec(mu.chunked_causal_mask_function(8, torch.zeros(1))) is None,
          "chunked attention is not claimed")
    check(st.mask_spec(lambda b, h, q, k: k <= q) is None,
          "a user's own function is not claimed")

    llama = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=1,
                 intermediate_size=128, vocab_size=100)
    mistral = dict(llama, sliding_window=5)
    bert = dict(llama)
    builders = [
        ("causal", mu.create_causal_mask, "llama", llama, "causal"),
        ("bidirectional", mu.create_bidirectional_mask, "bert", bert, "dense"),
        ("sliding", mu.create_sliding_window_causal_mask, "mistral", mistral,
         "causal_sliding:5"),
    ]
    for bname, builder, kind, kw, spec in builders:
        for cname, am in cases:
            extra = {}
            if builder is not mu.create_bidirectional_mask:
                extra["position_ids"] = None
            m, sdpa = both(builder, kind, kw, emb, am, **extra)
            what = f"{bname}, {cname}"
            if not isinstance(m, st.StofMask):
                check(False, f"{what}: a StofMask (got {type(m).__name__})")
                continue
            check(m.spec == spec, f"{what}: spec {m.spec}")
            padded = cname in ("right padding", "left padding")
            check((m.family is not None) == padded,
                  f"{what}: family {m.family} (padded: {padded})")
            if cname == "left padding":
                check("prefix" in m.data and m.family.endswith("!prefix"),
                      f"{what}: left padding skips each sequence's prefix")
            want = sdpa_dense(sdpa, b, s, s, spec)
            got = stof_allowed(m, b)
            # Padded query rows may differ (sdpa lets them see something
            # to avoid NaN; stof gives zeros): compare the valid rows.
            rows = torch.ones(b, s, dtype=torch.bool) if am is None else am.bool()
            same = bool((got == want)[:, 0][rows].all())
            check(same, f"{what}: the same allowed keys as sdpa's mask on "
                  "the valid rows")

    # Patterns stof does not claim get SDPA's mask.
    cfg = config("llama", "stof", **llama)
    m = mu.create_causal_mask(cfg, emb, holes, past_key_values=None,
                              position_ids=None,
                              and_mask_function=lambda b, h, q, k: k != 3)
    check(isinstance(m, torch.Tensor) and m.shape == (b, 1, s, s),
          "an and_mask_function gives SDPA's 4-D tensor")
    # Keys padded in the middle: eager takes SDPA's tensor ...
    m = mu.create_causal_mask(cfg, emb, holes, past_key_values=None,
                              position_ids=None)
    check(isinstance(m, torch.Tensor), "a mask with a hole gives SDPA's tensor")
    # ... and the spans say the keys are not contiguous (what the device
    # asserts under capture and compile).
    first, end, contiguous = st.key_spans(holes.bool())
    check(not bool(contiguous), "key_spans: a hole is not contiguous")
    first, end, contiguous = st.key_spans(left.bool())
    check(bool(contiguous) and first.tolist() == [0, 8, 31, 47] and
          end.tolist() == [48] * 4, "key_spans of left padding")
    first, end, contiguous = st.key_spans(torch.zeros(2, 6, dtype=torch.bool))
    check(bool(contiguous) and first.tolist() == [6, 6] and end.tolist() == [0, 0],
          "key_spans of sequences with no valid key (an empty span)")

    # Under capture_safe (and CUDA-graph capture, torch.compile) nothing is
    # read on the host: a padded batch always runs "<spec>&!prefix" with
    # both spans, and the contiguity check goes to the device.
    with st.capture_safe():
        m = mu.create_causal_mask(cfg, emb, right, past_key_values=None,
                                  position_ids=None)
    check(isinstance(m, st.StofMask) and m.family == "causal&!prefix" and
          set(m.data) == {"prefix", "k_lens"} and m.check is not None and
          bool(m.check) and bool((stof_allowed(m, b) == sdpa_dense(
              mu.create_causal_mask(config("llama", "sdpa", **llama), emb, right,
                                    past_key_values=None, position_ids=None),
              b, s, s, "causal"))[:, 0][right.bool()].all()),
          "capture_safe: right padding as causal&!prefix, checked on the device")
    with st.capture_safe():
        m = mu.create_causal_mask(cfg, emb, None, past_key_values=None,
                                  position_ids=None)
    check(isinstance(m, st.StofMask) and m.family is None and
          m.warm == ("causal&docs",),
          f"capture_safe: a causal mask without padding plans causal&docs too "
          f"(what a captured forward gets): {m.warm if m is not None else m}")
    try:
        with st.capture_safe():
            m = mu.create_causal_mask(cfg, emb, holes, past_key_values=None,
                                      position_ids=None)
        check(False, "capture_safe: a hole fails the device-side check")
    except RuntimeError as e:  # on the CPU the assert raises at once
        check("not contiguous" in str(e),
              f"capture_safe: a hole fails the device-side check ({e})")

    # Packed sequences (position ids restarting within a row): the pattern
    # within each sequence, stof's `docs` with transformers' sequence ids.
    pos = torch.cat([torch.arange(20), torch.arange(28)])[None].repeat(b, 1)
    for bname, builder, kind, kw, spec in builders[::2]:
        ms = {impl: builder(config(kind, impl, **kw), emb, None,
                            past_key_values=None, position_ids=pos)
              for impl in ("stof", "sdpa")}
        m = ms["stof"]
        ok = isinstance(m, st.StofMask) and m.family == spec + "&docs" and \
            bool((stof_allowed(m, b) == sdpa_dense(ms["sdpa"], b, s, s, spec)).all())
        check(ok, f"{bname}, packed sequences of 20 and 28: {m}, the same "
              "allowed keys as sdpa's mask")
    packed_args = dict(batch_size=b, q_length=s, kv_length=s,
                       mask_function=mu.and_masks(
                           mu.causal_mask_function,
                           mu.packed_sequence_mask_function(torch.zeros(b, s))),
                       attention_mask=left)
    m = st.stof_mask(**packed_args)
    check(isinstance(m, st.StofMask) and m.family == "causal&!prefix&docs" and
          m.check is None and set(m.data) == {"doc_id", "prefix", "k_lens"},
          f"packed ids with left padding: {m}")
    with st.capture_safe():
        m = st.stof_mask(**packed_args)
    check(isinstance(m, st.StofMask) and m.check is not None,
          "packed ids with left padding under capture_safe: checked on the device")
    m = st.stof_mask(**dict(packed_args, attention_mask=holes))
    check(isinstance(m, torch.Tensor),
          "packed ids with a hole in the padding, eager: SDPA's mask")

    # Queries after cached keys (a decode step: q_offset 9, 10 keys).
    m = st.stof_mask(batch_size=2, q_length=1, kv_length=10, q_offset=9,
                     kv_offset=0, mask_function=mu.causal_mask_function,
                     attention_mask=torch.ones(2, 10, dtype=torch.bool))
    check(isinstance(m, st.StofMask) and m.q_offset == 9 and m.family is None,
          "decode step: causal with q_offset 9, nothing padded")
    # Offsets held in tensors (static caches: a cache of 16 positions, 6
    # filled, one new query, sequence 1 padded on the left by 2): the
    # family with the offset as data.
    am = torch.ones(2, 7, dtype=torch.bool)
    am[1, :2] = False
    args = dict(batch_size=2, q_length=1, kv_length=16, q_offset=torch.tensor(6),
                kv_offset=0, mask_function=mu.causal_mask_function,
                attention_mask=am)
    m = st.stof_mask(**args)
    want = mu.sdpa_mask(**args, allow_is_causal_skip=False, device="cpu")
    check(isinstance(m, st.StofMask) and m.family == "causal&!prefix" and
          m.data["q_offset"].tolist() == [6, 6] and
          m.data["k_lens"].tolist() == [7, 7] and
          m.data["prefix"].tolist() == [0, 2] and m.q_offset is None,
          f"a static cache's tensor offset: {m}")
    got = spec_allowed("causal", 1, 16, 6)[None, None].repeat(2, 1, 1, 1)
    k = torch.arange(16)
    got &= ((k[None] < m.data["k_lens"][:, None]) &
            (k[None] >= m.data["prefix"][:, None]))[:, None, None]
    check(bool((got == want).all()), "a static cache's decode step: the same "
          "allowed keys as sdpa's mask")
    # A right-padded prompt decoding on: keys padded in the middle. Eager,
    # SDPA's mask (not a device assert); under capture_safe the assert.
    hole = torch.tensor([[1, 1, 1, 0, 0, 1, 1]] * 2, dtype=torch.bool)
    m = st.stof_mask(**dict(args, attention_mask=hole))
    check(isinstance(m, torch.Tensor), "a static cache with a hole, eager: "
          f"SDPA's mask ({type(m).__name__})")
    try:
        with st.capture_safe():
            st.stof_mask(**dict(args, attention_mask=hole))
        check(False, "a static cache with a hole under capture_safe: asserted")
    except RuntimeError as e:
        check("not contiguous" in str(e), "a static cache with a hole under "
              "capture_safe: asserted")
    m = st.stof_mask(**dict(args, attention_mask=None))
    check(isinstance(m, st.StofMask) and m.family == "causal" and
          set(m.data) == {"q_offset"}, f"a static cache without padding: {m}")
    m = st.stof_mask(**dict(args, kv_offset=torch.tensor(0), attention_mask=None))
    check(not isinstance(m, st.StofMask), "a tensor kv_offset gives SDPA's mask")

    # The attention under each StofMask: the calls it makes to stof's ops
    # (recorded by stand-ins: no GPU here), with their arguments.
    calls = []

    def fake_attention(q, k, v, mask="dense", scale=None, **kw):
        calls.append(("attention", mask, scale, kw))
        return torch.zeros_like(q)

    def fake_family(q, k, v, family, scale, q_lens=None, k_lens=None,
                    q_offset=None, prefix=None, doc_id=None, after=None):
        if after is not None:
            family += " (same data)"
        calls.append(("family", family, scale,
                      {n: t.tolist() for n, t in (("k_lens", k_lens),
                                                  ("q_offset", q_offset),
                                                  ("prefix", prefix),
                                                  ("doc_id", doc_id))
                       if t is not None}))
        return torch.zeros_like(q)

    real = st._ops.attention, st._ops.family_attention
    st._ops.attention, st._ops.family_attention = fake_attention, fake_family
    try:
        q = torch.zeros(b, 4, s, 16)
        for am, want in ((None, ("attention", "causal", 0.25, {"softcap": 0.0})),
                         (right, ("family", "causal", 0.25,
                                  {"k_lens": [48, 40, 17, 1]})),
                         (left, ("family", "causal&!prefix", 0.25,
                                 {"k_lens": [48] * 4, "prefix": [0, 8, 31, 47]}))):
            m = mu.create_causal_mask(cfg, emb, am, past_key_values=None,
                                      position_ids=None)
            calls.clear()
            out, w = st.stof_attention_forward(None, q, q, q, m, scaling=0.25)
            check(calls == [want] and out.shape == (b, s, 4, 16) and w is None,
                  f"attention under {m}: {calls}")
            if want[0] == "family":
                # The next layer: the same mask and plan reuse the format.
                calls.clear()
                st.stof_attention_forward(None, q, q, q, m, scaling=0.25)
                again = (want[0], want[1] + " (same data)") + want[2:]
                check(calls == [again], f"the next layer reuses the format: {calls}")
                calls.clear()
                st.stof_attention_forward(None, q[:, :2], q[:, :2], q[:, :2], m,
                                          scaling=0.25)
                check(len(calls) == 1 and "same data" not in calls[0][1],
                      f"another plan (2 heads) builds its own: {calls}")
        m = st.stof_mask(batch_size=b, q_length=1, kv_length=s, q_offset=s - 1,
                         kv_offset=0, mask_function=mu.causal_mask_function,
                         attention_mask=right.bool())
        calls.clear()
        st.stof_attention_forward(None, q[:, :, :1], q, q, m, scaling=0.25)
        check(calls == [("family", "causal", 0.25,
                         {"k_lens": [48, 40, 17, 1], "q_offset": [47] * b})],
              f"a padded decode step: {calls}")
        m = st.stof_mask(batch_size=2, q_length=1, kv_length=16,
                         q_offset=torch.tensor(6), kv_offset=0,
                         mask_function=mu.causal_mask_function,
                         attention_mask=torch.ones(2, 7, dtype=torch.bool))
        calls.clear()
        kv = torch.zeros(2, 4, 16, 16)
        st.stof_attention_forward(None, kv[:, :, :1], kv, kv, m, scaling=0.25)
        check(calls == [("family", "causal&!prefix", 0.25,
                         {"k_lens": [7, 7], "q_offset": [6, 6], "prefix": [0, 0]})],
              f"a static cache's decode step runs the family: {calls}")
        # Soft-capping (Gemma 2) reaches the structured kernel; a family
        # path refuses it, and attention sinks are refused, by name.
        m = mu.create_causal_mask(cfg, emb, None, past_key_values=None,
                                  position_ids=None)
        calls.clear()
        st.stof_attention_forward(None, q, q, q, m, scaling=0.25, softcap=30.0)
        check(calls == [("attention", "causal", 0.25, {"softcap": 30.0})],
              f"softcap reaches the structured kernel: {calls}")
        m = mu.create_causal_mask(cfg, emb, right, past_key_values=None,
                                  position_ids=None)
        for kw, what in (({"softcap": 30.0}, "soft-capping"),
                         ({"s_aux": torch.zeros(4)}, "sinks")):
            try:
                st.stof_attention_forward(None, q, q, q, m, **kw)
                check(False, f"{what} with a mask family refused")
            except ValueError as e:
                check("not supported" in str(e), f"{what} refused ({e})")
        m = st.stof_mask(batch_size=b, q_length=1, kv_length=s, q_offset=s - 1,
                         kv_offset=0, mask_function=mu.causal_mask_function,
                         attention_mask=right.bool())
        meta = m.data_on(torch.device("meta"))
        check(all(t.device.type == "meta" for t in meta.values()) and
              m.data_on(torch.device("meta"))["k_lens"] is meta["k_lens"],
              "a mask's data on another device: copied once")
        try:
            st.stof_attention_forward(None, q[:, :, :2], q, q, m)
            check(False, "a mask of another size is refused")
        except ValueError as e:
            check("1 x 48" in str(e), f"a mask of another size is refused ({e})")
    finally:
        st._ops.attention, st._ops.family_attention = real
    compiled_reuse()

    # The eager family path's instance data: checked like FamilyPlan.run's.
    ops = st._ops
    cpu = torch.device("cpu")
    d = ops._instance(2, 10, cpu, None, torch.tensor([3, 4], dtype=torch.int32),
                      None, torch.zeros(2, dtype=torch.int32),
                      torch.zeros(2, 12, dtype=torch.int32))
    check(d.k_len != 0 and d.prefix != 0 and d.q_len is None and
          d.doc_stride == 12, "instance data: pointers and the doc_id stride")
    for bad, what in ((torch.tensor([3, 4]), "int64 lengths"),
                      (torch.tensor([3], dtype=torch.int32), "one length for two"),
                      (torch.zeros(4, dtype=torch.int32)[::2], "a strided tensor")):
        try:
            ops._instance(2, 10, cpu, None, bad, None, None, None)
            check(False, f"instance data: {what} refused")
        except ValueError as e:
            check("k_lens must be" in str(e), f"instance data: {what} refused ({e})")
    try:
        ops._instance(2, 10, cpu, None, None, None, None,
                      torch.zeros(2, 9, dtype=torch.int32))
        check(False, "instance data: doc_id shorter than seq_k refused")
    except ValueError as e:
        check("doc_id" in str(e), "instance data: doc_id shorter than seq_k refused")

    check_mask_plans()
    return finish()


if __name__ == "__main__":
    sys.exit(main())
