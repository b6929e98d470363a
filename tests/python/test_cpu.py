"""The Python binding without a GPU and without PyTorch (the CI machine has
neither): the library loads, a context opens without a device, masks and
mask families evaluate on the host with their instance data (lengths,
documents, prefixes, a window per head), and bad input is refused with a
message naming it. Counts are checked against direct evaluations. The
attention descriptor's mirror (soft-cap, ALiBi slopes, additive bias), the
ALiBi slopes helper and the bias layout checks are checked first, without
the library; then that the library reads the mirror's bias fields.
Layer.stack_run's records of its calls are checked against a stub library.
Integers that go to C are checked against the C type's range, specs must
be str without NUL, a closed context refuses every call, and a bad
$STOF_LIBRARY is named."""
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
    assert stof._Desc.bias_stride.offset == 144, stof._Desc.bias_stride.offset
    assert stof._Desc.bias.offset == 168, stof._Desc.bias.offset
    # stof_layer_desc's mirror: the same size as before rope_scale and
    # rope_freq took reserved bytes (x86-64)
    if ctypes.sizeof(ctypes.c_void_p) == 8:
        assert ctypes.sizeof(stof._LayerDesc) == 104, ctypes.sizeof(stof._LayerDesc)
        assert stof._LayerDesc.rope_scale.offset == 60
        assert stof._LayerDesc.rope_freq.offset == 64
        assert stof._LayerDesc.qk_norm.offset == 72
        assert stof._LayerDesc.head_dim.offset == 76
        assert stof._LayerDesc.reserved.offset == 80
    assert stof._Desc.reserved.offset == 172, stof._Desc.reserved.offset

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


class FakeTensor:
    """What the bias checks read of a torch tensor."""

    def __init__(self, shape, strides, dtype="bf16", device="cuda:0", ptr=1 << 20):
        self.shape, self._strides = tuple(shape), tuple(strides)
        self.dtype, self.device, self._ptr = dtype, device, ptr
        self.is_cuda = device.startswith("cuda")

    def stride(self):
        return self._strides

    def data_ptr(self):
        return self._ptr


def contiguous(shape):
    return stof._bias_descriptor(shape)[1]


def check_bias():
    """stof_attention_desc's bias fields, stof_run_args' mirror and the bias
    layout checks of the plans and runs: no library call."""
    import ctypes
    if ctypes.sizeof(ctypes.c_void_p) == 8:
        assert ctypes.sizeof(stof._RunArgs) == 96, ctypes.sizeof(stof._RunArgs)
        offsets = [getattr(stof._RunArgs, f).offset
                   for f in ("q", "k", "v", "o", "data", "lse", "bias", "flags",
                             "reserved_u", "reserved")]
        assert offsets == [0, 8, 16, 24, 32, 40, 48, 56, 60, 64], offsets
    assert len(stof._RunArgs().reserved) == 4
    assert stof.RUN_SAME_DATA == 1

    B, H, S = 4, 16, 256
    size = (B, H, S, S)
    # Shapes (strides of contiguous tensors) and the bias_stride they give.
    cases = [((1, H, S, S), (1, H, S, S), (0, S * S, S)),    # per head (T5)
             ((B, 1, S, S), (B, 1, S, S), (S * S, 0, S)),    # per sequence
             ((S, S), (1, 1, S, S), (0, 0, S)),              # one for all
             ((H, S, S), (1, H, S, S), (0, S * S, S)),       # 3-D: heads
             ((B, H, S, S), (B, H, S, S), (H * S * S, S * S, S)),
             ((B, H, 1, S), (B, H, 1, S), (H * S, S, 0))]    # one row per head
    for shape, shape4, want in cases:
        got = stof._bias_layout(shape, contiguous(shape), size)
        assert got == (shape4, want), (shape, got, want)
        assert stof._bias_descriptor(shape) == (shape, contiguous(shape))
    # Expanded (stride 0) and padded rows (a pad_bias layout).
    got = stof._bias_layout((B, H, S, S), (0, S * S, S, 1), size)
    assert got == ((B, H, S, S), (0, S * S, S)), got
    n, r = 100, 104
    small = (2, 3, n, n)
    got = stof._bias_layout((1, 3, n, n), (3 * n * r, n * r, r, 1), small)
    assert got == ((1, 3, n, n), (0, n * r, r)), got
    # A size-1 dimension broadcasts whatever its stride.
    got = stof._bias_layout((1, 3, n, n), (7, n * r, r, 1), small)
    assert got == ((1, 3, n, n), (0, n * r, r)), got
    pair = ((1, 3, n, n), (3 * n * r, n * r, r, 1))
    assert stof._bias_descriptor(pair) == pair
    assert stof._bias_descriptor([list(pair[0]), list(pair[1])]) == pair

    # Refused layouts, each named.
    expect_error(lambda: stof._bias_layout((1, 3, n, n), contiguous((1, 3, n, n)),
                                           small),
                 ValueError, "multiples of 8", "query row 100", "stof.pad_bias")
    expect_error(lambda: stof._bias_layout((1, 3, n, n), (3 * n * r, n * r + 4, r, 1),
                                           small),
                 ValueError, "head %d" % (n * r + 4))
    expect_error(lambda: stof._bias_layout((1, H, S, S), (H * S * S, S * S, 1, S),
                                           size),
                 ValueError, "contiguous", "stride %d" % S)
    expect_error(lambda: stof._bias_layout((2, H, S, S), contiguous((2, H, S, S)),
                                           size),
                 ValueError, "broadcast", "(2, %d, %d, %d)" % (H, S, S))
    expect_error(lambda: stof._bias_layout((B, H, S, S), (-S, S * S, S, 1), size),
                 ValueError, "batch %d" % -S)
    expect_error(lambda: stof._bias_layout((1, H, S, 1), (H * S, S, 1, 1), size),
                 ValueError, "broadcast", "seq_k")
    expect_error(lambda: stof._bias_layout((S,), (1,), size), ValueError, "2-D")
    expect_error(lambda: stof._bias_layout((1,) + size, (0,) + contiguous(size), size),
                 ValueError, "4-D")
    expect_error(lambda: stof._bias_layout((S, S), (S, 1, 1), size), ValueError,
                 "2-D")
    expect_error(lambda: stof._bias_descriptor(7), ValueError, "shape")
    expect_error(lambda: stof._bias_descriptor(("a", "b")), ValueError, "shape")

    # The descriptor's fields from a plan's bias argument.
    q = FakeTensor((B, H, S, 64), contiguous((B, H, S, 64)))
    d = stof._Desc()
    assert stof._set_bias(d, None, q, S) is None
    assert d.bias == 0 and list(d.bias_stride) == [0, 0, 0]
    for bias in (FakeTensor((1, H, S, S), contiguous((1, H, S, S))), (1, H, S, S),
                 ((1, H, S, S), contiguous((1, H, S, S))), (H, S, S)):
        d = stof._Desc()
        got = stof._set_bias(d, bias, q, S)
        assert got == ((1, H, S, S), (0, S * S, S)), (bias, got)
        assert d.bias == 1 and list(d.bias_stride) == [0, S * S, S], list(d.bias_stride)
    expect_error(lambda: stof._set_bias(stof._Desc(), FakeTensor(
        (1, H, S, S), contiguous((1, H, S, S)), dtype="fp16"), q, S),
                 ValueError, "dtype")
    expect_error(lambda: stof._set_bias(stof._Desc(), FakeTensor(
        (1, H, S, S), contiguous((1, H, S, S)), device="cpu"), q, S),
                 ValueError, "cpu")
    expect_error(lambda: stof._set_bias(stof._Desc(), (1, H, S, S - 8), q, S),
                 ValueError, "broadcast")

    # A run's bias against its plan's (no library call before the checks).
    layout = ((1, H, S, S), (0, S * S, S))
    plan = stof.Plan(None, None, q.shape, q.shape, "bf16", None, layout)
    assert plan.has_bias and not stof.Plan(None, None, q.shape, q.shape, "bf16",
                                           None).has_bias
    ok = FakeTensor((1, H, S, S), contiguous((1, H, S, S)))
    assert plan._bias_ptr(ok, q) == ok.data_ptr()
    # The same layout with leading 1s dropped or another size-1 stride.
    assert plan._bias_ptr(FakeTensor((H, S, S), contiguous((H, S, S))), q)
    assert plan._bias_ptr(FakeTensor((1, H, S, S), (1, S * S, S, 1)), q)
    expect_error(lambda: plan._bias_ptr(None, q), ValueError, "bias=tensor")
    expect_error(lambda: plan._bias_ptr(FakeTensor((B, 1, S, S),
                                                   contiguous((B, 1, S, S))), q),
                 ValueError, "differs from the plan's")
    expect_error(lambda: plan._bias_ptr(FakeTensor((1, H, S, S), (0, S * S + 8, S, 1)),
                                        q),
                 ValueError, "differs from the plan's")
    expect_error(lambda: plan._bias_ptr(FakeTensor((1, H, S, S), contiguous(
        (1, H, S, S)), dtype="fp16"), q), ValueError, "fp16")
    expect_error(lambda: plan._bias_ptr(FakeTensor((1, H, S, S), contiguous(
        (1, H, S, S)), device="cpu"), q), ValueError, "CUDA")
    expect_error(lambda: plan._bias_ptr(FakeTensor((1, H, S, S), contiguous(
        (1, H, S, S)), ptr=(1 << 20) + 8), q), ValueError, "16-byte")
    plain = stof.Plan(None, None, q.shape, q.shape, "bf16", None)
    expect_error(lambda: plain._bias_ptr(ok, q), ValueError, "without one")
    # Packed plans have no bias (refused before anything is read).
    expect_error(lambda: stof.PackedPlan(None, None, q.shape, q.shape, "bf16", None,
                                         1).run(q, q, q, q, [0, S], bias=ok),
                 ValueError, "packed")

    try:
        import torch
    except ImportError:
        return
    # pad_bias on the CPU: values kept, strides multiples of 8, broadcast
    # dimensions not materialised.
    t = torch.randn(1, 3, 100, 100).to(torch.bfloat16)
    p = stof.pad_bias(t)
    assert p.shape == t.shape and torch.equal(p, t) and p.stride()[-2:] == (104, 1)
    stof._bias_layout(p.shape, p.stride(), (2, 3, 100, 100))
    e = torch.randn(1, 1, 100, 100).expand(2, 3, 100, 100)
    p = stof.pad_bias(e)
    assert p.shape == e.shape and torch.equal(p, e)
    assert p.stride() == (0, 0, 104, 1), p.stride()


def check_bias_library(lib, ctx):
    """The library reads the mirror's bias fields: it names a bad stride or
    a stride without bias = 1, and has the general run."""
    import ctypes
    m = ctx.mask("causal", 64, 64)
    init = lib.stof_attention_desc_init
    init.restype = ctypes.c_int
    init.argtypes = [ctypes.POINTER(stof._Desc)] + [ctypes.c_int] * 7

    def plan(bias, strides):
        d = stof._Desc()
        assert init(ctypes.byref(d), 2, 4, 64, 64, 64, 1, 0) == 0  # bf16, BHSD
        d.bias = bias
        for i, s in enumerate(strides):
            d.bias_stride[i] = s
        h = ctypes.c_void_p()
        st = lib.stof_attention_plan(ctx._h, ctypes.byref(d), m._h, ctypes.byref(h))
        msg = lib.stof_errmsg(ctx._h).decode()
        if h:
            lib.stof_plan_free(ctypes.byref(h))
        return st, msg

    st, msg = plan(1, (0, 4096, 12))
    assert st == 1 and "bias_stride[2]: 12" in msg, (st, msg)
    st, msg = plan(1, (0, 4100, 64))
    assert st == 1 and "bias_stride[1]: 4100" in msg, (st, msg)
    st, msg = plan(0, (0, 4096, 64))
    assert st == 1 and "bias_stride[1]" in msg and "bias is 0" in msg, (st, msg)
    st, msg = plan(2, (0, 0, 0))
    assert st == 1 and "desc.bias: 2" in msg, (st, msg)
    # A good layout passes the checks (no GPU here: no device).
    st, msg = plan(1, (0, 4096, 64))
    assert st in (0, 3), (st, msg)
    assert lib.stof_attention_run_ex(None, None, None) == 1


def check_log_callback():
    """Context(log=...) receives the library's messages with their level:
    opening one logs what became of the device (its name, or why there is
    no GPU), at "info" or above."""
    got = []
    lctx = stof.Context(require_device=False, user_db="",
                        log=lambda level, msg: got.append((level, msg)),
                        log_level="debug")
    assert got, "opening a context logged nothing"
    assert all(lv in ("error", "warn", "info", "debug") and isinstance(m, str)
               and m for lv, m in got), got
    assert any("device" in m or "CUDA" in m or "GPU" in m for _, m in got), got
    lctx.mask("causal", 8, 8)
    expect_error(lambda: stof.Context(require_device=False, log=42), TypeError,
                 "callable")
    expect_error(lambda: stof.Context(require_device=False, log=print,
                                      log_level="loud"), ValueError, "log_level")
    lctx.close()


def png_pixels(png):
    """(width, height, rows of (r, g, b)) of an 8-bit RGB PNG without
    filters, as stof_mask_png writes it, read with zlib only."""
    import struct
    import zlib
    assert png[:8] == b"\x89PNG\r\n\x1a\n", png[:8]
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(png):
        n, kind = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + n]
        crc = struct.unpack(">I", png[pos + 8 + n:pos + 12 + n])[0]
        assert zlib.crc32(kind + data) == crc, kind
        if kind == b"IHDR":
            w, h, depth, colour = struct.unpack(">IIBB", data[:10])
            assert (depth, colour) == (8, 2), (depth, colour)
        elif kind == b"IDAT":
            idat += data
        pos += 12 + n
    raw = zlib.decompress(idat)
    assert len(raw) == h * (1 + 3 * w)
    rows = []
    for y in range(h):
        r = raw[y * (1 + 3 * w):(y + 1) * (1 + 3 * w)]
        assert r[0] == 0  # no filter
        rows.append([tuple(r[1 + 3 * x:4 + 3 * x]) for x in range(w)])
    return w, h, rows


def check_pictures(ctx):
    """Mask.to_png: causal 64 x 64 in 16 x 16 tiles, one pixel per element:
    diagonal tiles partial (orange where allowed, pale above the diagonal),
    tiles below full (blue), above empty (white); tile lines grey."""
    png = ctx.mask("causal", 64, 64).to_png(16, 16)
    w, h, px = png_pixels(png)
    assert (w, h) == (64, 64), (w, h)
    blue, white = (31, 78, 161), (255, 255, 255)
    orange, pale = (230, 110, 0), (255, 236, 204)
    assert px[1][1] == orange and px[1][2] == pale, (px[1][1], px[1][2])
    assert px[1][17] == white, px[1][17]          # row block 0, key block 1
    assert px[17][1] == blue, px[17][1]           # row block 1, key block 0
    assert px[16][5] == (205, 205, 205)           # a tile line
    # Large masks are scaled down to max_side.
    w, h, _ = png_pixels(ctx.mask("sliding:256", 4096, 2048).to_png(max_side=256))
    assert (w, h) == (128, 256), (w, h)
    expect_error(lambda: ctx.mask("causal", 8, 8).to_png(max_side=8),
                 stof.StofError, "max_side")


class FakeWeight:
    """What Layer's checks read of a torch tensor (no torch here)."""

    def __init__(self, shape, ptr, dtype="f16"):
        self.shape, self.ptr, self.dtype = tuple(shape), ptr, dtype
        self.is_cuda, self.device = True, "cuda:0"

    def data_ptr(self):
        return self.ptr

    def get_device(self):
        return 0

    def is_contiguous(self):
        return True


def check_stack_bookkeeping():
    """Layer.stack_run's records of its calls, against a stub library:
    weights that are the tensors of a recent call are not checked again
    (only their addresses), whatever x and y are; a tensor replaced or
    given new storage is checked again; the remembered weight lists and the
    call records stay bounded however many x and y a server passes. No
    library call, no GPU."""
    calls = []

    class Lib:
        def stof_layer_stack_run(self, h, n, arr, x, y, stream, flags):
            calls.append(([arr[i].w_o for i in range(n)], x.value, flags))
            return 0

    class Ctx:
        _lib = Lib()
        _device = 0

        def _check_device(self, **tensors):  # (fake tensors: no device)
            pass

    checks = [0]

    class FakeLayer(stof.Layer):
        dtype = "f16"  # (the property imports torch)

        def _weights(self, w, device):
            checks[0] += 1
            return stof.Layer._weights(self, w, device)

    L = FakeLayer.__new__(FakeLayer)
    L._ctx, L._h, L._mask = Ctx(), 1, None
    L.batch, L.seq, L.hidden, L.heads, L.ffn = 1, 4, 8, 2, 16
    L.kv_heads, L.bias, L.gated, L.pre_norm, L.rms = 2, True, False, False, False
    L.qk_norm, L.head_dim = False, 4
    L._stacks, L._stack_order, L._checked = {}, [], {}
    ptr = [0x10000]

    def tensor(shape):
        ptr[0] += 0x1000
        return FakeWeight(shape, ptr[0])
    ws = [{n: tensor(sh) for n, sh in L._shapes().items()} for _ in range(3)]
    x, y = tensor((1, 4, 8)), tensor((1, 4, 8))

    def run(expect, what, xx=None, yy=None, wl=None):
        wl = ws if wl is None else wl
        before = checks[0]
        L.stack_run(wl, xx or x, yy or y, stream=7)
        got = checks[0] - before
        assert got == expect, "%s: %d layers checked, expected %d" % (what, got, expect)
        assert calls[-1][0] == [w["w_o"].ptr for w in wl], what
        assert calls[-1][1] == (xx or x).ptr, what

    run(3, "first call")
    run(0, "the same tensors")
    ws[:] = [dict(w) for w in ws]
    run(0, "new dicts of the same tensors")
    ws[1]["w_o"] = tensor((8, 8))
    run(3, "a tensor replaced")
    run(0, "that call again")
    ws[2]["w_o"].ptr += 0x100000  # new storage in place
    run(3, "a tensor given new storage")
    ws[0]["b_o"].shape = (9,)
    ws[0]["b_o"].ptr += 0x100000
    expect_error(lambda: L.stack_run(ws, x, y, stream=7), ValueError, "b_o")
    ws[0]["b_o"].shape = (8,)
    run(3, "the right shape again")
    # A server whose x and y move: the weights are not checked again, the
    # call records stay bounded, with the tensors of the newest calls only.
    for i in range(3 * stof.Layer._MAX_STACKS):
        run(0, "call %d with new x and y" % i, tensor((1, 4, 8)), tensor((4, 8)))
    assert len(L._stacks) == len(L._stack_order) == stof.Layer._MAX_STACKS
    keep = stof.Layer._KEEP_TENSORS
    kept = [k for k in L._stack_order if L._stacks[k][1] is not None]
    assert kept == L._stack_order[-keep:], len(kept)
    # Several weight lists in turn: the newest _KEEP_WEIGHTS are remembered.
    n_keep = stof.Layer._KEEP_WEIGHTS
    lists = []
    for i in range(n_keep + 1):
        wl = [dict(w) for w in ws]
        wl[0]["w_o"] = tensor((8, 8))
        lists.append(wl)
        run(3, "weight list %d" % i, wl=wl)
    run(0, "the newest list again", wl=lists[-1])
    run(0, "the oldest list still remembered", wl=lists[1])
    run(3, "a list forgotten", wl=lists[0])
    assert len(L._checked) == n_keep, len(L._checked)
    print("stack_run bookkeeping: ok (%d library calls)" % len(calls))


def main():
    check_score_mods()
    check_bias()
    check_stack_bookkeeping()
    lib = stof._load()
    version = lib.stof_version_string().decode()
    assert version.count(".") == 2, version
    # stof.__version__ is the library's, and the build's (meson's project
    # version, passed by the test's environment).
    assert stof.__version__ == version, (stof.__version__, version)
    want = os.environ.get("STOF_EXPECT_VERSION")
    assert not want or version == want, (version, want)
    ctx = stof.Context(require_device=False, user_db="")
    print("stof", version, "library", stof.library_path())
    check_log_callback()
    check_bias_library(lib, ctx)
    check_pictures(ctx)

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
    # Preloading: a bad limit, and without a GPU a clear error.
    expect_error(lambda: ctx.preload(-1), ValueError, "max_modules")
    if not lib.stof_has_device(ctx._h):
        expect_error(lambda: ctx.preload(), stof.StofError, "GPU")

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
    expect_error(lambda: ctx.attention_plan_packed(None, None, None, fam, [0, 8],
                                                   bias=(8, 8)),
                 ValueError, "packed")
    # Instance arrays must cover the problem: a head_window reaching the
    # head asked for, a bitmap with the rows and words of the problem.
    expect_error(lambda: hs.mask(10, 10, head=2, head_window=[1, 3]), ValueError,
                 "head_window has 2 entries")
    bm = ctx.mask_family("bitmap")
    full = [[-1] * 2 for _ in range(40)]  # 40 rows of 64 keys, all set
    assert count(bm.mask(40, 64, bitmap=full)) == 40 * 64
    # Word arrays go over as they are (no Python list of every word):
    # int32 with the top bit set, uint32, per sequence.
    import numpy as np
    assert count(bm.mask(40, 64, bitmap=np.full((40, 2), -1, np.int32))) == 40 * 64
    half = np.zeros((2, 40, 2), np.uint32)
    half[1, :, 1] = 0x80000001  # sequence 1: keys 32 and 63
    assert count(bm.mask(40, 64, b=1, bitmap=half)) == 40 * 2
    assert count(bm.mask(40, 64, b=0, bitmap=half)) == 0
    expect_error(lambda: bm.mask(41, 64, bitmap=full), ValueError, "40 rows")
    expect_error(lambda: bm.mask(40, 65, bitmap=full), ValueError, "65 keys need 3")
    expect_error(lambda: bm.mask(40, 64, b=1, bitmap=[full]), ValueError,
                 "1 sequences, the problem has 2")
    check_int_ranges(ctx, fam)
    check_masks_from_bits(ctx)
    check_specs(ctx)
    check_library_env()
    check_close_frees_children()
    # Contexts without a GPU are documented (the only way to the host paths
    # on a machine without one).
    assert "require_device=False" in stof.Context.__doc__
    print("ok")


def check_masks_from_bits(ctx):
    """mask_from_dense packs with numpy and goes through mask_from_bits: the
    same mask as a spec's, whatever the rows' padding holds; bad packed
    arrays are refused by name."""
    import numpy as np
    rng = np.random.default_rng(7)
    for sq, sk in ((1, 1), (5, 7), (9, 64), (33, 65), (100, 1000)):
        want = ctx.mask("causal", sq, sk)
        causal = np.tril(np.ones((sq, sk), dtype=np.uint8))
        assert ctx.mask_from_dense(causal).digest() == want.digest(), (sq, sk)
        assert ctx.mask_from_dense(causal.astype(bool).tolist()).digest() == \
            want.digest(), (sq, sk)
        bits = np.packbits(causal, axis=1, bitorder="little")
        # Noise past seq_k in the last byte and in extra bytes is ignored.
        pad = rng.integers(0, 256, size=(sq, bits.shape[1] + 3), dtype=np.uint8)
        pad[:, :bits.shape[1]] = bits
        if sk % 8:
            pad[:, bits.shape[1] - 1] |= np.uint8(0xff << (sk % 8) & 0xff)
        got = ctx.mask_from_bits(pad, sk)
        assert got.digest() == want.digest() and got.shape == (sq, sk), (sq, sk)
        r = rng.integers(0, 3, size=(sq, sk)).astype(np.int16)  # nonzero = allowed
        a = ctx.mask_from_dense(r)
        assert count(a) == int((r != 0).sum()), (sq, sk)
    expect_error(lambda: ctx.mask_from_bits(np.zeros((2, 1), np.uint8), 9),
                 stof.StofError, "row_bytes = 1")
    expect_error(lambda: ctx.mask_from_bits(np.zeros((2, 2), np.int32), 9),
                 ValueError, "uint8")
    expect_error(lambda: ctx.mask_from_dense(np.zeros(8)), ValueError, "2-D")


def check_int_ranges(ctx, fam):
    """Every integer that crosses into C is checked against its C type's
    range (ctypes would wrap 2**32 + 8 to 8) and must be an integer (no
    bool, no float), the argument and the range named; valid ones pass
    unchanged."""
    big = 2 ** 32 + 8
    expect_error(lambda: ctx.mask("causal", big, big), ValueError, "seq_q",
                 str(big), "2147483647")
    expect_error(lambda: ctx.mask("causal", 8, -2 ** 31 - 1), ValueError, "seq_k",
                 "-2147483648")
    expect_error(lambda: ctx.mask("causal", 8.0, 8), TypeError, "seq_q", "float")
    expect_error(lambda: ctx.mask("causal", True, 8), TypeError, "seq_q", "bool")
    expect_error(lambda: ctx.mask("causal", "8", 8), TypeError, "seq_q")
    expect_error(lambda: fam.mask(big, big), ValueError, "seq_q", "2147483647")
    expect_error(lambda: fam.mask(8, 8, b=2 ** 31), ValueError, "b =")
    expect_error(lambda: fam.mask(8, 8, head=2 ** 31), ValueError, "head =")
    expect_error(lambda: fam.mask(8, 8, q_len=[2 ** 32 + 4]), ValueError, "q_len[0]",
                 "2147483647")
    expect_error(lambda: fam.mask(8, 8, q_len=[8.0]), TypeError, "q_len[0]", "float")
    expect_error(lambda: fam.mask(8, 8, doc_id=[[0] * 7 + [2 ** 31]]), ValueError,
                 "doc_id[0][7]")
    m = ctx.mask("causal", 64, 64)
    expect_error(lambda: m.to_png(block_m=2 ** 40), ValueError, "block_m",
                 "2147483647")
    expect_error(lambda: m.to_png(block_m=2 ** 31), ValueError, "block_m",
                 str(2 ** 31))
    expect_error(lambda: m.to_png(block_n=16.0), TypeError, "block_n")
    expect_error(lambda: m.to_png(max_side=2 ** 32 + 256), ValueError, "max_side")
    expect_error(lambda: ctx.preload(2 ** 31), ValueError, "max_modules")
    expect_error(lambda: ctx.layer_plan(2 ** 31, 64, 64, 1, 64, "fp16", "relu",
                                        "layer", False, m), ValueError, "batch")
    expect_error(lambda: ctx.layer_plan(1, 64, 64, 1, 64, "fp16", "relu", "layer",
                                        False, m, kv_heads=2 ** 32 + 1),
                 ValueError, "kv_heads")
    # RoPE arguments: checked by the binding (types, C ranges) and by the
    # library before it needs a device (the values)
    def plan_rope(**kw):
        return ctx.layer_plan(1, 64, 128, 2, 256, "fp16", "silu", "rms", True,
                              m, **kw)
    expect_error(lambda: plan_rope(rope_theta="1e4"), TypeError, "rope_theta")
    expect_error(lambda: plan_rope(rope_theta=1e39), ValueError, "rope_theta")
    expect_error(lambda: plan_rope(rope_theta=10000.0, rope_dim=16.0),
                 TypeError, "rope_dim")
    for kw, words in ((dict(rope_theta=-1.0), ("rope_theta",)),
                      (dict(rope_theta=float("nan")), ("rope_theta",)),
                      (dict(rope_theta=0.5), ("rope_theta",)),
                      (dict(rope_dim=16), ("rope_dim", "rope_theta")),
                      (dict(rope_theta=1e4, rope_dim=22), ("rope_dim", "22")),
                      (dict(rope_theta=1e4, rope_dim=80), ("rope_dim", "64")),
                      (dict(rope_theta=1e4, rope_freq=[0.5] * 32),
                       ("rope_theta", "rope_freq")),
                      (dict(rope_freq=[1.0, 0.5, float("nan")] + [0.1] * 29),
                       ("rope_freq[2]",)),
                      (dict(rope_freq=[-1.0] + [0.1] * 15, rope_dim=32),
                       ("rope_freq[0]", "-1")),
                      (dict(rope_theta=1e4, rope_scale=-1.0), ("rope_scale",)),
                      (dict(rope_scale=2.0), ("rope_scale", "without RoPE"))):
        expect_error(lambda: plan_rope(**kw), stof.StofError, *words)
    # rope_freq: exactly the pairs the library reads (rope_dim / 2, or
    # head_dim / 2), numbers
    expect_error(lambda: plan_rope(rope_freq=[0.5] * 31), ValueError,
                 "rope_freq", "31 values", "32 pairs")
    expect_error(lambda: plan_rope(rope_freq=[0.5] * 32, rope_dim=32),
                 ValueError, "rope_freq", "16 pairs")
    expect_error(lambda: plan_rope(rope_freq=["0.5"] * 32), TypeError,
                 "rope_freq[0]")
    # (with head_dim: head_dim / 2 of them, not hidden // heads / 2)
    expect_error(lambda: plan_rope(rope_freq=[0.5] * 32, head_dim=128),
                 ValueError, "rope_freq", "32 values", "64 pairs")
    try:  # (64 pass the binding: planned on a GPU, refused without one)
        plan_rope(rope_freq=[0.5] * 64, head_dim=128).close()
    except stof.StofError as e:
        assert "needs a GPU" in str(e), e
    expect_error(lambda: plan_rope(rope_freq=[1e39] * 32), ValueError,
                 "rope_freq[0]")
    expect_error(lambda: plan_rope(rope_theta=1e4, rope_scale="2"), TypeError,
                 "rope_scale")
    # rope_args from a configuration: the default rope type gives its base
    # (transformers 5's rope_parameters, or 4's rope_theta), a partial
    # rotary its rope_dim; no RoPE, or one per layer type: refused
    from types import SimpleNamespace as NS
    cfg = NS(hidden_size=256, num_attention_heads=4,
             rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    assert stof.rope_args(cfg, 128) == {"rope_dim": 0, "rope_theta": 500000.0}
    cfg = NS(hidden_size=256, num_attention_heads=4, head_dim=64,
             rope_theta=10000.0, rope_scaling=None, partial_rotary_factor=0.25)
    assert stof.rope_args(cfg, 128) == {"rope_dim": 16, "rope_theta": 10000.0}
    expect_error(lambda: stof.rope_args(NS(hidden_size=256,
                                           num_attention_heads=4), 128),
                 ValueError, "rope_theta")
    expect_error(lambda: stof.rope_args(NS(
        hidden_size=256, num_attention_heads=4,
        rope_parameters={"full_attention": {"rope_theta": 1e6},
                         "sliding_attention": {"rope_theta": 1e4}}), 128),
        ValueError, "per layer type")
    # hf_layers: layer_plan's arguments from a Llama-family configuration
    # (Qwen2's Q/K/V biases, Qwen3's QK norm and head_dim, Mistral's
    # window), other families and activations refused
    from stof.integrations import hf_layers

    def cfg(mt, **kw):
        base = dict(model_type=mt, hidden_size=256, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=512,
                    rms_norm_eps=1e-6, hidden_act="silu",
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        base.update(kw)
        return NS(**base)
    kw = hf_layers.layer_kwargs(cfg("qwen2"), 128)
    assert kw == dict(hidden=256, heads=4, ffn=512, act="silu", norm="rms",
                      pre_norm=True, eps=1e-6, kv_heads=2, gated=True,
                      bias=True, qk_norm=False, rope_dim=0,
                      rope_theta=1e6), kw
    kw = hf_layers.layer_kwargs(cfg("qwen3", head_dim=128,
                                    attention_bias=False), 128)
    assert kw["qk_norm"] and kw["head_dim"] == 128 and not kw["bias"], kw
    kw = hf_layers.layer_kwargs(cfg("llama", head_dim=64, attention_bias=False,
                                    mlp_bias=False), 128)
    assert "head_dim" not in kw and not kw["bias"] and not kw["qk_norm"], kw
    assert hf_layers.mask_spec(cfg("mistral", sliding_window=4096)) == \
        "causal_sliding:4096"
    assert hf_layers.mask_spec(cfg("mistral", sliding_window=None)) == "causal"
    assert hf_layers.mask_spec(cfg("qwen2", sliding_window=4096,
                                   use_sliding_window=False)) == "causal"
    # (Qwen2/Qwen3: layer_types decide in transformers 5, else
    # use_sliding_window from max_window_layers on; Llama has no window)
    assert hf_layers.mask_spec(cfg("llama", sliding_window=16)) == "causal"
    assert hf_layers.mask_spec(cfg(
        "qwen3", sliding_window=16, use_sliding_window=True,
        max_window_layers=0, layer_types=["full_attention"] * 4)) == "causal"
    assert hf_layers.mask_spec(cfg(
        "qwen2", sliding_window=16, use_sliding_window=True,
        max_window_layers=4, layer_types=["sliding_attention"] * 4)) == \
        "causal_sliding:16"
    expect_error(lambda: hf_layers.mask_spec(cfg(
        "qwen2", sliding_window=16, use_sliding_window=True,
        layer_types=["sliding_attention", "full_attention"])), ValueError,
        "some layers only")
    assert hf_layers.mask_spec(cfg(  # (no use_sliding_window: no window)
        "qwen2", sliding_window=16,
        layer_types=["sliding_attention"] * 2)) == "causal"
    assert hf_layers.mask_spec(cfg(
        "qwen2", sliding_window=16, use_sliding_window=True,
        max_window_layers=0, num_hidden_layers=4)) == "causal_sliding:16"
    assert hf_layers.mask_spec(cfg(
        "qwen2", sliding_window=16, use_sliding_window=True,
        max_window_layers=4, num_hidden_layers=4)) == "causal"
    expect_error(lambda: hf_layers.mask_spec(cfg(
        "qwen2", sliding_window=4096, use_sliding_window=True,
        max_window_layers=2, num_hidden_layers=4)), ValueError,
        "some layers only")
    # (whole heads: a partial_rotary_factor is ignored by these models'
    # default rope, and refused with a scaled one; swish is SiLU; eps 0 and
    # biases a Mistral never has are not taken)
    kw = hf_layers.layer_kwargs(cfg("llama", rope_parameters={
        "rope_type": "default", "rope_theta": 1e4,
        "partial_rotary_factor": 0.5}, hidden_act="swish"), 128)
    assert kw["rope_dim"] == 0 and kw["rope_theta"] == 1e4, kw
    assert not hf_layers.layer_kwargs(cfg("mistral", attention_bias=True),
                                      128)["bias"]
    expect_error(lambda: hf_layers.layer_kwargs(cfg("llama", rms_norm_eps=0.0),
                                                128), ValueError, "rms_norm_eps")
    expect_error(lambda: hf_layers.layer_kwargs(cfg("gpt2"), 128), ValueError,
                 "'gpt2'")
    expect_error(lambda: hf_layers.layer_kwargs(cfg("llama", hidden_act="gelu"),
                                                128), ValueError, "gelu")
    expect_error(lambda: stof.Context(require_device=False, user_db="",
                                      device=2 ** 32), ValueError, "device")
    expect_error(lambda: stof._stream_handle(2 ** 64), ValueError, "stream")
    expect_error(lambda: stof._stream_handle(True), TypeError, "stream")
    B, H, S = 2, 4, 64
    q = FakeTensor((B, H, S, 64), contiguous((B, H, S, 64)))
    expect_error(lambda: stof._set_bias(stof._Desc(), ((B, H, S, S), (2 ** 66, S * S, S, 1)),
                                        q, S),
                 ValueError, "batch stride", str(2 ** 66))
    # Bitmap words are 32 bits, signed (pack_bitmap) or not; a seed 64.
    bm = ctx.mask_family("bitmap")
    assert count(bm.mask(4, 32, bitmap=[[2 ** 32 - 1]] * 4)) == 4 * 32
    assert count(bm.mask(4, 32, bitmap=[[-1]] * 4)) == 4 * 32
    expect_error(lambda: bm.mask(4, 32, bitmap=[[2 ** 32]] * 4), ValueError,
                 "bitmap[0][0]", "4294967295")
    d = stof._mask_data({"seed": [2 ** 64 - 1, -1]}, None, 2, 8, [])
    assert d.seed
    expect_error(lambda: stof._mask_data({"seed": [2 ** 64]}, None, 1, 8, []),
                 ValueError, "seed[0]")
    # Valid integers still work: the largest C int, and ints of other types.
    assert stof._c_int(2 ** 31 - 1, "x") == 2 ** 31 - 1
    assert count(fam.mask(8, 8, q_len=(8,))) == 36


def check_specs(ctx):
    """Spec arguments are str, refused by name otherwise (bytes too), and
    a NUL inside one (where C would cut it) is refused."""
    expect_error(lambda: ctx.mask(b"causal", 8, 8), TypeError, "spec", "str", "bytes")
    expect_error(lambda: ctx.mask(None, 8, 8), TypeError, "spec", "str")
    expect_error(lambda: ctx.mask_family(b"causal"), TypeError, "spec", "bytes")
    expect_error(lambda: ctx.mask("causal\0sliding:3", 8, 8), ValueError, "spec", "NUL")
    expect_error(lambda: ctx.mask_family("causal\0&docs"), ValueError, "spec", "NUL")
    expect_error(lambda: stof.Context(require_device=False, user_db="a\0b"),
                 ValueError, "user_db", "NUL")


def check_library_env():
    """A $STOF_LIBRARY that does not load is named in the error, with its
    path (a fresh load: the loaded library is put back afterwards)."""
    bad = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "no-such-dir", "libstof.so")
    saved_lib, saved_env = stof._lib, os.environ.get("STOF_LIBRARY")
    stof._lib = None
    os.environ["STOF_LIBRARY"] = bad
    try:
        expect_error(lambda: stof.__version__, OSError, "STOF_LIBRARY", bad)
    finally:
        stof._lib = saved_lib
        if saved_env is None:
            del os.environ["STOF_LIBRARY"]
        else:
            os.environ["STOF_LIBRARY"] = saved_env


def check_close_frees_children():
    """Context.close frees what was made from it first (the library needs
    them gone first); they refuse use afterwards instead of reading freed
    memory, and their own frees do nothing."""
    c = stof.Context(require_device=False, user_db="")
    m = c.mask("causal", 16, 16)
    f = c.mask_family("causal&docs")
    fm = f.mask(8, 8, q_len=[8])
    assert m._h and f._h and fm._h
    c.close()
    assert not m._h and not f._h and not fm._h and not c._h
    expect_error(lambda: m.digest(), stof.StofError, "freed")
    expect_error(lambda: m.to_png(), stof.StofError, "mask was freed")
    expect_error(lambda: f.mask(8, 8), stof.StofError, "freed")
    expect_error(lambda: f.spec, stof.StofError, "freed")
    # A plan whose context closed (freed: a NULL handle) says so.
    import ctypes
    p = stof.Plan(c, ctypes.c_void_p(), (1, 1, 8, 64), (1, 1, 8, 64), "bf16", None)
    expect_error(lambda: p.describe(), stof.StofError, "plan was freed")
    # Every method of the closed context refuses, saying so.
    closed = "stof: the context is closed"
    for call in (lambda: c.mask("causal", 8, 8), lambda: c.device(),
                 lambda: c.mask_family("causal"), lambda: c.preload(),
                 lambda: c.mask_from_dense([[1]]),
                 lambda: c.attention_plan(None, None, None, None),
                 lambda: c.attention_plan_family(None, None, None, None),
                 lambda: c.attention_plan_packed(None, None, None, None, [0, 8]),
                 lambda: c.layer_plan(1, 8, 64, 1, 64, "fp16", "relu", "layer",
                                      False, None)):
        expect_error(call, stof.StofError, closed)
    del m, f, fm
    c.close()  # twice: nothing


if __name__ == "__main__":
    main()
