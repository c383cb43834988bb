"""Record what the reference TransfoXL's attention computes inside (for test_anatomy.py).

Run with the PEER virtual environment's python (transformers 4.37.2 is not in ours):

    .venv-peer/bin/python tests/peer_terms.py SPEC.json

SPEC.json is peer_reference.py's ({"cases": [{"out", "config", "seed", "init_std",
"segments", "batch"}]}). Each case builds the same peaky random model, saves it into
OUT/model, feeds the segments from EMPTY memory in float64 with output_attentions, and
writes OUT/terms.safetensors with, for segment S and layer L (all [B, H, T, K], unscaled,
before masking, keys in [memory | segment] order):

    input_ids   [B, sum(segments)]
    AC.S.L      (q + u) · k, the reference's own AC
    BD.S.L      rel_shift((q + v) · W_R R), the reference's own BD
    A.S.L       q · k       (the term (a), computed here from the reference's q and k)
    C.S.L       u · k       (the term (c), from the reference's u and k)
    attn.S.L    the attention probabilities the model returns

AC and BD are local variables of RelPartialLearnableMultiHeadAttn.forward: while the case
runs, its source is edited to hand them out (and to mask in float64, as
peer_reference.float64_masking does) and the shipped forward is put back afterwards.
"""

from __future__ import annotations

import contextlib
import inspect
import textwrap
from pathlib import Path

import peer_reference
import torch
from peer_reference import MASK_CAST
from safetensors.torch import save_file
from transformers.models.deprecated.transfo_xl import modeling_transfo_xl

SCORE_LINE = "attn_score = AC + BD"
# Hand out AC, BD, q·k and u·k before they are summed; the einsums are the reference's own
# index conventions (i query, j key, b batch, n head, d head width).
CAPTURE = (
    "_TXL_CAPTURED.append(dict(AC=AC, BD=BD, "
    'A=torch.einsum("ibnd,jbnd->ijbn", (w_head_q, w_head_k)), '
    'C=torch.einsum("nd,jbnd->jbn", (self.r_w_bias, w_head_k))[None].expand_as(AC))); ' + SCORE_LINE
)


@contextlib.contextmanager
def capturing_terms(captured: list):
    """RelPartialLearnableMultiHeadAttn.forward with the capture line and float64 masking."""
    cls = modeling_transfo_xl.RelPartialLearnableMultiHeadAttn
    shipped = cls.forward
    source = textwrap.dedent(inspect.getsource(shipped))
    if source.count(MASK_CAST) != 2 or source.count(SCORE_LINE) != 1:
        raise RuntimeError("unexpected transformers source: the capture patch does not apply")
    patched = source.replace(MASK_CAST, "attn_score.masked_fill(").replace(SCORE_LINE, CAPTURE)
    namespace = {}
    exec(patched, vars(modeling_transfo_xl), namespace)  # our own edit of their source
    modeling_transfo_xl._TXL_CAPTURED = captured
    cls.forward = namespace["forward"]
    try:
        yield
    finally:
        cls.forward = shipped
        del modeling_transfo_xl._TXL_CAPTURED


def run_case(case: dict) -> None:
    model, generator = peer_reference.build_model(case)
    config, out = model.config, Path(case["out"])
    model = model.double()

    segments, batch = case["segments"], case.get("batch", 2)
    input_ids = torch.randint(0, config.vocab_size, (batch, sum(segments)), generator=generator)
    tensors = {"input_ids": input_ids}
    mems = [torch.zeros(0, batch, config.d_model, dtype=torch.float64)] * config.n_layer
    start, captured = 0, []
    with torch.no_grad(), capturing_terms(captured):
        for s, length in enumerate(segments):
            captured.clear()
            result = model(input_ids[:, start : start + length], mems=mems, output_attentions=True)
            start += length
            mems = result.mems
            for layer, (terms, attn) in enumerate(zip(captured, result.attentions)):
                for name, t in terms.items():  # [T, K, B, H] -> [B, H, T, K]
                    tensors[f"{name}.{s}.{layer}"] = t.permute(2, 3, 0, 1)
                tensors[f"attn.{s}.{layer}"] = attn
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "terms.safetensors")


if __name__ == "__main__":
    peer_reference.main(run_case)
