#!/usr/bin/env python3
"""Plot bench_attention.py results: stof's speed-up over FlexAttention and
over SDPA per mask (log scale, parity line at 1), one panel per shape and
dtype. Reads the JSON files that bench_attention.py --json writes (several
files: several panels); needs matplotlib.

    python3 bench/plot_attention.py OUT.png RUN1.json [RUN2.json ...] [--title T]

SDPA's time is the one bench_attention.py compares with: flash attention
for the unmasked problem, is_causal for causal, a boolean mask otherwise.
"""
import argparse
import json
import sys

ORDER = ["none", "causal", "sliding", "dilated", "longformer", "bigbird", "strided"]


def sdpa_ms(r):
    """SDPA's time as bench_attention.py's "x sdpa" column takes it."""
    if r["mask"] == "none":
        return r.get("sdpa_dense_ms")
    if r["mask"] == "causal":
        return r.get("sdpa_causal_ms")
    return r.get("sdpa_mask_ms")


def panels(rows):
    """{(shape, dtype): {mask: row}} in first-seen order."""
    out = {}
    for r in rows:
        key = ("x".join(str(x) for x in r["shape"]), r["dtype"])
        out.setdefault(key, {})[r["mask"]] = r
    return out


def plot(rows, path, title=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    groups = panels(rows)
    n = len(groups)
    cols = min(n, 2)
    nrows = (n + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(6.4 * cols, 3.6 * nrows),
                             squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, ((shape, dtype), by_mask) in zip(axes.flat, groups.items()):
        masks = [m for m in ORDER if m in by_mask] + \
            [m for m in by_mask if m not in ORDER]
        flex = [by_mask[m]["flex_ms"] / by_mask[m]["stof_ms"] for m in masks]
        sdpa = [(sdpa_ms(by_mask[m]) or float("nan")) / by_mask[m]["stof_ms"]
                for m in masks]
        x = range(len(masks))
        w = 0.38
        b1 = ax.bar([i - w / 2 for i in x], flex, w, label="over FlexAttention",
                    color="#1f4ea1")
        b2 = ax.bar([i + w / 2 for i in x], sdpa, w, label="over SDPA",
                    color="#e66e00")
        for bars in (b1, b2):
            for b in bars:
                h = b.get_height()
                if h == h:  # not NaN
                    ax.annotate(f"{h:.2f}", (b.get_x() + b.get_width() / 2, h),
                                ha="center", va="bottom", fontsize=7,
                                xytext=(0, 1), textcoords="offset points")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(list(x))
        ax.set_xticklabels(masks, rotation=20, fontsize=8)
        ax.set_ylabel("speed-up of stof (x)")
        ax.set_title(f"{shape} {dtype}", fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the PNG to write")
    ap.add_argument("runs", nargs="+", help="bench_attention.py --json files")
    ap.add_argument("--title")
    a = ap.parse_args()
    rows = []
    for f in a.runs:
        with open(f) as fh:
            rows += json.load(fh)
    try:
        plot(rows, a.out, a.title)
    except ImportError:
        print("plot_attention: matplotlib is needed (pip install matplotlib)",
              file=sys.stderr)
        return 2
    print(f"wrote {a.out}: {len(panels(rows))} panels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
