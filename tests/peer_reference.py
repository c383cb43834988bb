"""Run the reference TransfoXL (transformers 4.37.2) and save what it computes.

Run with the PEER virtual environment's python (transformers is not in ours):

    .venv-peer/bin/python tests/peer_reference.py SPEC.json

SPEC.json: {"cases": [CASE, ...]}; each CASE is

    {"out": "/folder", "config": {TransfoXLConfig kwargs}, "seed": 0, "init_std": 0.3,
     "segments": [7, 12, 1], "batch": 2, "safe_serialization": true}

For each case this builds TransfoXLLMHeadModel with peaky random weights (every parameter
drawn again with std init_std, so an off-by-one in the relative shift changes the
result), saves it with save_pretrained into OUT/model, then feeds the segments one after
the other starting from EMPTY memory (transformers' default memory is mem_len zero vectors
that are not masked, which the original code never does), carrying the memory, in eval
mode, once in float32 and once in float64. OUT/reference.safetensors holds:

    input_ids                [B, sum(segments)] int64
    DTYPE/logprobs.S         [B, T_S, vocab] log-probabilities of segment S
    DTYPE/mems.S.L           [M, B, d_model] memory of layer L after segment S (time-major)

DTYPE is float32 (the reference exactly as shipped) or float64. With peaky weights the
reference's own float32 rounding reaches 1e-5 to 1e-4 on log-probabilities near -100, so
only float64 can show agreement far below any real bug. transformers casts the attention
scores to float32 to mask them (for fp16), which fails in float64 ("value cannot be
converted to type float without overflow"); float64 runs therefore drop that one cast
(see float64_masking) and change nothing else.

"segments": [] only saves the model (for checkpoints our converter must refuse).
"words": [...] (optional) also writes OUT/model/vocab.pkl with the reference's word
tokenizer (TransfoXLTokenizer built from that list, saved with save_vocabulary: a pickle
of its whole __dict__, as the WikiText-103 checkpoint ships its vocabulary).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import sys
import textwrap
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import TransfoXLConfig, TransfoXLLMHeadModel
from transformers.models.deprecated.transfo_xl import modeling_transfo_xl

MASK_CAST = "attn_score.float().masked_fill("


def peaky_init(model: torch.nn.Module, std: float, generator: torch.Generator) -> None:
    """Every parameter ~ N(0, std), LayerNorm weights ~ N(1, std).

    transformers initialises u and v (r_w_bias / r_r_bias) and biases small or at zero;
    large random values make every term of the attention score matter.
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator) * std
            base = 1.0 if "layer_norm.weight" in name else 0.0
            p.copy_(base + noise)


@contextlib.contextmanager
def float64_masking():
    """Mask attention scores in their own dtype instead of float32, for float64 runs.

    Rewrites the two masking lines of RelPartialLearnableMultiHeadAttn.forward from
    ``attn_score.float().masked_fill(...).type_as(attn_score)`` to
    ``attn_score.masked_fill(...).type_as(attn_score)`` while the block runs, and puts the
    shipped forward back afterwards so float32 runs use transformers' code untouched.
    """
    cls = modeling_transfo_xl.RelPartialLearnableMultiHeadAttn
    shipped = cls.forward
    source = textwrap.dedent(inspect.getsource(shipped))
    if source.count(MASK_CAST) != 2:
        raise RuntimeError("unexpected transformers source: the float64 patch does not apply")
    namespace = {}
    patched = source.replace(MASK_CAST, "attn_score.masked_fill(")
    exec(patched, vars(modeling_transfo_xl), namespace)  # our own edit of their source
    cls.forward = namespace["forward"]
    try:
        yield
    finally:
        cls.forward = shipped


def run_segments(model, input_ids: torch.Tensor, segments: list[int], dtype) -> dict:
    """Log-probabilities and memories of each segment, memory carried from EMPTY."""
    model = model.to(dtype)
    batch, n_layer = input_ids.shape[0], model.config.n_layer
    mems = [torch.zeros(0, batch, model.config.d_model, dtype=dtype)] * n_layer
    prefix = str(dtype).removeprefix("torch.")
    tensors, start = {}, 0
    with torch.no_grad():
        for s, length in enumerate(segments):
            out = model(input_ids[:, start : start + length], mems=mems)
            start += length
            mems = out.mems
            tensors[f"{prefix}/logprobs.{s}"] = out.prediction_scores  # log-probabilities
            for layer, mem in enumerate(mems):
                tensors[f"{prefix}/mems.{s}.{layer}"] = mem
    return tensors


def save_word_vocab(words: list[str], out: Path) -> None:
    """OUT/model/vocab.pkl written by the reference tokenizer (needs sacremoses)."""
    from transformers import TransfoXLTokenizer

    (out / "words.txt").write_text("".join(w + "\n" for w in words))
    tokenizer = TransfoXLTokenizer(vocab_file=str(out / "words.txt"))
    tokenizer.save_vocabulary(str(out / "model"))


def build_model(case: dict) -> tuple[TransfoXLLMHeadModel, torch.Generator]:
    """The case's model with peaky weights, in eval mode, saved into OUT/model; and the
    seeded generator that drew them (it draws the input ids next)."""
    out = Path(case["out"])
    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(case.get("seed", 0))
    model = TransfoXLLMHeadModel(TransfoXLConfig(**case["config"]))
    peaky_init(model, case.get("init_std", 0.3), generator)
    model.eval()
    model.save_pretrained(out / "model", safe_serialization=case.get("safe_serialization", True))
    return model, generator


def run_case(case: dict) -> None:
    out = Path(case["out"])
    model, generator = build_model(case)
    config = model.config
    if "words" in case:
        save_word_vocab(case["words"], out)

    segments = case.get("segments", [])
    if not segments:
        return
    batch = case.get("batch", 2)
    input_ids = torch.randint(0, config.vocab_size, (batch, sum(segments)), generator=generator)
    tensors = {"input_ids": input_ids}
    tensors.update(run_segments(model, input_ids, segments, torch.float32))
    with float64_masking():
        tensors.update(run_segments(model, input_ids, segments, torch.float64))
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "reference.safetensors")


def main(run=run_case) -> None:
    """Run every case of the spec given as the first argument (tests/peer_terms.py passes
    its own ``run``)."""
    warnings.filterwarnings("ignore")  # deprecation notices of the TransfoXL port
    torch.set_num_threads(1)
    spec = json.loads(Path(sys.argv[1]).read_text())
    for case in spec["cases"]:
        run(case)
    print(json.dumps({"done": len(spec["cases"])}))


if __name__ == "__main__":
    main()
