"""The installed Python package (pip install ., which scripts/setup.sh runs
into $BUILD_DIR/venv): run with that environment's python from a
directory outside the source tree, stof must come from site-packages with
its own libstof.so, report the project's version, work without PyTorch for
masks, and say clearly what needs PyTorch. Skips (exit 77) when the
environment was not made (STOF_PACKAGE_PYTHON unset or missing)."""
import os
import subprocess
import sys
import tempfile

CHECK = r'''
import os, sys
import stof
pkg = os.path.dirname(os.path.abspath(stof.__file__))
assert os.path.realpath(pkg).startswith(os.path.realpath(sys.prefix)), \
    f"stof imported from {pkg}, not from the environment {sys.prefix}"
lib = stof.library_path()
assert lib == os.path.join(pkg, "libstof.so"), f"library {lib} is not the package's"
want = os.environ["STOF_EXPECT_VERSION"]
assert stof.__version__ == want, f"stof.__version__ {stof.__version__} != {want}"
# (the integrations installed too; hf_layers imports without torch)
from stof.integrations import hf_layers
assert os.path.dirname(os.path.abspath(hf_layers.__file__)) == \
    os.path.join(pkg, "integrations"), hf_layers.__file__
ctx = stof.Context(require_device=False, user_db="")
m = ctx.mask("causal", 64, 64)
assert abs(m.density - 65 * 32 / 4096) < 1e-12, m.density
try:
    import torch  # noqa: F401
    has_torch = True
except ImportError:
    has_torch = False
if not has_torch:
    try:
        m.to_dense()
    except ImportError as e:
        assert "needs PyTorch" in str(e), str(e)
    else:
        raise AssertionError("to_dense() without PyTorch did not say why")
print(f"stof {stof.__version__} from {pkg}; torch {'present' if has_torch else 'absent'}")
'''


def main():
    py = os.environ.get("STOF_PACKAGE_PYTHON", "")
    if not py or not os.path.exists(py):
        print(f"skip: no installed package to test (STOF_PACKAGE_PYTHON={py!r}: "
              "scripts/setup.sh makes it with pip install .)")
        return 77
    env = {k: v for k, v in os.environ.items()
           if k not in ("STOF_LIBRARY", "PYTHONPATH")}
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([py, "-c", CHECK], cwd=d, env=env,
                           capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if r.returncode == 0:
        print("ok")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
