"""Character tokenizer: one token id per symbol of the config's vocabulary.

The rule for characters outside the vocabulary: ``encode(text)`` raises
:class:`UnknownCharactersError`, which names every unknown character and where it first
occurs. ``errors="replace"`` substitutes the replacement symbol (the config's
``unk_symbol``, else ``"?"`` when the vocabulary has it) and ``errors="ignore"`` drops them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

ERROR_MODES = ("strict", "replace", "ignore")


class UnknownCharactersError(ValueError):
    """Raised by ``encode(errors="strict")``; ``.chars`` lists the unknown characters."""

    def __init__(self, chars: Sequence[str], first_positions: Sequence[int]):
        self.chars = list(chars)
        shown = ", ".join(
            f"{c!r} (U+{ord(c):04X}) at {p}" for c, p in zip(chars[:10], first_positions[:10])
        )
        more = f" and {len(chars) - 10} more" if len(chars) > 10 else ""
        super().__init__(f"characters outside the model's vocabulary: {shown}{more}")


class CharTokenizer:
    """Maps characters to ids and back; ``vocab[i]`` is the symbol of id ``i``."""

    def __init__(self, vocab: Sequence[str], unk_symbol: str | None = None):
        self.vocab = list(vocab)
        self.stoi = {s: i for i, s in enumerate(self.vocab)}
        if unk_symbol is None and "?" in self.stoi:
            unk_symbol = "?"
        if unk_symbol is not None and unk_symbol not in self.stoi:
            raise ValueError(f"unk_symbol {unk_symbol!r} is not in the vocabulary")
        self.unk_symbol = unk_symbol

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The sorted set of characters in ``text`` (nanoGPT's character vocabulary)."""
        return cls(sorted(set(text)))

    def __len__(self) -> int:
        return len(self.vocab)

    def unknown_chars(self, text: str) -> list[str]:
        """Characters of ``text`` outside the vocabulary, in order of first appearance."""
        return list(dict.fromkeys(c for c in text if c not in self.stoi))

    def encode(self, text: str, errors: str = "strict") -> list[int]:
        if errors not in ERROR_MODES:
            raise ValueError(f"errors must be one of {ERROR_MODES}, got {errors!r}")
        unknown = self.unknown_chars(text)
        if not unknown:
            return [self.stoi[c] for c in text]
        if errors == "strict":
            raise UnknownCharactersError(unknown, [text.index(c) for c in unknown])
        if errors == "ignore":
            return [self.stoi[c] for c in text if c in self.stoi]
        if self.unk_symbol is None:
            raise ValueError("errors='replace' needs an unk_symbol, and this vocabulary has none")
        unk = self.stoi[self.unk_symbol]
        return [self.stoi.get(c, unk) for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < len(self.vocab)]
        if bad:
            raise ValueError(f"token ids outside 0..{len(self.vocab) - 1}: {bad[:10]}")
        return "".join(self.vocab[i] for i in ids)
