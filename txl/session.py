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
``s.memory``, ``s.mem_len`` and ``s.seg_len`` are read-only: change them with the setters
or ``configure`` (every setting checked before any changes).

What the session is not: a scorer of texts (``txl.scoring.score_stages``: it needs the
model alone) or a server's accountant (it counts and hands over its own memory,
``footprint`` and ``export_state``, and the server never reaches into its fields).

Tokens are characters for a character model and words for a word model (the WikiText-103
Transformer-XL); "char" in the traces below means the token's text either way.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from .cached import KVMemory, cached_forward
from .checks import as_int, check_seed, check_temperature, check_top_p
from .model import TransformerXL
from .predictions import MemoryEffect, Predictions, add_counterfactual, predictions
from .sampling import gumbel_choice, sample_next
from .scoring import window_logits, window_scores

# Generate's counterfactual: the windows of this many generated tokens go to the
# model in one batch, behind the text (``Session.generate``).
BEHIND_BATCH = 16
# The scores of the tokens waiting behind the text, at most: beyond it the text waits for
# the oldest batch. A character model's 500 tokens hold 130 KB, never near it; a word
# model's hold a megabyte each (267k scores), so its text runs at most 16 tokens ahead.
BEHIND_BYTES = 16 << 20
# A step's records: its predictions (two top-10 lists of (id, text, p): ~3 KB measured),
# its token in the text, the ids and the memory-effect record (~41 bytes). An upper bound.
STEP_RECORD_BYTES = 4096


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


@dataclass(frozen=True)
class Footprint:
    """Bytes a session holds in RAM besides the model's, by what holds them (what a
    server's memory budget counts: ``Session.footprint``)."""

    kv: int  # the KV buffers, spare room included (it is allocated)
    logits: int  # the pending next-token scores
    history: int  # the step history's arrays (float16 attention, int32 key positions)
    last_step: int  # the newest step's attention, key positions and score terms
    # plain Python records, which never leave RAM: the text and prompt, the ids, a word
    # model's pieces, the memory-effect record, the steps' predictions
    records: int

    @property
    def total(self) -> int:
        return self.kv + self.logits + self.history + self.last_step + self.records


class _Record:
    """One history step's plain-record bytes, counted once as it joins the history and
    again if its counterfactual arrives later (Generate's, computed behind the text)."""

    __slots__ = ("bytes", "kept")

    def __init__(self, nbytes: int):
        self.bytes, self.kept = nbytes, True


# one _Record: the object and its size (an int object of its own: a record is > 256 bytes)
_RECORD_BYTES = sys.getsizeof(_Record(0)) + sys.getsizeof(2**20)


@dataclass
class _Behind:
    """A generated token whose counterfactual is still to come (``Session.generate``)."""

    position: int
    logits_with: Tensor  # [V] the scores it was drawn from
    predicted: Predictions  # its trace's, to be completed
    kept: StepTrace | None  # its history entry, if the history keeps it ...
    record: _Record | None  # ... and that entry's record bytes
    without: Tensor | None = None  # [V] the window's scores, once computed


def _counterfactual_batch(model, ids: list[int], positions: list[int], window: int) -> tuple:
    """The memory-off scores at ``positions`` of ``ids`` ([n, V], one batch), and the
    seconds they took. Runs on the counterfactual's own thread (one torch thread)."""
    t0 = time.perf_counter()
    scores = window_scores(model, ids, positions, window, batch_size=len(positions))
    return scores, time.perf_counter() - t0


_behind_pool: ThreadPoolExecutor | None = None
BEHIND_NICENESS = 5  # the counterfactual's thread yields the cores to the text (Linux)


def _behind_thread_starts() -> None:
    """One torch thread, and a lower priority than the thread that steps: the text comes
    first, the counterfactual takes what is left of the cores."""
    torch.set_num_threads(1)  # per OS thread: this one's
    try:
        tid = threading.get_native_id()
        os.setpriority(
            os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BEHIND_NICENESS)
        )
    except (AttributeError, OSError):  # not Linux, or not allowed: the same priority
        pass


def _behind_worker() -> ThreadPoolExecutor:
    """The thread that computes Generate's counterfactuals beside its steps (one for the
    process: a core beside the one that steps)."""
    global _behind_pool
    if _behind_pool is None:
        _behind_pool = ThreadPoolExecutor(
            1, thread_name_prefix="txl-counterfactual", initializer=_behind_thread_starts
        )
    return _behind_pool


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
        mem_len = as_int("mem_len", cfg.mem_len if mem_len is None else mem_len, 0)
        seg_len = as_int("seg_len", cfg.tgt_len if seg_len is None else seg_len, 1)
        temperature, top_p = check_temperature(temperature), check_top_p(top_p)
        top_k, seed = as_int("top_k", top_k, 0), check_seed(seed)
        history = as_int("history", history, 0)

        self.model = model
        self.tokenizer = model.tokenizer
        self.device = next(model.parameters()).device
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

    def configure(
        self,
        memory=None,
        mem_len=None,
        temperature=None,
        top_k=None,
        top_p=None,
        seed=None,
    ) -> None:
        """Apply the settings given (None: leave it), every one checked before any
        changes: a bad one raises ValueError and leaves the session as it was. The memory
        is rebuilt only when it changes (``set_mem_len``, ``set_memory``); a seed equal to
        the session's own does not restart the sampler."""
        checked = dict(
            temperature=None if temperature is None else check_temperature(temperature),
            top_k=None if top_k is None else as_int("top_k", top_k, 0),
            top_p=None if top_p is None else check_top_p(top_p),
            seed=None if seed is None else check_seed(seed),
            mem_len=None if mem_len is None else as_int("mem_len", mem_len, 0),
        )
        for name in ("temperature", "top_k", "top_p"):
            if checked[name] is not None:
                setattr(self, f"_{name}", checked[name])
        if checked["mem_len"] is not None and checked["mem_len"] != self._mem_len:
            self.set_mem_len(checked["mem_len"])
        if memory is not None:
            self.set_memory(bool(memory))
        if checked["seed"] is not None and checked["seed"] != self._seed:
            self.set_seed(checked["seed"])

    @property
    def unknown_mode(self) -> str:
        """What happens to characters the model does not know: "replace" (by the
        tokenizer's replacement symbol) or "ignore" (dropped): the tokenizer's one rule."""
        return self.tokenizer.unknown_mode

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
        self._top_k = as_int("top_k", value, 0)

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

    @property
    def history_bytes(self) -> int:
        """Bytes of the step history's arrays: what ``history_bytes_limit`` bounds."""
        return self._history_bytes

    @property
    def history_record_bytes(self) -> int:
        """Bytes of the step history's plain records (``plain_bytes`` of each step, counted
        as it joins and leaves the history, and when a counterfactual completes it)."""
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
        self.settle()
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
        n = as_int("mem_len", n, 0)
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
        n = as_int("seg_len", n, 1)
        self.settle()  # the counterfactuals still to come are of the old window
        self._seg_len = n
        if not self._memory_on and self.ids:
            self._forward_window(capture=False)

    # ---- text in --------------------------------------------------------------------

    def reset(self) -> None:
        """Empty text and memory; the generator restarts from the seed."""
        for future, _ in getattr(self, "_batches", ()):
            future.cancel()  # a Generate's counterfactual still to come: not needed now
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
        self._record_sizes: deque[_Record] = deque()  # the history's, oldest first
        self._history_records = 0  # their sum
        # Generate's tokens whose counterfactual is still to come, oldest first, and the
        # batches of them on the counterfactual's thread: (future, entries)
        self._pending: deque[_Behind] = deque()  # their memory effect still to add
        self._unsent: list[_Behind] = []  # not yet in a batch
        self._batches: deque[tuple[Future, list[_Behind]]] = deque()
        self._exported: dict | None = None  # what stays in RAM while export_state's are out
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
        """Token ids of text under the tokenizer's unknown-character rule, and the unknowns."""
        return self.tokenizer.encode_known(text)

    # ---- generation -----------------------------------------------------------------

    def step(
        self,
        capture: bool = True,
        terms: bool = True,
        token: int | None = None,
        behind: bool = False,
        gumbel: Tensor | None = None,
    ) -> StepTrace:
        """Sample one token from the pending logits, append it, run the model on it.
        capture: keep its attention (and, with ``terms``, its score terms: they read the
        keys a second time, ~10-30 % of a step). ``token``: append this token instead of
        sampling one (a text replayed, such as the character a Score found memory saved
        the most on); its predictions are computed all the same. ``behind``: its
        counterfactual (memory on) comes later, in a batch (``generate``); else now.
        ``gumbel``: [V] Gumbel draws to choose with instead of the session's generator
        (``gumbel_choice``: the same draws and the same distribution give the same token;
        txl/counterfactual.py)."""
        if not behind:
            self.settle()  # the tokens before it first: the memory effect is in text order
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
            token = as_int("token", token, 0)
            if token >= self._logits.numel():
                raise ValueError(f"token must be < {self._logits.numel()}, got {token}")
        position = len(self.ids)
        # What the token was drawn from, and what a memory-off Step would have drawn it
        # from: the last seg_len tokens before it, no memory (txl/predictions.py).
        t_cf = time.perf_counter()
        counterfactual = self._memory_on and self.counterfactual
        without = None
        if counterfactual and not behind:
            without = window_logits(self.model, self.ids, self._seg_len)
        logits_with = self._logits
        predicted = predictions(logits_with, without, token, self._token_text)
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
        if counterfactual and behind:
            kept = attentions is not None and self.history and self.history[-1].position == position
            entry = _Behind(
                position,
                logits_with,
                predicted,
                self.history[-1] if kept else None,
                self._record_sizes[-1] if kept else None,
            )
            self._pending.append(entry)
            self._unsent.append(entry)
            if len(self._unsent) >= BEHIND_BATCH:
                self._send_behind()
            self._drain()
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
        back = min(as_int("back", back, 0), len(self.history) - 1)
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
        self._record_sizes.append(_Record(plain_bytes(kept)))
        self._history_records += self._record_sizes[-1].bytes
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
            dropped, record = self.history.popleft(), self._record_sizes.popleft()
            self._history_bytes -= _trace_bytes(dropped)
            self._history_records -= record.bytes
            record.kept = False

    def generate(self, n: int, capture_last_only: bool = True) -> Iterator[StepTrace]:
        """n steps, yielding each trace as the model's cached step makes it.
        capture_last_only: only the last step captures attention (the others pay nothing
        for it); False: every step does. Only the last step computes its score terms (the
        history does not keep them).

        With memory on, a token's counterfactual (the memory-off model on the seg_len
        tokens before it: its Predictions' without-memory half and its ``memory_effect``
        entry) is computed behind the text: BEHIND_BATCH tokens' windows in one batch
        (``txl.scoring.window_batches``) on a thread of their own, one core beside the one
        that steps, filled in as they arrive. The last step's predictions are complete
        when it is yielded, and everything is when the generator is done (or closed)."""
        n = as_int("n", n, 0)  # checked now, not at the first next()

        def steps() -> Iterator[StepTrace]:
            try:
                for i in range(n):
                    last = i == n - 1
                    trace = self.step(
                        capture=not capture_last_only or last, terms=last, behind=True
                    )
                    if last and self._pending and self._pending[-1].position == trace.position:
                        self._fill_now(self._pending[-1])  # its memory effect follows in turn
                    yield trace
            finally:
                self.settle()

        return steps()

    # ---- the counterfactual behind the text (generate) ---------------------------------

    def _windows(self, entries: list[_Behind]) -> tuple[list[int], list[int]]:
        """(ids, positions) that give ``entries``' windows to ``window_batches``: the text
        from W before the first, positions shifted to match (a window at the text's start,
        shorter than W, keeps its place)."""
        first = max(0, entries[0].position - self._seg_len)
        return self.ids[first : entries[-1].position], [e.position - first for e in entries]

    def _send_behind(self) -> None:
        """The tokens not yet sent go to the counterfactual's thread as one batch; with
        more than BEHIND_BYTES of scores waiting, the oldest batch is waited for."""
        entries, self._unsent = self._unsent, []
        ids, positions = self._windows(entries)
        future = _behind_worker().submit(
            _counterfactual_batch, self.model, ids, positions, self._seg_len
        )
        self._batches.append((future, entries))
        if len(self._pending) * self._logits.nbytes > BEHIND_BYTES:
            self._batches[0][0].result()

    def _fill(self, entry: _Behind, without: Tensor, ms: float) -> None:
        """Complete a token's predictions with its window's scores [V]."""
        if entry.without is not None:
            return
        add_counterfactual(entry.predicted, entry.logits_with, without, self._token_text)
        entry.predicted.counterfactual_ms = ms
        entry.without = without
        if entry.record is not None and entry.record.kept:  # its history record grew
            size = plain_bytes(entry.kept)
            self._history_records += size - entry.record.bytes
            entry.record.bytes = size

    def _fill_batch(self, entries: list[_Behind], scores: Tensor, seconds: float) -> None:
        for entry, row in zip(entries, scores):
            self._fill(entry, row, seconds * 1e3 / len(entries))

    def _fill_now(self, entry: _Behind) -> None:
        """One token's counterfactual, computed here and now."""
        t0 = time.perf_counter()
        without = window_logits(self.model, self.ids[: entry.position], self._seg_len)
        self._fill(entry, without, (time.perf_counter() - t0) * 1e3)

    def _drain(self) -> None:
        """Take in the batches done, then add the memory effect of every token whose
        counterfactual is in, in text order."""
        while self._batches and self._batches[0][0].done():
            future, entries = self._batches.popleft()
            self._fill_batch(entries, *future.result())
        while self._pending and self._pending[0].without is not None:
            entry = self._pending.popleft()
            self.memory_effect.add(
                entry.position, entry.predicted.p_with, entry.predicted.p_without
            )

    def settle(self) -> None:
        """Every counterfactual still to come, now: the batches the thread has not started
        are computed here (beside the one it is on), then the rest is waited for."""
        if not self._pending:
            return
        if self._unsent:
            self._send_behind()
        batches, self._batches = list(self._batches), deque()
        for future, entries in batches:
            if future.cancel():  # not started: this thread takes it
                t0 = time.perf_counter()
                ids, positions = self._windows(entries)
                scores = window_scores(self.model, ids, positions, self._seg_len, len(positions))
                self._fill_batch(entries, scores, time.perf_counter() - t0)
        for future, entries in batches:
            if not future.cancelled():
                self._fill_batch(entries, *future.result())
        self._drain()

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

    # ---- what the session holds, and its memory out of RAM and back ------------------

    def footprint(self) -> Footprint:
        """Bytes this session holds in RAM besides the model's (a server's memory budget
        counts them): its tensors and its plain records, which never leave RAM
        (``records``: measured against tracemalloc in tests/test_budget.py; O(1) but for
        the last step). While its memory is out (``export_state``): what stays, the
        records and the last step's attention (the app's Export reads it)."""
        t = self.last_trace
        last = 0
        for array in (t.attentions, t.key_positions, t.terms) if t is not None else ():
            last += array.nbytes if array is not None else 0
        return Footprint(
            kv=self.kv.buffer_bytes if self.kv else 0,
            logits=self._logits.nbytes if self._logits is not None else 0,
            history=0 if self.exported else self._history_bytes,
            last_step=last,
            records=self._record_bytes(),
        )

    def _record_bytes(self) -> int:
        """The text and prompt, the token ids (a list of pointers; ids above 256 are int
        objects of their own), a word model's pieces, the memory-effect record (32 bytes
        per token), and the step records of the history and the last step (their
        predictions: ~3 KB a step)."""
        ids = sys.getsizeof(self.ids)
        if self.model.config.vocab_size > 257:  # -5..256 are shared int objects
            ids += sys.getsizeof(2**20) * len(self.ids)
        text = sys.getsizeof(self.text) + sys.getsizeof(self.prompt)
        # a word's piece: a str object (49 bytes) with its characters, ~8 on average (a
        # character model keeps an empty list: its text is its pieces)
        pieces = sys.getsizeof(self._pieces) + 57 * len(self._pieces)
        effect = sum(sys.getsizeof(a) for a in vars(self.memory_effect).values())
        # the bookkeeping: each history step's record size, the counterfactuals' queues
        books = sys.getsizeof(self._record_sizes) + _RECORD_BYTES * len(self._record_sizes)
        books += sum(sys.getsizeof(q) for q in (self._pending, self._unsent, self._batches))
        history = self._history_records + books
        return ids + text + pieces + effect + history + plain_bytes(self.last_trace)

    def growth(self, mem_len: int, steps: int) -> int:
        """The most this session's footprint can grow in a request run with memory length
        ``mem_len`` taking ``steps`` steps: a whole new KV buffer (buffers grow by copying,
        so the old and the new are both held for a moment, and a new prompt refills them),
        the pending logits, the steps' history and records, the last step's attention and
        score terms, and Generate's counterfactuals waiting behind its text."""
        c, element = self.model.config, next(self.model.parameters()).element_size()
        kv = memory_bytes_per_position(self.model) * KVMemory.capacity(mem_len + self._seg_len)
        logits = c.vocab_size * element
        keys = max(mem_len + 1, self._seg_len)  # what one step's query attends over
        step_history = c.n_layer * c.n_head * keys * 2 + keys * 4  # _remember: float16, int32
        history = min(steps, self.history_steps) * step_history
        if self.history_bytes_limit is not None:
            history = min(history, self.history_bytes_limit)
        # float32: the attention [L, H, K] and the four score terms [L, 4, H, K]
        last_step = 5 * c.n_layer * c.n_head * keys * 4 if steps else 0
        records = steps * STEP_RECORD_BYTES
        # the scores of the tokens waiting (each step's with memory, each batch's without)
        behind = 2 * min(steps * logits, BEHIND_BYTES + BEHIND_BATCH * logits) if steps > 1 else 0
        return kv + logits + history + last_step + records + behind

    @property
    def exported(self) -> bool:
        """Whether the session's memory is out of RAM (export_state, not yet import_state)."""
        return self._exported is not None

    def export_state(self) -> dict[str, Tensor]:
        """Hand over the session's memory as named tensors, ready for safetensors, and drop
        it from RAM: the KV memory (KVMemory.to_tensors), the pending logits, the step
        history's arrays and the last step's score terms (a big model's are megabytes).
        The text, the settings, the sampler and the rest of the last step's trace stay.
        Until ``import_state`` with these tensors, the session must not be used."""
        if self.exported:
            raise RuntimeError("this session's memory is already exported")
        self.settle()
        tensors: dict[str, Tensor] = {}
        if self.kv is not None:
            tensors.update({f"kv.{k}": t for k, t in self.kv.to_tensors().items()})
        if self._logits is not None:
            tensors["next_logits"] = self._logits
        for i, trace in enumerate(self.history):
            tensors[f"history.{i}.attentions"] = torch.from_numpy(trace.attentions)
            tensors[f"history.{i}.key_positions"] = torch.from_numpy(trace.key_positions)
        if self.last_trace is not None and self.last_trace.terms is not None:
            tensors["last_trace.terms"] = torch.from_numpy(self.last_trace.terms)
            self.last_trace = replace(self.last_trace, terms=None)
        self._exported = dict(
            kv=self.kv is not None,
            history=[replace(t, attentions=None, key_positions=None) for t in self.history],
        )
        self.kv, self._logits, self.history = None, None, deque()
        return tensors

    def import_state(self, tensors: dict[str, Tensor]) -> None:
        """Take back the memory ``export_state`` handed over (read back from disk, say):
        the session continues token for token and logit for logit as if it had never
        left."""
        if not self.exported:
            raise RuntimeError("this session's memory is not exported")
        kv = {k.removeprefix("kv."): t for k, t in tensors.items() if k.startswith("kv.")}
        self.history = deque(
            replace(
                t,
                attentions=tensors[f"history.{i}.attentions"].numpy(),
                key_positions=tensors[f"history.{i}.key_positions"].numpy(),
            )
            for i, t in enumerate(self._exported["history"])
        )
        self.kv = KVMemory.from_tensors(kv) if self._exported["kv"] else None
        self._logits = tensors.get("next_logits")
        if "last_trace.terms" in tensors:
            self.last_trace = replace(self.last_trace, terms=tensors["last_trace.terms"].numpy())
        self._exported = None

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
