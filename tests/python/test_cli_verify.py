"""`stof-tune verify` on records whose key holds more than their fields:
a grouped-query problem (kv_heads is in the key, not in the record) is
rebuilt with its K/V heads and checked like any other record; a soft-cap
problem (its value is launch data) is skipped with the reason, never
reported bad nor dropped; a plain problem passes. The records are tuned
from Python into a fresh database.

Exit status 77 (skipped) without torch or a GPU."""
import json
import os
import subprocess
import sys
import tempfile

from gpu_test import require

require()
import torch  # noqa: E402
import stof  # noqa: E402


def tensors(b, h, kvh, n, d):
    q = torch.randn(b, h, n, d, device="cuda", dtype=torch.float16)
    k = torch.randn(b, kvh, n, d, device="cuda", dtype=torch.float16)
    return q, k, torch.randn_like(k)


def main():
    tune = os.environ.get("STOF_TUNE", "stof-tune")
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "v.db")
        ctx = stof.Context(user_db=db)
        m = ctx.mask("causal", 256, 256)
        keys = {}
        for name, (kvh, cap) in {"gqa": (2, 0.0), "plain": (8, 0.0),
                                 "softcap": (8, 30.0)}.items():
            q, k, v = tensors(2, 8, kvh, 256, 64)
            p = ctx.attention_plan(q, k, v, m, softcap=cap)
            d = p.describe()
            assert d["source"] == "tuned", d
            keys[name] = d["key"]
            del p
        del ctx
        r = subprocess.run([tune, "verify", "--db", db, "--json"],
                           capture_output=True, text=True)
        print(r.stdout)
        print(r.stderr, file=sys.stderr)
        assert r.returncode == 0, r.returncode
        verdicts = {x["key"]: x for x in json.loads(r.stdout)["records"]}
        assert verdicts[keys["gqa"]]["verdict"] == "ok", verdicts
        assert verdicts[keys["plain"]]["verdict"] == "ok", verdicts
        sc = verdicts[keys["softcap"]]
        assert sc["verdict"] == "skipped" and "modifiers" in sc["why"], sc
        assert json.loads(r.stdout)["bad"] == 0
    print("ok")


if __name__ == "__main__":
    main()
