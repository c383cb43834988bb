"""Average the weights of models fine-tuned from one start: a uniform model soup.

    .venv/bin/python scripts/average_weights.py runs/recall/phase39-other-speakers/model \\
        runs/recall/phase40-other-speakers-control/model --out runs/soup/39-40

Models trained from the same weights on different texts (or seeds) often lie in one basin
of the loss, where their mean is a model at least as good as each and sometimes better:
Wortsman et al. 2022, "Model soups" (arXiv 2203.05482), the uniform soup. Every model must
have the same config (same shapes, same vocabulary) but for ``mem_len``, which sets how much
memory the model keeps when it runs and no weight (the shipped folder says 512 where a
training run's says 128); the soup keeps the first model's. It is written as the models are
(config.json + model.safetensors, read by ``TransformerXL.from_pretrained``), in float32
whatever the ingredients' dtype, with ``soup.json`` naming what went in and, where the
ingredients' folders hold their training logs (txl.train's log.jsonl), ``loss_curve.png``
drawing them: a soup has no training curve of its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from txl import TransformerXL  # noqa: E402


def uniform_soup(models: list[TransformerXL]) -> TransformerXL:
    """A new model whose every parameter and buffer is the mean of the models' (float32)."""
    if len(models) < 2:
        raise ValueError("a soup needs at least two models")
    first = models[0]
    for other in models[1:]:
        # mem_len is how much memory a model keeps when it runs, not a weight: the first's
        if dataclasses.replace(other.config, mem_len=first.config.mem_len) != first.config:
            raise ValueError("the models' configs differ: only models of one config average")
    soup = TransformerXL(first.config)
    states = [m.state_dict() for m in models]
    mean = {
        name: torch.stack([s[name].float() for s in states]).mean(0)
        if value.is_floating_point() else value
        for name, value in states[0].items()
    }
    soup.load_state_dict(mean)
    return soup.eval()


def plot_ingredients(models: list[Path], png: Path) -> bool:
    """Each ingredient's validation loss (log.jsonl's ``val_loss``) against its steps, in
    one PNG; False, and nothing drawn, when a log or matplotlib is missing."""
    logs = [m / "log.jsonl" for m in models]
    try:
        import matplotlib
    except ImportError:
        return False
    if not all(log.exists() for log in logs):
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for model, log in zip(models, logs):
        rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
        label = model.parent.name if model.name == "model" else model.name
        ax.plot(*zip(*val), "o-", ms=3, label=f"{label} (validation, with memory)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/char)")
    ax.set_title("the soup's ingredients in training; the soup is their mean", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", type=Path, help="model folders (config + safetensors)")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    try:
        soup = uniform_soup([TransformerXL.from_pretrained(str(m)) for m in args.models])
    except ValueError as e:
        raise SystemExit(f"average_weights: {e}") from None
    soup.save_pretrained(args.out)
    (args.out / "soup.json").write_text(
        json.dumps({"uniform_soup_of": [str(m) for m in args.models]}, indent=2) + "\n"
    )
    drawn = plot_ingredients(args.models, args.out / "loss_curve.png")
    print(f"{args.out}: the mean of {len(args.models)} models"
          + ("" if drawn else " (no loss_curve.png: their logs, or matplotlib, missing)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
