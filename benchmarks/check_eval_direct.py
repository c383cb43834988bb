"""Check ``python -m txl.evaluate --positions A:B --sliding W`` against a direct computation
on the real model and text: one plain ``model.forward`` per predicted token for the sliding
window, and the hidden-state memory of ``model.forward`` (not the key/value cache the
evaluation uses) for the memory rows.

    .venv/bin/python benchmarks/check_eval_direct.py --data tinyshakespeare.txt \\
        --positions 50000:50300 --sliding 64,192

Prints each row's loss both ways and exits 1 when any differs by more than --tol nats.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from txl import TransformerXL  # noqa: E402  (after the path set-up above)
from txl.data import load_text, train_val_split  # noqa: E402
from txl.evaluate import row_label  # noqa: E402


@torch.no_grad()
def direct_sliding(model, ids, window, start, stop) -> float:
    """Mean of -log p(ids[t] | ids[max(0, t-W) : t]), one forward per token."""
    total = 0.0
    for t in range(start, stop):
        x = ids[max(0, t - window) : t].unsqueeze(0)
        logits = model(x, mem_len=x.size(1)).logits[0, -1]
        total -= torch.log_softmax(logits, -1)[ids[t]].item()
    return total / (stop - start)


@torch.no_grad()
def direct_memory(model, ids, seg_len, mem_len, start, stop) -> float:
    """Segments of seg_len from token 0, the memory as hidden states (model.forward's
    mems), scoring tokens start .. stop-1 only."""
    mems, total = None, 0.0
    for a in range(0, stop - 1, seg_len):
        b = min(a + seg_len, stop - 1)
        out = model(ids[a:b].unsqueeze(0), mems if mem_len else None, mem_len=mem_len)
        mems = out.mems
        logp = torch.log_softmax(out.logits[0], -1)  # [b - a, V]: predicts a+1 .. b
        for t in range(max(a + 1, start), b + 1):
            total -= logp[t - 1 - a, ids[t]].item()
    return total / (stop - start)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ROOT / "weights" / "shakespeare-char"))
    p.add_argument("--data", required=True)
    p.add_argument("--positions", default="50000:50300")
    p.add_argument("--sliding", default="64,192")
    p.add_argument("--tol", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "eval.json"
        cmd = [sys.executable, "-m", "txl.evaluate", "--model", args.model, "--data", args.data,
               "--positions", args.positions, "--sliding", args.sliding, "--no-sweep",
               "--threads", str(args.threads), "--json", str(out)]
        subprocess.run(cmd, check=True, cwd=ROOT, stderr=subprocess.DEVNULL)
        result = json.loads(out.read_text())

    model = TransformerXL.from_pretrained(args.model).eval()
    _, val = train_val_split(load_text(args.data))
    ids = torch.tensor(model.tokenizer.encode(val))
    start, stop = result["positions"]
    seg, mem = model.config.tgt_len, model.config.mem_len
    checks = [(row_label(seg, window=int(w)), r["loss"],
               direct_sliding(model, ids, int(w), start, stop))
              for w, r in result["sliding"].items()]
    checks += [(row_label(seg, mem_len=n), row["loss"],
                direct_memory(model, ids, seg, n, start, stop))
               for n, row in ((mem, result["with_memory"]), (0, result["without_memory"]))]
    worst = 0.0
    for name, cli, direct in checks:
        worst = max(worst, abs(cli - direct))
        print(f"{name}: txl.evaluate {cli:.5f}, direct {direct:.5f}, "
              f"difference {cli - direct:+.1e} nats")
    print(f"positions {start}:{stop}: largest difference {worst:.1e} nats (tolerance {args.tol})")
    return 0 if worst <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
