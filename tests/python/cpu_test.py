"""The start of the Python tests that need PyTorch and transformers but no
GPU: import them and stof.integrations.transformers, or exit 77 (meson's
skip) saying what is missing; the source tree's python/ first on sys.path;
check() records each check, finish() gives the exit status; leaf() is the
reference of stof's structured specs."""
import importlib
import os
import sys

_failures = []


def require():
    """Import torch, transformers and stof.integrations.transformers (this
    tree's) or skip. Returns the integration module."""
    for name in ("torch", "transformers"):
        try:
            importlib.import_module(name)
        except ImportError as e:
            print(f"skip: {name} is not available ({e})")
            sys.exit(77)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "..", "python"))
    try:
        return importlib.import_module("stof.integrations.transformers")
    except OSError as e:  # the package loads libstof
        print(f"skip: libstof is not available ({e})")
        sys.exit(77)


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        _failures.append(what)


def finish():
    """The exit status: 1 when a check failed."""
    if _failures:
        print(f"{len(_failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


def leaf(spec, q, k):
    """The allowed keys of a structured stof spec ("dense", "causal",
    "causal_sliding:W", "sliding:W") at query positions q (a column
    tensor) and key positions k (a row tensor), as stof.h defines them."""
    import torch
    if spec == "dense":
        return torch.ones(q.shape[0], k.shape[1], dtype=torch.bool)
    if spec == "causal":
        return k <= q
    name, w = spec.split(":")
    w = int(w)
    if name == "causal_sliding":
        return (k <= q) & (q - k < w)
    if name == "sliding":
        return (q - k).abs() < w
    raise AssertionError(f"no reference for {spec}")
