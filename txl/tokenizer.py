"""Tokenizers: characters (nanoGPT style) and words (WikiText-103 style).

Both share one interface: ``vocab`` (``vocab[i]`` is the symbol of id ``i``), ``stoi``,
``unk_symbol``, ``len()``, ``encode(text, errors)``, ``decode(ids)``,
``unknown_symbols(text)``, ``pieces(ids, previous)`` (the text of each token, so that a
display can grow token by token), ``start_id`` (the token an empty prompt starts from) and
``unit`` ("character" or "word").

The rule for symbols outside the vocabulary: ``encode(text)`` raises
:class:`UnknownTokensError` (:class:`UnknownCharactersError` for characters), which names
every unknown symbol. ``errors="replace"`` substitutes the replacement symbol (the
``unk_symbol``; for characters ``"?"`` when the vocabulary has it) and ``errors="ignore"``
drops them. What the app and the scores use is one lenient rule (``unknown_mode``:
replace when there is a replacement symbol, else drop), ``encode_known(text)``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

ERROR_MODES = ("strict", "replace", "ignore")


class UnknownTokensError(ValueError):
    """Raised by ``encode(errors="strict")``; ``.symbols`` lists the unknown symbols."""

    def __init__(self, symbols: Sequence[str], message: str | None = None):
        self.symbols = list(symbols)
        if message is None:
            shown = ", ".join(repr(s) for s in self.symbols[:10])
            more = f" and {len(self.symbols) - 10} more" if len(self.symbols) > 10 else ""
            message = f"words outside the model's vocabulary: {shown}{more}"
        super().__init__(message)


class UnknownCharactersError(UnknownTokensError):
    """Raised by ``CharTokenizer.encode(errors="strict")``; ``.chars`` lists the unknown
    characters (the same list as ``.symbols``)."""

    def __init__(self, chars: Sequence[str], first_positions: Sequence[int]):
        self.chars = list(chars)
        shown = ", ".join(
            f"{c!r} (U+{ord(c):04X}) at {p}" for c, p in zip(chars[:10], first_positions[:10])
        )
        more = f" and {len(chars) - 10} more" if len(chars) > 10 else ""
        super().__init__(chars, f"characters outside the model's vocabulary: {shown}{more}")


def _check_errors_mode(errors: str) -> None:
    if errors not in ERROR_MODES:
        raise ValueError(f"errors must be one of {ERROR_MODES}, got {errors!r}")


def _checked_ids(ids: Iterable[int], size: int) -> list[int]:
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < size]
    if bad:
        raise ValueError(f"token ids outside 0..{size - 1}: {bad[:10]}")
    return ids


def _ids_of(symbols: list[str], stoi: dict[str, int], errors: str,
            unk_symbol: str | None) -> list[int]:
    """Map symbols to ids; those outside ``stoi`` replaced or dropped as ``errors`` says."""
    if errors == "ignore":
        return [stoi[s] for s in symbols if s in stoi]
    if all(s in stoi for s in symbols):
        return [stoi[s] for s in symbols]
    if unk_symbol is None:
        raise ValueError("errors='replace' needs an unk_symbol, and this vocabulary has none")
    unk = stoi[unk_symbol]
    return [stoi.get(s, unk) for s in symbols]


class _LenientEncoding:
    """The one rule for symbols outside the vocabulary where nothing may be refused (a
    prompt, a text to score): replaced by ``unk_symbol`` when there is one, else dropped."""

    unk_symbol: str | None

    @property
    def unknown_mode(self) -> str:
        """``encode``'s ``errors`` under the lenient rule: "replace" or "ignore"."""
        return "replace" if self.unk_symbol is not None else "ignore"

    def encode_known(self, text: str) -> tuple[list[int], list[str]]:
        """(ids of ``text`` under the lenient rule, the unknown symbols it held, each once
        in order of appearance)."""
        return self.encode(text, errors=self.unknown_mode), self.unknown_symbols(text)


class CharTokenizer(_LenientEncoding):
    """Maps characters to ids and back; ``vocab[i]`` is the symbol of id ``i``."""

    unit = "character"

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

    @property
    def start_id(self) -> int:
        """An empty prompt starts a fresh line: the newline, else token 0."""
        return self.stoi.get("\n", 0)

    def tokenize(self, text: str) -> list[str]:
        return list(text)

    def unknown_symbols(self, text: str) -> list[str]:
        """Characters of ``text`` outside the vocabulary, in order of first appearance."""
        return list(dict.fromkeys(c for c in text if c not in self.stoi))

    unknown_chars = unknown_symbols  # the name from before word models

    def encode(self, text: str, errors: str = "strict") -> list[int]:
        _check_errors_mode(errors)
        unknown = self.unknown_symbols(text)
        if unknown and errors == "strict":
            raise UnknownCharactersError(unknown, [text.index(c) for c in unknown])
        return _ids_of(list(text), self.stoi, errors, self.unk_symbol)

    def pieces(self, ids: Iterable[int], previous: int | None = None) -> list[str]:
        """The text of each token: its character (``previous`` changes nothing)."""
        return [self.vocab[i] for i in _checked_ids(ids, len(self.vocab))]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.pieces(ids))


# One line of text -> words and punctuation marks, the way WikiText-103 is written. This is
# a light regex version of what the reference (the Moses tokenizer) does for English, except
# where WikiText itself differs: it splits "don't" as "do n't" (Penn Treebank; Moses gives
# "don 't") and keeps "–" and "—" as symbols ("1992 – 93"; Moses makes them hyphens).
# Order matters: the first alternative that matches at a position wins.
_WORD_PATTERN = re.compile(
    r"""
      (?P<special> <[^\s<>]+> )                 # <unk>, <eos>, <formula>
    | (?P<marker> @[-,.]@ )                     # WikiText's own joiners, typed as they are
    | (?P<number_sep> (?<=\d)[,.](?=\d) )       # inside a number: 23,000 1.80
    | (?P<hyphen> (?<=[\w>])-(?=[\w<]) )        # inside a word: well-known, <unk>-based
    | [^\W\d_]+(?:\.[^\W\d_]+)+\.?              # dotted abbreviations: U.S. e.g. D.C.
    | \w+?(?=(?i:n't)(?!\w))                    # the "do" of "don't", the "ca" of "can't"
    | (?i:n't)(?!\w)                            # the "n't"
    | (?<=[\w>])'\w+                            # other clitics: it's -> it 's, <unk>'s
    | \w+                                       # a word or a number
    | \.\.\. | -+                               # an ellipsis, a dash
    | \S                                        # any other mark, on its own
    """,
    re.VERBOSE,
)

# Display rules for decode/pieces: how WikiText's tokens are written back as text.
_JOINERS = {"@-@": "-", "@,@": ",", "@.@": "."}  # written with no space either side
_NO_SPACE_BEFORE = frozenset([",", ".", ";", ":", "!", "?", ")", "]", "}"])
_NO_SPACE_AFTER = frozenset(["(", "[", "{"])
_CLITIC = re.compile(r"(?i:n't)|'\w+")  # written against the word before: it's, don't

# Typographic quotes, read as the straight ones WikiText uses (unless the vocabulary has them).
_QUOTES = {"\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2018": "'", "\u2019": "'"}


class WordTokenizer(_LenientEncoding):
    """Maps WikiText-103-style words to ids and back; ``vocab[i]`` is the symbol of id ``i``.

    WikiText is words and punctuation marks separated by spaces, with "@-@" for a hyphen
    inside a word ("well @-@ known"), "@,@" and "@.@" inside numbers ("23 @,@ 000",
    "1 @.@ 80") and clitics split off ("it 's", "do n't"). A newline is the end-of-line
    symbol (the reference's add_eos puts one at each line end). ``encode`` splits plain
    English that way; ``decode`` writes the words back as plain text. Spacing is lost, so
    text does not round-trip, but ids do: ``encode(decode(ids)) == ids`` for WikiText-shaped
    ids.
    """

    unit = "word"

    def __init__(self, vocab: Sequence[str], unk_symbol: str | None = "<unk>",
                 eos_symbol: str = "<eos>"):
        self.vocab = list(vocab)
        self.stoi = {s: i for i, s in enumerate(self.vocab)}
        if len(self.stoi) != len(self.vocab):
            raise ValueError("the vocabulary has repeated symbols")
        if unk_symbol is not None and unk_symbol not in self.stoi:
            raise ValueError(f"unk_symbol {unk_symbol!r} is not in the vocabulary "
                             "(unk_symbol=None for a vocabulary without one)")
        if eos_symbol not in self.stoi:
            raise ValueError(f"eos_symbol {eos_symbol!r} is not in the vocabulary")
        self.unk_symbol = unk_symbol
        self.eos_symbol = eos_symbol
        self._quotes = str.maketrans({k: v for k, v in _QUOTES.items() if k not in self.stoi})

    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def start_id(self) -> int:
        """An empty prompt starts where an article line would: after an end of line."""
        return self.stoi[self.eos_symbol]

    # ---- text -> symbols ------------------------------------------------------------

    def tokenize(self, text: str) -> list[str]:
        """WikiText symbols of ``text``: each line's words, an end-of-line per newline."""
        symbols: list[str] = []
        lines = text.translate(self._quotes).split("\n")
        for i, line in enumerate(lines):
            if i:
                symbols.append(self.eos_symbol)
            for chunk in line.split():
                symbols.extend(self._split_chunk(chunk))
        return symbols

    def _split_chunk(self, chunk: str) -> list[str]:
        """One whitespace-free chunk -> symbols. A chunk that is itself a vocabulary word
        ("Mr.", "U.S.", "<unk>") was left whole by WikiText's tokenizer, so it stays whole."""
        if chunk in self.stoi:
            return [chunk]
        symbols: list[str] = []
        for match in _WORD_PATTERN.finditer(chunk):
            text = match.group()
            if match.lastgroup in ("number_sep", "hyphen"):
                text = f"@{text}@"
            # "Mr" "." -> "Mr." when the vocabulary has the abbreviation.
            if text == "." and symbols and symbols[-1] + "." in self.stoi:
                symbols[-1] += "."
            else:
                symbols.append(text)
        return symbols

    def unknown_symbols(self, text: str) -> list[str]:
        """Words of ``text`` outside the vocabulary, in order of first appearance."""
        return self._unknown(self.tokenize(text))

    def _unknown(self, symbols: list[str]) -> list[str]:
        return list(dict.fromkeys(s for s in symbols if s not in self.stoi))

    def encode(self, text: str, errors: str = "strict") -> list[int]:
        _check_errors_mode(errors)
        symbols = self.tokenize(text)
        unknown = self._unknown(symbols)
        if unknown and errors == "strict":
            raise UnknownTokensError(unknown)
        return _ids_of(symbols, self.stoi, errors, self.unk_symbol)

    # ---- ids -> text ----------------------------------------------------------------

    def _text(self, symbol: str) -> str:
        if symbol == self.eos_symbol:
            return "\n"
        return _JOINERS.get(symbol, symbol)

    def _space_between(self, before: str | None, symbol: str) -> str:
        """The space between two symbols, or none where plain text has none."""
        if before is None or self.eos_symbol in (before, symbol):
            return ""
        if before in _JOINERS or symbol in _JOINERS:
            return ""
        if before in _NO_SPACE_AFTER or symbol in _NO_SPACE_BEFORE or _CLITIC.fullmatch(symbol):
            return ""
        return " "

    def pieces(self, ids: Iterable[int], previous: int | None = None) -> list[str]:
        """The text of each token with the space before it, so that the pieces of ids
        that follow ``previous`` continue ``decode`` of the ids up to ``previous``."""
        ids = _checked_ids(ids, len(self.vocab))
        before = None if previous is None else self.vocab[_checked_ids([previous], len(self))[0]]
        pieces = []
        for i in ids:
            symbol = self.vocab[i]
            pieces.append(self._space_between(before, symbol) + self._text(symbol))
            before = symbol
        return pieces

    def decode(self, ids: Iterable[int]) -> str:
        """Plain text: single spaces, punctuation against its word, "@-@" as "-", "<eos>" as
        a newline."""
        return "".join(self.pieces(ids))
