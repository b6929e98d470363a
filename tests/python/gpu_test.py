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
