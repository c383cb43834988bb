"""Memory on | off, side by side: one prompt, two generations that share their randomness.

    pair = MemoryPair(model, temperature=0.8, seed=0)
    pair.start("ROMEO:\\n")
    for _ in pair.generate(200):
        pass
    pair.with_memory.text, pair.without_memory.text, pair.parting

The left side is a Session with memory (Transformer-XL: mem_len positions of keys and
values); the right side is the same model through its window of seg_len tokens,
recomputed from scratch at every step: a memory-off Session, the fair baseline that the
Watch tab's "without memory" prediction computes (``Session._forward_window``).

Both sides choose with the same noise: at generation step t (0: the first token after the
prompt) each side takes argmax_v (log p_side[v] + g_t[v]), g_t one Gumbel draw per
vocabulary entry from (seed, t) (``txl.sampling.gumbel_noise``). Equal distributions pick
the same token, so the texts stay identical until memory moves a choice: the **parting**.
After it each side goes on from its own text with the same per-step draws, so every
difference is memory's doing, not another roll of the dice.

Each side is exactly a plain Session stepped with ``step(gumbel=gumbel_noise(seed, t, V))``:
the pair adds the bookkeeping (steps, the parting, which positions differ), and costs one
memory step plus one forward over the window per step (the memory side computes no
counterfactual of its own: the window side is it, until the texts part).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from torch import Tensor

from .model import TransformerXL
from .predictions import TOP_K, log_probs, top_tokens
from .sampling import gumbel_noise
from .session import Session, StepTrace


@dataclass
class PairStep:
    """One step of both sides: step t wrote position ``position`` of each text."""

    step: int
    position: int
    with_memory: StepTrace
    without_memory: StepTrace

    @property
    def same(self) -> bool:
        return self.with_memory.token_id == self.without_memory.token_id


@dataclass
class Parting:
    """The first step at which the two sides chose differently, from one shared text: both
    distributions at that step (softmax at temperature 1, before top-k or top-p, as the
    Watch tab's bars show them), each side's choice with its probability under both, and
    where the memory side's last shared token looked when it made its prediction (its
    StepTrace: attention [n_layer, n_head, K] over text positions ``key_positions``)."""

    step: int
    position: int
    memory_token: int
    window_token: int
    memory_char: str
    window_char: str
    # p of each side's token under each distribution: [with memory, through the window]
    p_memory_token: tuple[float, float]
    p_window_token: tuple[float, float]
    top_memory: list[tuple[int, str, float]]  # (id, text, p), most likely first
    top_window: list[tuple[int, str, float]]
    looked: StepTrace | None  # the memory side's token at position - 1, as it was read

    def as_dict(self) -> dict:
        """Plain JSON: the API's and the page's parting point (6 significant digits)."""

        def tokens(top):
            return [[text, _round(p)] for _, text, p in top]

        return {
            "step": self.step,
            "position": self.position,
            "with_memory": {
                "char": self.memory_char,
                "p": _round(self.p_memory_token[0]),
                "p_without_memory": _round(self.p_memory_token[1]),
                "top": tokens(self.top_memory),
            },
            "without_memory": {
                "char": self.window_char,
                "p": _round(self.p_window_token[1]),
                "p_with_memory": _round(self.p_window_token[0]),
                "top": tokens(self.top_window),
            },
        }


def _round(x: float, digits: int = 6) -> float:
    return float(f"{x:.{digits}g}")


class MemoryPair:
    """Two Sessions of one model, stepping together from one prompt with shared noise.

    ``with_memory``: memory on with ``mem_len`` (``memory=False``: off too, so that both
    sides are the same computation: a check that the noise is all they share);
    ``without_memory``: memory off, the window of ``seg_len`` tokens. The sampling
    settings are the pair's and fixed for its life (a Session each, the same values)."""

    def __init__(
        self,
        model: TransformerXL,
        mem_len: int | None = None,
        seg_len: int | None = None,
        temperature: float = 0.8,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        memory: bool = True,
    ):
        sampling = dict(seg_len=seg_len, temperature=temperature, top_k=top_k, top_p=top_p)
        # No step history (the pair keeps what it shows), and the same seed for both: it
        # is the noise's, the generators are never read.
        self.with_memory = Session(
            model, memory=memory, mem_len=mem_len, seed=seed, history=0, **sampling
        )
        self.with_memory.counterfactual = False  # the window side computes it
        self.without_memory = Session(model, memory=False, seed=seed, history=0, **sampling)
        self.model = model
        self.seed = self.with_memory.seed
        self.vocab_size = model.config.vocab_size
        self.reset()

    @property
    def sessions(self) -> tuple[Session, Session]:
        return self.with_memory, self.without_memory

    @property
    def prompt(self) -> str:
        return self.with_memory.prompt

    def reset(self) -> None:
        """Both texts and memories empty; the noise starts again at step 0."""
        for s in self.sessions:
            s.reset()
        self.steps = 0  # generation steps taken since the prompt
        self.prompt_tokens = 0
        self.parting: Parting | None = None
        self.differing: list[int] = []  # text positions where the two texts differ
        self.last: PairStep | None = None

    def start(self, prompt: str) -> list[str]:
        """Both sides read the prompt (as Session.start reads it); the memory side keeps
        where its last token looked. Returns the unknown characters it held."""
        self.reset()
        unknown = self.with_memory.start(prompt, capture=True)
        self.without_memory.start(prompt)
        self.prompt_tokens = len(self.with_memory.ids)
        return unknown

    def token_text(self, token: int) -> str:
        """A token's text on its own (a word without the space before it)."""
        return self.model.tokenizer.pieces([token])[0]

    def noise(self, step: int) -> Tensor:
        """[V] the Gumbel draws both sides choose with at generation step ``step``."""
        return gumbel_noise(self.seed, step, self.vocab_size)

    def step(self) -> PairStep:
        """One token on each side, chosen with the same draws."""
        left, right = self.sessions
        if left.next_logits is None:
            self.start("")
        g = self.noise(self.steps)
        logits_memory, logits_window = left.next_logits, right.next_logits
        looked = left.last_trace  # the newest token as it was read: what predicts now
        position = len(left.ids)
        a = left.step(capture=True, terms=False, gumbel=g)
        b = right.step(capture=False, terms=False, gumbel=g)
        pair = PairStep(self.steps, position, a, b)
        if not pair.same:
            self.differing.append(position)
            if self.parting is None:
                self.parting = parting(pair, logits_memory, logits_window, looked, self.token_text)
        self.steps += 1
        self.last = pair
        return pair

    def generate(self, n: int) -> Iterator[PairStep]:
        """n steps of both sides, yielding each."""
        n = int(n)
        return (self.step() for _ in range(n))


def parting(
    pair: PairStep, logits_memory: Tensor, logits_window: Tensor, looked, token_text
) -> Parting:
    """The Parting of a step whose two tokens differ, from the two pending logits each
    side chose from (the same text before them) and the memory side's trace of the token
    that computed its logits."""
    lp_memory, lp_window = log_probs(logits_memory), log_probs(logits_window)
    x, y = pair.with_memory.token_id, pair.without_memory.token_id

    def named(top):
        return [(i, token_text(i), p) for i, p in top]

    return Parting(
        step=pair.step,
        position=pair.position,
        memory_token=x,
        window_token=y,
        memory_char=token_text(x),
        window_char=token_text(y),
        p_memory_token=(math.exp(float(lp_memory[x])), math.exp(float(lp_window[x]))),
        p_window_token=(math.exp(float(lp_memory[y])), math.exp(float(lp_window[y]))),
        top_memory=named(top_tokens(lp_memory, TOP_K)),
        top_window=named(top_tokens(lp_window, TOP_K)),
        looked=looked if looked is not None and looked.attentions is not None else None,
    )
