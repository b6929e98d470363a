"""A database built by stof-tune gives hits from Python (fleet-trust issue,
item 14): one problem is tuned with the CLI (BHSD tensors), then planned
from Python with the layouts Python users hold, (batch, heads, seq, dim)
and a (batch, seq, heads, dim) tensor seen through a transpose. Each plan
must come from the database ("user db") with nothing compiled or verified
(the record was tuned, and so verified, on this host), and compute the
same as PyTorch's attention with the same mask. Then a fresh context
preloads the database (Context.preload, and stof_open with
$STOF_PRELOAD=1) before planning.

Exit status 77 (skipped) without torch or a GPU."""
import os
import subprocess
import sys
import tempfile

from gpu_test import require

require()
import torch  # noqa: E402
import stof  # noqa: E402

SPEC, B, H, N, D = "bigbird:64:3:2:3:1", 2, 8, 2048, 64


def main():
    tune = os.environ.get("STOF_TUNE", "stof-tune")
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "fleet.db")
        subprocess.run([tune, "tune", "--mask", SPEC, "--shape",
                        "%dx%dx%dx%d" % (B, H, N, D), "--db", db],
                       check=True)
        ctx = stof.Context(user_db=db, tuning_mode="cache-only")
        mask = ctx.mask(SPEC, N, N)
        dense = mask.to_dense().cuda()
        torch.manual_seed(0)
        layouts = {
            "bhsd": lambda: torch.randn(B, H, N, D, device="cuda",
                                        dtype=torch.float16),
            "bshd": lambda: torch.randn(B, N, H, D, device="cuda",
                                        dtype=torch.float16).transpose(1, 2),
        }
        failures = 0
        for name, make in layouts.items():
            q, k, v, o = make(), make(), make(), make()
            plan = ctx.attention_plan(q, k, v, mask, out=o)
            d = plan.describe()
            ok = (d["source"] == "user db" and d["verify_ms"] == 0 and
                  d["compile_ms"] == 0)
            plan.run(q, k, v, o)
            torch.cuda.synchronize()
            ref = torch.nn.functional.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), attn_mask=dense)
            err = ((o.float() - ref).norm() / ref.norm()).item()
            ok = ok and err < 1e-2
            print("%s: source %s, compile %.1f ms, verify %.1f ms, "
                  "kernel %s, rel err %.2e: %s" % (
                      name, d["source"], d["compile_ms"], d["verify_ms"],
                      d["kernel"], err, "ok" if ok else "FAILED"))
            failures += not ok
        # A server's start: a fresh context preloads the database's
        # modules, and its plan then loads none.
        ctx = stof.Context(user_db=db, tuning_mode="cache-only")
        n, again = ctx.preload(), ctx.preload()
        q, k, v, o = (layouts["bhsd"]() for _ in range(4))
        d = ctx.attention_plan(q, k, v, ctx.mask(SPEC, N, N), out=o).describe()
        ok = n >= 1 and again == 0 and d["source"] == "user db"
        print("preload: %d modules, then %d; plan from %s: %s" % (
            n, again, d["source"], "ok" if ok else "FAILED"))
        failures += not ok
        # $STOF_PRELOAD=1: the same at stof_open, for programs that do not
        # call it (the PyTorch operator, the transformers integration).
        said = []
        os.environ["STOF_PRELOAD"] = "1"
        try:
            stof.Context(user_db=db, tuning_mode="cache-only",
                         log=lambda level, msg: said.append(msg),
                         log_level="info").close()
        finally:
            del os.environ["STOF_PRELOAD"]
        pre = [m for m in said if m.startswith("preload: ")]
        ok = len(pre) == 1 and not pre[0].startswith("preload: 0 modules")
        print("STOF_PRELOAD=1: %s: %s" % (pre, "ok" if ok else "FAILED"))
        failures += not ok
        print("%d passed, %d failed" % (len(layouts) + 2 - failures,
                                        failures))
        return 1 if failures else 0


sys.exit(main())
