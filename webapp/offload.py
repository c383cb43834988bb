"""A session's memory out of RAM and back, and what a session holds in RAM.

The server's memory budget (budget.py) decides when an idle session's memory goes to
disk; this module knows how: ``unload`` hands over the session's memory as named
tensors (its KV memory, pending logits, step history's arrays and the last step's score
terms) ready for safetensors, and ``reload`` gives them back, after which the session
continues token for token and logit for logit as if they had never left. Its text,
settings, sampler and records stay in RAM, and ``resident_bytes`` counts what the
session holds either way.
"""

from __future__ import annotations

import sys
import weakref
from collections import deque
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from txl.cached import KVMemory
from txl.session import Session, StepTrace, plain_bytes


def resident_bytes(session: Session) -> int:
    """Bytes a session holds in RAM besides the model's: its tensors (the KV buffers,
    spare room included: it is allocated; the pending logits, the step history, the
    last step's attention and terms) and its records (``record_bytes``). Once
    unloaded: what stays, the records and the last step's attention (the app's Export
    reads it without a request)."""
    kv = session.kv.buffer_bytes if session.kv else 0
    logits = session.next_logits.nbytes if session.next_logits is not None else 0
    history = 0 if is_unloaded(session) else session.history_bytes
    t = session.last_trace
    last = 0
    for array in (t.attentions, t.key_positions, t.terms) if t is not None else ():
        last += array.nbytes if array is not None else 0
    return kv + logits + history + last + record_bytes(session)


def record_bytes(session: Session) -> int:
    """Bytes of a session's plain Python records, which never leave RAM: the text and
    prompt, the token ids (a list of pointers; ids above 256 are int objects of their
    own), a word model's pieces, the memory-effect record (32 bytes per token), and the
    step records of the history and the last step (their predictions: ~3 KB a step).
    Measured against tracemalloc in tests/test_budget.py; O(1) but for the last step."""
    ids = sys.getsizeof(session.ids)
    if session.model.config.vocab_size > 257:  # -5..256 are shared int objects
        ids += sys.getsizeof(2**20) * len(session.ids)
    text = sys.getsizeof(session.text) + sys.getsizeof(session.prompt)
    # a word's piece: a str object (49 bytes) with its characters, ~8 on average (a
    # character model keeps an empty list: its text is its pieces)
    pieces = [] if session.tokenizer.unit == "character" else session.pieces
    pieces = sys.getsizeof(pieces) + 57 * len(pieces)
    effect = sum(sys.getsizeof(a) for a in vars(session.memory_effect).values())
    records = session.history_record_bytes + plain_bytes(session.last_trace)
    return ids + text + pieces + effect + records


@dataclass
class _Unloaded:
    """What stays in RAM of an unloaded memory: whether there was a KV memory, and the
    history's traces without their arrays."""

    kv: bool
    history: list[StepTrace]


# The sessions whose memory is out of RAM, held weakly: a session leaves when reload()
# gives its memory back, or when forget_unloaded() says it was cleared (reset()).
_unloaded: weakref.WeakKeyDictionary[Session, _Unloaded] = weakref.WeakKeyDictionary()


def is_unloaded(session: Session) -> bool:
    """Whether the session's memory is out of RAM (unload() was called, reload() not yet)."""
    return session in _unloaded


def forget_unloaded(session: Session) -> None:
    """The session was reset (or dropped) while its memory was out of RAM: there is
    nothing to reload any more."""
    _unloaded.pop(session, None)


def unload(session: Session) -> dict[str, Tensor]:
    """Hand over the session's memory as named tensors and drop it from the session: the
    KV memory (KVMemory.to_tensors), the pending logits, the step history's arrays and
    the last step's score terms (a big model's are megabytes). The text, the settings,
    the generator and the rest of the last step's trace stay. Until reload() with
    these tensors, the session must not be used."""
    if is_unloaded(session):
        raise RuntimeError("this session's memory is already unloaded")
    tensors: dict[str, Tensor] = {}
    if session.kv is not None:
        tensors.update({f"kv.{k}": t for k, t in session.kv.to_tensors().items()})
    if session.next_logits is not None:
        tensors["next_logits"] = session.next_logits
    for i, trace in enumerate(session.history):
        tensors[f"history.{i}.attentions"] = torch.from_numpy(trace.attentions)
        tensors[f"history.{i}.key_positions"] = torch.from_numpy(trace.key_positions)
    if session.last_trace is not None and session.last_trace.terms is not None:
        tensors["last_trace.terms"] = torch.from_numpy(session.last_trace.terms)
        session.last_trace = replace(session.last_trace, terms=None)
    _unloaded[session] = _Unloaded(
        kv=session.kv is not None,
        history=[replace(t, attentions=None, key_positions=None) for t in session.history],
    )
    session.kv, session.next_logits, session.history = None, None, deque()
    return tensors


def reload(session: Session, tensors: dict[str, Tensor]) -> None:
    """Give back the memory unload() handed over (read back from disk, say): the
    session continues exactly as if it had never been unloaded."""
    unloaded = _unloaded.get(session)
    if unloaded is None:
        raise RuntimeError("this session's memory is not unloaded")
    kv = {k.removeprefix("kv."): t for k, t in tensors.items() if k.startswith("kv.")}
    history = deque(
        replace(
            t,
            attentions=tensors[f"history.{i}.attentions"].numpy(),
            key_positions=tensors[f"history.{i}.key_positions"].numpy(),
        )
        for i, t in enumerate(unloaded.history)
    )
    session.kv = KVMemory.from_tensors(kv) if unloaded.kv else None
    session.next_logits = tensors.get("next_logits")
    if "last_trace.terms" in tensors:
        session.last_trace = replace(session.last_trace, terms=tensors["last_trace.terms"].numpy())
    session.history = history
    del _unloaded[session]
