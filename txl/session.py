"""A generation session: text in, one sampled token at a time out, memory on show.

    model = TransformerXL.from_pretrained("weights/shakespeare-char")
    s = Session(model, temperature=0.8, seed=0)
    s.start("ROMEO:")
    for trace in s.generate(200):
        print(trace.char, end="")

The contract with the app is docs/session_api.md. Two ways to predict the next token:

- memory on (Transformer-XL): the keys and values of the last ``mem_len`` positions sit in
  a ``KVMemory``; a step runs the model on the new token alone, which attends over the
  memory plus itself. A step costs O(mem_len), whatever the length of the text.
- memory off (the vanilla baseline): the model sees only the last ``seg_len`` tokens,
  recomputed from scratch at every step with no memory. A step costs O(seg_len²).

Either way the session holds *pending logits*: the next-token scores computed from the
last token fed. ``step`` samples from them, appends the token, and runs the model on it
to get the next pending logits. That order means a step is exactly one model call, and
the attention it captures is the attention of the token just generated.

Beyond the contract: ``s.kv`` (the KVMemory, None when memory is off), ``s.next_logits``
(the pending scores), ``s.set_seg_len(n)``, ``s.encode(text)``, ``s.unknown_mode``
("replace" or "ignore"), ``s.start_id`` (the token an empty prompt starts from) and
``s.pieces`` (the text of each token, indexable by token position).
``s.memory``, ``s.mem_len`` and ``s.seg_len`` are read-only: change them with the setters.

Tokens are characters for a character model and words for a word model (the WikiText-103
Transformer-XL); "char" in the traces below means the token's text either way.
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from .cached import KVMemory, cached_forward
from .model import TransformerXL
from .predictions import MemoryEffect, Predictions, predictions, window_logits
from .sampling import gumbel_choice, sample_next
from .scoring import (
    CONTEXT_SWEEP_LENGTHS,
    MOMENT_CONTEXT,
    MOMENTS,
    SLIDING_BATCH,
    ContextSweep,
    Moment,
    context_sweep,
    mean_or_nan,
    sliding_chunks,
    sliding_nll,
    stream_nll,
    top_moments,
)
from .threads import side_by_side

LN2 = math.log(2)


@dataclass
class StepTrace:
    token_id: int
    char: str  # the new token's text (a character, or a word with its leading space)
    position: int  # index of the new token in s.ids / s.text
    attentions: np.ndarray | None  # [n_layer, n_head, K] float32: the new token's attention
    key_positions: np.ndarray  # [K] int64: text position of each key (ascending)
    n_memory: int  # the first n_memory keys are memory, the rest current segment
    memory_tokens: int  # positions in memory after the step
    memory_bytes: int
    latency_ms: float  # wall time of the model call for this step
    memory: bool  # whether memory was on
    # [n_layer, 4, n_head, K] float32: the new token's score terms (a), (b), (c), (d)
    # (txl.model.score_terms), -inf on keys same_length hides. The newest step's only: the
    # history keeps attention alone (the terms are 4x its size).
    terms: np.ndarray | None = None
    # The next-token distribution this token was drawn from, and (memory on) the memory-off
    # model's over the last seg_len tokens: txl/predictions.py. None: not computed.
    predictions: Predictions | None = None


@dataclass
class ScoreResult:
    """One text scored three ways (all arrays [len(text) - 1], bits; bpc = their mean, NaN
    when nothing was scored; seconds = wall time of each way):

    - with: segments of seg_len read in order, each over a memory of mem_len (Transformer-XL);
    - without: the same segments, each read alone (no memory): context fragmentation;
    - sliding: every char predicted from exactly the ``window`` chars before it (the
      vanilla baseline), recomputed for each char, no memory.
    """

    chars: list[str]  # the characters of the text that were scored (positions 1..)
    bits_with: np.ndarray  # [len(text) - 1] surprisal of each char with memory, in bits
    bits_without: np.ndarray  # segments read alone
    bpc_with: float  # mean of bits_with (NaN when nothing was scored)
    bpc_without: float
    dropped: list[str]  # unknown chars removed/replaced before scoring
    bits_sliding: np.ndarray | None = None  # sliding window of ``window`` chars
    bpc_sliding: float = math.nan
    window: int = 0  # the sliding window's length (the session's seg_len)
    seg_len: int = 0
    mem_len: int = 0
    seconds_with: float = math.nan
    seconds_without: float = math.nan
    seconds_sliding: float = math.nan
    first: str = ""  # the text's first token (not scored: nothing comes before it)

    @property
    def pieces(self) -> list[str]:
        """The text as scored, token by token (position 0 is ``first``)."""
        return [self.first, *self.chars] if self.first or self.chars else []

    def moments(self, k: int = MOMENTS, context: int = MOMENT_CONTEXT) -> list[Moment] | None:
        """The ``k`` tokens where memory saved the most bits over the sliding window, most
        first, each with ``context`` tokens either side (``txl.scoring.top_moments``);
        None until the sliding window is scored."""
        if self.bits_sliding is None:
            return None
        if not self.chars:  # nothing was scored
            return []
        return top_moments(self.pieces, self.bits_with, self.bits_sliding, k, context)


@dataclass
class ScoreStage:
    """One stage of ``Session.score_stages``: which (``kind``), the ScoreResult so far (its
    sliding window filled in at "done"), the memory-length sweep once computed, and
    during the sliding window its progress: tokens done of ``total``, seconds left."""

    kind: str  # "reads", "sweep", "sliding" or "done"
    result: ScoreResult
    sweep: ContextSweep | None = None
    done: int = 0
    total: int = 0
    seconds_left: float = math.nan


# ---- validation: every setting is checked before anything changes -----------------------


def _as_int(name: str, value, minimum: int) -> int:
    """An int >= minimum; integral floats (a UI slider's 40.0) are accepted."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, (float, np.floating)) and not float(value).is_integer():
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _as_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def check_temperature(value) -> float:
    value = _as_float("temperature", value)
    if value < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {value}")
    return value


def check_top_p(value) -> float:
    value = _as_float("top_p", value)
    if not 0 < value <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {value}")
    return value


def check_seed(value) -> int:
    value = _as_int("seed", value, -(2**63))
    if value >= 2**64:  # torch.Generator.manual_seed's range
        raise ValueError(f"seed must be < 2**64, got {value}")
    return value


def memory_bytes_per_position(model: TransformerXL) -> int:
    """Bytes one position of a session's memory takes: a key and a value per layer."""
    c = model.config
    return 2 * c.n_layer * c.n_head * c.d_head * next(model.parameters()).element_size()


def _trace_bytes(trace: StepTrace) -> int:
    return trace.attentions.nbytes + trace.key_positions.nbytes


def plain_bytes(record, depth: int = 6) -> int:
    """Bytes of a record of plain Python data (a StepTrace's fields, its Predictions: two
    top-10 lists of (id, text, p) tuples), sys.getsizeof over it and all it holds, but
    for arrays (counted as arrays) and the objects CPython shares: None, booleans, small
    ints and one-character strings. A little over: the newest trace's Predictions, which
    the history shares, counts twice."""
    if isinstance(record, np.ndarray | Tensor) or record is None or isinstance(record, bool):
        return 0
    if isinstance(record, int) and -5 <= record <= 256:
        return 0
    if isinstance(record, str) and len(record) == 1 and ord(record) < 256:
        return 0
    size = sys.getsizeof(record)
    if depth == 0:
        return size
    if hasattr(record, "__dict__"):
        size += plain_bytes(vars(record), depth - 1)
    elif isinstance(record, dict):
        size += sum(plain_bytes(v, depth - 1) for v in record.values())
    elif isinstance(record, list | tuple):
        size += sum(plain_bytes(v, depth - 1) for v in record)
    return size


class Session:
    """Prompt + generated text, the model's memory of it, and the sampling settings.

    Invariant (memory on): every token of ``ids`` has been fed; the KV memory holds the
    keys and values of the text positions ``[n_fed - len(memory), n_fed)``, with
    ``n_fed == len(ids)``; ``_logits`` are the next-token scores of the last token.
    """

    def __init__(
        self,
        model: TransformerXL,
        memory: bool = True,
        mem_len: int | None = None,
        seg_len: int | None = None,
        temperature: float = 0.8,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        history: int = 256,
    ):
        if model.tokenizer is None:
            raise ValueError("a Session needs a model with a vocabulary (config.vocab is missing)")
        cfg = model.config
        # Validate everything first: a bad setting leaves no half-built session behind.
        mem_len = _as_int("mem_len", cfg.mem_len if mem_len is None else mem_len, 0)
        seg_len = _as_int("seg_len", cfg.tgt_len if seg_len is None else seg_len, 1)
        temperature, top_p = check_temperature(temperature), check_top_p(top_p)
        top_k, seed = _as_int("top_k", top_k, 0), check_seed(seed)
        history = _as_int("history", history, 0)

        self.model = model
        self.tokenizer = model.tokenizer
        self.device = next(model.parameters()).device
        # Unknown characters: replaced by the tokenizer's symbol when it has one, else dropped.
        self.unknown_mode = "replace" if self.tokenizer.unk_symbol is not None else "ignore"
        # An empty prompt starts from a fresh line (a newline, or <eos> for words).
        self.start_id = self.tokenizer.start_id

        self._memory_on, self._mem_len, self._seg_len = bool(memory), mem_len, seg_len
        self._temperature, self._top_k, self._top_p = temperature, top_k, top_p
        self._seed = seed
        # The last ``history_steps`` captured steps, their attention in float16, for a
        # view of any earlier step; ``history_bytes_limit`` (None: no limit) bounds their
        # bytes too, so that they count in a server's per-session memory cap.
        self.history_steps, self.history_bytes_limit = history, None
        # Whether a step with memory on also runs the memory-off model on the last seg_len
        # tokens (one forward over seg_len tokens: ~4x a memory step's cost for the bundled
        # model) for trace.predictions' counterfactual and the memory_effect record.
        self.counterfactual = True
        self.generator = torch.Generator(device=self.device)
        self.reset()

    # ---- settings -------------------------------------------------------------------

    @property
    def memory(self) -> bool:
        return self._memory_on

    @property
    def mem_len(self) -> int:
        return self._mem_len

    @property
    def seg_len(self) -> int:
        return self._seg_len

    @property
    def temperature(self) -> float:
        return self._temperature

    @temperature.setter
    def temperature(self, value) -> None:
        self._temperature = check_temperature(value)

    @property
    def top_k(self) -> int:
        return self._top_k

    @top_k.setter
    def top_k(self, value) -> None:
        self._top_k = _as_int("top_k", value, 0)

    @property
    def top_p(self) -> float:
        return self._top_p

    @top_p.setter
    def top_p(self, value) -> None:
        self._top_p = check_top_p(value)

    @property
    def pieces(self) -> str | list[str]:
        """The text of each token, indexed by token position: for a character model the
        text itself, for a word model a list (a word's piece carries its leading space)."""
        return self.text if self.tokenizer.unit == "character" else self._pieces

    @property
    def next_logits(self) -> Tensor | None:
        """[vocab] the pending next-token scores (None before anything was fed)."""
        return self._logits

    @next_logits.setter
    def next_logits(self, logits: Tensor | None) -> None:
        """Hand back the scores this session computed (a memory restored from disk)."""
        self._logits = logits

    @property
    def history_bytes(self) -> int:
        """Bytes of the step history's arrays: what ``history_bytes_limit`` bounds."""
        return self._history_bytes

    @property
    def history_record_bytes(self) -> int:
        """Bytes of the step history's plain records (``plain_bytes`` of each step, counted
        as it joins and leaves the history)."""
        return self._history_records

    @property
    def seed(self) -> int:
        return self._seed

    @seed.setter
    def seed(self, value) -> None:
        """The seed reset() and start() restart from (set_seed also reseeds at once)."""
        self._seed = check_seed(value)

    def set_seed(self, seed: int) -> None:
        self.seed = seed
        self.generator.manual_seed(self._seed)

    def set_memory(self, on: bool) -> None:
        """Off: drop the memory. On: rebuild it by re-feeding the last mem_len tokens of
        the text in segments (their memory is recomputed: what came before them is lost).
        Either way the pending logits are recomputed the new way."""
        on = bool(on)
        if on == self._memory_on:
            return
        self._memory_on = on
        self.kv = KVMemory() if on else None
        self._n_fed = 0
        if not self.ids:
            return
        if on:
            # At least the last token, so that there are pending logits (mem_len may be 0).
            tail = self.ids[-max(self._mem_len, 1) :]
            self._n_fed = len(self.ids) - len(tail)
            self._feed_memory(tail)
        else:
            self._forward_window(capture=False)

    def set_mem_len(self, n: int) -> None:
        """Shorter: the memory keeps its newest n positions now. Longer: it grows from now on.

        When positions are dropped, the pending logits (computed while the last token still
        saw them) are recomputed: the last token runs again over the n positions before it,
        so the very next token already feels the shorter memory.
        """
        n = _as_int("mem_len", n, 0)
        self._mem_len = n
        if self.kv is None or len(self.kv) <= n:
            return
        # The last token is the newest position of the memory: take it out, keep the n
        # before it, and feed it again (its keys and values are rewritten in place).
        self.kv.drop_last(1)
        self.kv.truncate(n)
        self._n_fed -= 1
        self._forward_memory(self.ids[-1:], capture=False)

    def set_seg_len(self, n: int) -> None:
        """Segment length of feed() and score(), and the window of the memory-off model
        (whose pending logits are then recomputed over the new window)."""
        self._seg_len = _as_int("seg_len", n, 1)
        if not self._memory_on and self.ids:
            self._forward_window(capture=False)

    # ---- text in --------------------------------------------------------------------

    def reset(self) -> None:
        """Empty text and memory; the generator restarts from the seed."""
        self.ids: list[int] = []
        self.text = ""
        self._pieces: list[str] = []
        self.prompt = ""
        self.kv: KVMemory | None = KVMemory() if self._memory_on else None
        self._n_fed = 0  # tokens fed through the KV memory: it covers the ones just before
        self._logits: Tensor | None = None  # [vocab] next-token scores after the last token
        self._context = 0  # keys the last token saw when _logits were computed
        self.last_trace: StepTrace | None = None
        self.history: deque[StepTrace] = deque()  # oldest first
        self._history_bytes = 0  # the history's arrays (what history_bytes_limit bounds)
        # and its records (plain_bytes, each computed once: ~0.1 ms)
        self._record_sizes: deque[int] = deque()  # the history's, oldest first
        self._history_records = 0  # their sum
        # p with and without memory of every token a step produced with memory on
        self.memory_effect = MemoryEffect()
        self.generator.manual_seed(self._seed)

    def start(self, prompt: str, capture: bool = False) -> list[str]:
        """Reset, then feed the prompt. Returns the unknown characters it held.
        ``capture``: as in feed."""
        self.reset()
        self.prompt = prompt
        return self.feed(prompt, capture)

    def feed(self, text: str, capture: bool = False) -> list[str]:
        """Append text: memory on, segment by segment of seg_len, the memory carried;
        memory off, one forward over the last seg_len tokens. Returns the unknown
        characters (each once, in order of appearance) that were replaced or dropped.
        ``capture``: ``last_trace`` becomes the attention of the text's last token as it
        was read (over the memory and its own segment): where the model looked for the
        prediction now pending. Its ``predictions`` are None (nothing was sampled) and the
        step history does not keep it."""
        new_ids, unknown = self.encode(text)
        if not self.ids and not new_ids:
            new_ids = [self.start_id]  # nothing to predict from: start a fresh line
        if not new_ids:
            return unknown
        self._append(new_ids)
        position = len(self.ids) - 1
        t0 = time.perf_counter()
        if self._memory_on:
            attentions, n_memory, first_key = self._feed_memory(new_ids, capture)
        else:
            attentions, _ = self._forward_window(capture)
            n_memory, first_key = 0, position + 1 - self._context
        if capture:
            latency_ms = (time.perf_counter() - t0) * 1e3
            self.last_trace = self._trace(
                position, attentions, None, n_memory, first_key, latency_ms
            )
        return unknown

    def encode(self, text: str) -> tuple[list[int], list[str]]:
        """Token ids of text under the session's unknown-character rule, and the unknowns."""
        unknown = self.tokenizer.unknown_symbols(text)
        return self.tokenizer.encode(text, errors=self.unknown_mode), unknown

    # ---- generation -----------------------------------------------------------------

    def step(
        self,
        capture: bool = True,
        terms: bool = True,
        token: int | None = None,
        gumbel: Tensor | None = None,
    ) -> StepTrace:
        """Sample one token from the pending logits, append it, run the model on it.
        capture: keep its attention (and, with ``terms``, its score terms: they read the
        keys a second time, ~10-30 % of a step). ``token``: append this token instead of
        sampling one (a text replayed, such as the character a Score found memory saved
        the most on); its predictions are computed all the same. ``gumbel``: [V] Gumbel
        draws to choose with instead of the session's generator (``gumbel_choice``: the
        same draws and the same distribution give the same token; txl/counterfactual.py)."""
        if self._logits is None:
            self.start("")
        if token is None and gumbel is not None:
            token = gumbel_choice(self._logits, gumbel, self._temperature, self._top_k, self._top_p)
        elif token is None:
            token = int(
                sample_next(
                    self._logits, self._temperature, self._top_k, self._top_p, self.generator
                )
            )
        else:
            token = _as_int("token", token, 0)
            if token >= self._logits.numel():
                raise ValueError(f"token must be < {self._logits.numel()}, got {token}")
        position = len(self.ids)
        # What the token was drawn from, and what a memory-off Step would have drawn it
        # from: the last seg_len tokens before it, no memory (txl/predictions.py).
        t_cf = time.perf_counter()
        without = None
        if self._memory_on and self.counterfactual:
            without = window_logits(self.model, self.ids, self._seg_len)
        predicted = predictions(self._logits, without, token, self._token_text)
        predicted.counterfactual_ms = (time.perf_counter() - t_cf) * 1e3
        if without is not None:
            self.memory_effect.add(position, predicted.p_with, predicted.p_without)
        self._append([token])

        t0 = time.perf_counter()
        if self._memory_on:
            n_memory = len(self.kv)  # memory positions [position - n_memory, position)
            attentions, terms = self._forward_memory([token], capture, terms)
            first_key = position - n_memory
        else:
            n_memory = 0
            attentions, terms = self._forward_window(capture, terms)
            first_key = len(self.ids) - min(len(self.ids), self._seg_len)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        latency_ms = (time.perf_counter() - t0) * 1e3
        self.last_trace = self._trace(
            position, attentions, terms, n_memory, first_key, latency_ms, predicted
        )
        if attentions is not None:
            self._remember(self.last_trace)
        return self.last_trace

    def _trace(
        self, position, attentions, terms, n_memory, first_key, latency_ms, predicted=None
    ) -> StepTrace:
        """The StepTrace of the token at ``position``, the model call that read it just
        made: its keys are the text positions [first_key, position], the first n_memory
        of them the memory; ``attentions`` / ``terms`` as the model returns them."""
        if attentions is not None:  # the last query's row: per layer [H, K] -> [L, H, K]
            attentions = torch.stack([a[0, :, -1] for a in attentions]).float().cpu().numpy()
        if terms is not None:  # per layer [4, H, K] -> [L, 4, H, K]
            terms = torch.stack([t[:, 0, :, -1] for t in terms]).float().cpu().numpy()
        return StepTrace(
            token_id=self.ids[position],
            char=self.pieces[position],
            position=position,
            attentions=attentions,
            key_positions=np.arange(first_key, position + 1, dtype=np.int64),
            n_memory=n_memory,
            memory_tokens=len(self.kv) if self.kv is not None else 0,
            memory_bytes=self._memory_bytes(),
            latency_ms=latency_ms,
            memory=self._memory_on,
            terms=terms,
            predictions=predicted,
        )

    def past_trace(self, back: int) -> StepTrace | None:
        """The captured step ``back`` steps before the newest one kept (0: the newest),
        or the oldest kept when fewer were kept; None when none was. Its attention is
        float16: the history keeps many steps in little memory."""
        if not self.history:
            return None
        back = min(_as_int("back", back, 0), len(self.history) - 1)
        return self.history[-1 - back]

    def _remember(self, trace: StepTrace) -> None:
        kept = replace(
            trace,
            attentions=trace.attentions.astype(np.float16),
            key_positions=trace.key_positions.astype(np.int32),
            terms=None,
        )
        self.history.append(kept)
        self._history_bytes += _trace_bytes(kept)
        self._record_sizes.append(plain_bytes(kept))
        self._history_records += self._record_sizes[-1]
        self._trim_history()

    def set_history_limit(self, limit_bytes: int | None) -> None:
        """Bound the step history's bytes (None: no bound), dropping its oldest steps now
        if it holds more: a lower limit takes effect at once, not at the next step."""
        self.history_bytes_limit = None if limit_bytes is None else max(0, int(limit_bytes))
        self._trim_history()

    def _trim_history(self) -> None:
        limit = self.history_bytes_limit
        while self.history and (
            len(self.history) > self.history_steps
            or (limit is not None and self._history_bytes > limit)
        ):
            dropped = self.history.popleft()
            self._history_bytes -= _trace_bytes(dropped)
            self._history_records -= self._record_sizes.popleft()

    def generate(self, n: int, capture_last_only: bool = True) -> Iterator[StepTrace]:
        """n steps, yielding each trace. capture_last_only: only the last step captures
        attention (the others pay nothing for it); False: every step does. Only the last
        step computes its score terms (the history does not keep them)."""
        n = _as_int("n", n, 0)  # checked now, not at the first next()

        def steps() -> Iterator[StepTrace]:
            for i in range(n):
                last = i == n - 1
                yield self.step(capture=not capture_last_only or last, terms=last)

        return steps()

    # ---- inspection -----------------------------------------------------------------

    def memory_info(self) -> dict:
        tokens = len(self.kv) if self.kv is not None else 0
        end = self._n_fed if self._memory_on else len(self.ids)
        context = self._context if self._memory_on else min(len(self.ids), self._seg_len)
        return {
            "memory": self._memory_on,
            "tokens": tokens,
            "mem_len": self._mem_len,
            "bytes": self._memory_bytes(),
            "span": (end - tokens, end),
            "context": context,
            "history_steps": len(self.history),
            "history_bytes": self.history_bytes,
        }

    def score(self, text: str, sliding: bool = True) -> ScoreResult:
        """Surprisal of each character of text given the ones before it, three ways: read
        in segments of seg_len with mem_len positions of memory; the same segments each
        read alone; and (``sliding``) a sliding window of seg_len chars recomputed for every
        char (seg_len times the work of the others). Each way is timed.
        The session's own text and memory are not touched. (``score_stages`` gives the
        same result in stages, the slow sliding window last.)"""
        *_, last = self.score_stages(text, sliding=sliding, sweep=False)
        return last.result

    def score_stages(
        self,
        text: str,
        sliding: bool = True,
        sweep: bool = True,
        pace=None,
        mem_lens=CONTEXT_SWEEP_LENGTHS,
        tolerance: float = 0.01,
    ) -> Iterator[ScoreStage]:
        """``score`` (and ``context_sweep``) in stages, fastest first, for a page that shows
        each as it comes: "reads" (memory and segments alone: a ScoreResult without the
        sliding window), "sweep" (the memory-length sweep; ``sweep=False`` skips it),
        "sliding" after every chunk of the sliding window (characters done, total, seconds
        left), and "done" (the whole ScoreResult). ``pace``: a context-manager factory
        around each chunk of work (webapp.longwork's ``job.turn``: threads, pauses, cancel);
        the sliding window's chunks, all alike, pass ``work=`` their windows; the reads
        (one per memory length) pass ``tasks=`` how many are left, and run as many side by
        side as the turn yields (``txl.threads.side_by_side``: one core each).
        The sweep reuses the two reads for memory 0 and mem_len: the same computation."""
        pace = pace or (lambda work=None, tasks=1: nullcontext(1))
        ids, unknown = self.encode(text)
        ids = torch.tensor(ids, dtype=torch.long)  # [L]
        streams = ids.view(1, -1)  # [1, L]: one stream
        seg_len, mem_len = self._seg_len, self._mem_len

        def timed(fn):
            t0 = time.perf_counter()
            nats = fn()
            return nats / LN2, time.perf_counter() - t0

        def reads(lengths) -> dict[int, tuple[Tensor, float]]:
            """The text read with each memory length: (bits [L-1], seconds) by length.
            Independent reads: pace() says how many run side by side (one core each)."""
            done, pending = {}, list(lengths)
            while pending:
                with pace(tasks=len(pending)) as at_once:
                    batch, pending = pending[:at_once], pending[at_once:]
                    tasks = [
                        lambda n=n: timed(lambda: stream_nll(self.model, streams, seg_len, n)[0])
                        for n in batch
                    ]
                    done.update(zip(batch, side_by_side(tasks, at_once)))
            return done

        if len(ids) > 1:  # warm up (the position table): else the first read's time pays
            with pace():
                stream_nll(self.model, streams[:, : seg_len + 1], seg_len, 0)
        first = reads(dict.fromkeys([mem_len, 0]))  # mem_len 0: one read
        (with_memory, s_with), (without, s_without) = first[mem_len], first[0]
        pieces = self.tokenizer.pieces(ids.tolist())
        result = ScoreResult(
            chars=pieces[1:],
            first=pieces[0] if pieces else "",
            bits_with=with_memory.numpy(),
            bits_without=without.numpy(),
            bpc_with=mean_or_nan(with_memory),
            bpc_without=mean_or_nan(without),
            dropped=unknown,
            window=seg_len,
            seg_len=seg_len,
            mem_len=mem_len,
            seconds_with=s_with,
            seconds_without=s_without,
        )
        total = max(len(ids) - 1, 0) if sliding else 0  # the sliding window's tokens
        yield ScoreStage("reads", result, total=total)

        swept = None
        if sweep:
            lengths = sorted({_as_int("mem_len", n, 0) for n in mem_lens})
            known = {**first, **reads([n for n in lengths if n not in first])}
            bpc = [mean_or_nan(known[n][0]) for n in lengths]
            seconds = [known[n][1] for n in lengths]
            swept = ContextSweep.of(lengths, bpc, seconds, seg_len, tolerance)
            yield ScoreStage("sweep", result, swept, total=total)

        if sliding:
            parts, s_sliding = [], 0.0
            for start, stop in sliding_chunks(len(ids), seg_len, SLIDING_BATCH):
                with pace(work=stop - start):
                    bits, took = timed(
                        lambda a=start, b=stop: sliding_nll(
                            self.model, ids, seg_len, a, b, batch_size=SLIDING_BATCH
                        )
                    )
                parts.append(bits)
                s_sliding += took
                done = stop - 1
                left = s_sliding / done * (total - done)
                yield ScoreStage("sliding", result, swept, done, total, left)
            bits_sliding = torch.cat(parts) if parts else torch.zeros(0)
            result = replace(  # a new result: the earlier stages' stays as it was
                result,
                bits_sliding=bits_sliding.numpy(),
                bpc_sliding=mean_or_nan(bits_sliding),
                seconds_sliding=s_sliding,
            )
        yield ScoreStage("done", result, swept)

    def context_sweep(
        self,
        text: str,
        mem_lens=CONTEXT_SWEEP_LENGTHS,
        tolerance: float = 0.01,
    ) -> ContextSweep:
        """Bits per char of text read in segments of seg_len with each memory length of
        ``mem_lens`` ("how far back does it read?"), and the effective context: the
        shortest memory within ``tolerance`` (1 %) of the best bpc. The session's own text
        and memory are not touched."""
        lengths = [_as_int("mem_len", n, 0) for n in mem_lens]
        ids, _ = self.encode(text)
        ids = torch.tensor(ids, dtype=torch.long)  # [L]
        return context_sweep(self.model, ids, self._seg_len, lengths, tolerance)

    def __repr__(self) -> str:
        info = self.memory_info()
        return (
            f"Session({len(self.ids)} tokens, memory={'on' if info['memory'] else 'off'} "
            f"{info['tokens']}/{info['mem_len']}, seg_len={self._seg_len}, "
            f"temperature={self._temperature}, top_k={self._top_k}, top_p={self._top_p}, "
            f"seed={self.seed})"
        )

    # ---- the model calls ------------------------------------------------------------

    def _memory_bytes(self) -> int:
        """KVMemory.nbytes, by arithmetic: the hot path need not slice 2·n_layer buffers."""
        return len(self.kv) * memory_bytes_per_position(self.model) if self.kv else 0

    def _token_text(self, token: int) -> str:
        """A token's text on its own (a word without the space before it)."""
        return self.tokenizer.pieces([token])[0]

    def _append(self, ids: list[int]) -> None:
        previous = self.ids[-1] if self.ids else None
        pieces = self.tokenizer.pieces(ids, previous)
        self.ids.extend(ids)
        self.text += "".join(pieces)
        if self.tokenizer.unit != "character":
            self._pieces.extend(pieces)

    def _feed_memory(self, ids: list[int], capture: bool = False) -> tuple:
        """Feed ids (the tokens after the first _n_fed) through the KV memory, seg_len at a
        time: O(len(ids)·(seg_len + mem_len)) work, not one quadratic forward.
        Returns the last segment's attentions (None unless ``capture``), and the memory it
        read: its length, and the text position of its first key."""
        attentions, n_memory, first_key = None, 0, self._n_fed
        starts = range(0, len(ids), self._seg_len)
        for a in starts:
            n_memory, first_key = len(self.kv), self._n_fed - len(self.kv)
            last = capture and a == starts[-1]
            attentions, _ = self._forward_memory(ids[a : a + self._seg_len], capture=last)
        if len(ids) > 1:
            # The room a segment needed is not needed by the steps to come, and a session's
            # buffers count in the server's memory budget: keep a quarter of spare room.
            self.kv.shrink(max(16, self._mem_len // 4))
        return attentions, n_memory, first_key

    @torch.no_grad()
    def _forward_memory(self, ids: list[int], capture: bool, terms: bool = False) -> tuple:
        """One segment [1, T] over the KV memory, which it joins. Sets the pending logits.
        Returns the model call's (attentions, score terms): None unless capture (and
        terms)."""
        x = torch.tensor([ids], dtype=torch.long, device=self.device)  # [1, T]
        keys = len(self.kv) + len(ids)  # what the last query attends over
        out = cached_forward(
            self.model,
            x,
            self.kv,
            output_attentions=capture,
            mem_len=self._mem_len,
            last_only=True,
            output_terms=capture and terms,
        )
        self._n_fed += len(ids)
        self._logits = out.logits[0, -1]  # [vocab]
        if self.model.config.same_length and keys > self._mem_len:
            keys = max(self._mem_len, 1)  # same_length hides the oldest (never the query)
        self._context = keys
        return out.attentions, out.terms

    @torch.no_grad()
    def _forward_window(self, capture: bool, terms: bool = False) -> tuple:
        """The vanilla model: the last seg_len tokens alone, from scratch. Sets the pending
        logits. mem_len = the window, so that same_length hides nothing inside it."""
        window = self.ids[-self._seg_len :]
        x = torch.tensor([window], dtype=torch.long, device=self.device)  # [1, W]
        out = cached_forward(
            self.model,
            x,
            None,
            output_attentions=capture,
            mem_len=len(window),
            last_only=True,
            output_terms=capture and terms,
        )
        self._logits = out.logits[0, -1]  # [vocab]
        self._context = len(window)
        return out.attentions, out.terms
