"""The Python binding without a GPU and without PyTorch (the CI machine has
neither): the library loads, a context opens without a device, masks and
mask families evaluate on the host with their instance data (lengths,
documents, prefixes, a window per head), and bad input is refused with a
message naming it. Counts are checked against direct evaluations. The
attention descriptor's mirror (soft-cap, ALiBi slopes) and the ALiBi slopes
helper are checked first, without the library."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import stof  # noqa: E402


def count(mask):
    return round(mask.density * mask.shape[0] * mask.shape[1])


def expect_error(fn, kind, *words):
    try:
        fn()
    except kind as e:
        msg = str(e)
        for w in words:
            assert w in msg, "%r not in the message: %s" % (w, msg)
        return
    raise AssertionError("no %s raised" % kind.__name__)


def check_score_mods():
    """stof_attention_desc's mirror (softcap, alibi_slopes) and the ALiBi
    slopes helper: no library call."""
    import ctypes
    import math
    assert ctypes.sizeof(stof._Desc) == 192, ctypes.sizeof(stof._Desc)
    assert stof._Desc.softcap.offset == 132, stof._Desc.softcap.offset
    assert stof._Desc.alibi_slopes.offset == 136, stof._Desc.alibi_slopes.offset
    assert stof._Desc.reserved.offset == 144, stof._Desc.reserved.offset

    s8 = stof.alibi_slopes(8)
    assert s8 == [2.0 ** -(i + 1) for i in range(8)], s8
    s12 = stof.alibi_slopes(12)
    assert len(s12) == 12 and s12[:8] == s8, s12
    for got, want in zip(s12[8:], (2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5)):
        assert math.isclose(got, want, rel_tol=1e-12), (s12, want)
    for n in (1, 3, 8, 12, 16, 20, 32, 40, 64):
        s = stof.alibi_slopes(n)
        assert len(s) == n and all(math.isfinite(x) and x > 0 for x in s), (n, s)
    expect_error(lambda: stof.alibi_slopes(0), ValueError, "heads")

    # The descriptor's fields from the plan calls' keyword arguments.
    d = stof._Desc()
    keep = stof._score_mods(d, 30.0, stof.alibi_slopes(4), 4)
    assert d.softcap == 30.0 and [d.alibi_slopes[i] for i in range(4)] == \
        stof.alibi_slopes(4)
    assert ctypes.addressof(keep) == ctypes.cast(d.alibi_slopes, ctypes.c_void_p).value
    d = stof._Desc()
    assert stof._score_mods(d, 0.0, None, 4) is None
    assert d.softcap == 0.0 and not d.alibi_slopes
    for cap in (-1.0, float("nan"), float("inf")):
        expect_error(lambda: stof._score_mods(stof._Desc(), cap, None, 4),
                     ValueError, "softcap")
    expect_error(lambda: stof._score_mods(stof._Desc(), 0.0, [0.5] * 3, 4),
                 ValueError, "alibi_slopes", "3", "4")
    expect_error(lambda: stof._score_mods(stof._Desc(), 0.0, [0.5, float("nan"), 1, 1], 4),
                 ValueError, "alibi_slopes[1]")


def main():
    check_score_mods()
    lib = stof._load()
    version = lib.stof_version_string().decode()
    assert version.count(".") == 2, version
    ctx = stof.Context(require_device=False, user_db="")
    print("stof", version, "library", stof.library_path())

    # Masks from specs: shapes and counts.
    m = ctx.mask("causal", 100, 80)
    assert m.shape == (100, 80)
    want = sum(min(q + 1, 80) for q in range(100))
    assert count(m) == want, (count(m), want)
    m = ctx.mask("sliding:3", 10, 10)
    assert count(m) == 10 + 2 * 9 + 2 * 8, count(m)
    d1, d2 = ctx.mask("dense", 64, 64).digest(), ctx.mask("dense", 64, 64).digest()
    assert d1 == d2 and len(d1) == 32
    expect_error(lambda: ctx.mask("sliding:0", 8, 8), stof.StofError, "sliding")
    expect_error(lambda: ctx.mask("causal&", 8, 8), stof.StofError)

    # A family: canonical spec, per-sequence data.
    fam = ctx.mask_family("causal & docs")
    assert fam.spec == "causal&docs", fam.spec
    docs = [[0, 0, 0, 1, 1, 1, 1, 2], [0, 0, 1, 1, 1, 1, 1, 1]]
    for b in range(2):
        got = fam.mask(8, 8, b=b, doc_id=docs, q_len=[8, 5], k_len=[8, 5])
        n = 5 if b else 8
        want = sum(1 for q in range(n) for k in range(n)
                   if k <= q and docs[b][q] == docs[b][k])
        assert count(got) == want, (b, count(got), want)
    # Prefix-LM: causal | prefix.
    pl = ctx.mask_family("causal|prefix").mask(6, 6, b=0, prefix=[3])
    assert count(pl) == sum(1 for q in range(6) for k in range(6)
                            if k <= q or k < 3)
    # A window per head.
    hs = ctx.mask_family("head_sliding")
    for h, w in enumerate([1, 3]):
        got = hs.mask(10, 10, head=h, head_window=[1, 3])
        want = sum(1 for q in range(10) for k in range(10) if abs(q - k) < w)
        assert count(got) == want, (h, count(got), want)

    # Bad instance data is named.
    expect_error(lambda: fam.mask(8, 8, q_len=[9]), stof.StofError, "q_len[0] = 9")
    expect_error(lambda: fam.mask(8, 8, doc_id=[[3, 2, 1, 0, 0, 0, 0, 0]]),
                 stof.StofError, "decreases")
    expect_error(lambda: fam.mask(8, 8, colour=[1]), ValueError, "colour")
    expect_error(lambda: fam.mask(8, 8, cu_seqlens_q=[0, 8]), ValueError,
                 "packed")
    expect_error(lambda: ctx.mask_family("random:0.5"), stof.StofError, "random")
    print("ok")


if __name__ == "__main__":
    main()
