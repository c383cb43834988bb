"""Read a word vocabulary (the symbol of each token id) without executing pickles.

The WikiText-103 Transformer-XL ships its vocabulary as a pickle: ``vocab.pkl`` (the
reference tokenizer's whole ``__dict__``) or ``vocab.bin`` (the same, ``torch.save``'d).
Unpickling runs whatever the file names, which is why transformers deleted TransfoXL.
We only need ``idx2sym``, a list of strings, so the unpickler here builds plain data
(dicts, lists, strings, numbers, ``Counter``, ``OrderedDict``) and nothing else:

* the reference tokenizer's own objects (sacremoses' Moses classes, compiled regexes,
  transformers' ``Trie`` and ``AddedToken``) become inert placeholders that run no code
  and are thrown away;
* every other global (``os.system``, ``builtins.eval``, ``subprocess.Popen``, torch's
  tensor rebuilders, ...) and every persistent id is refused with
  :class:`UnsafePickleError` before anything is called.

``torch.load`` is never called: a ``vocab.bin`` is read by hand (the ``data.pkl`` member
of the zip format, or the sequence of pickles of the legacy format).
"""

from __future__ import annotations

import _compat_pickle
import io
import json
import pickle
import zipfile
from collections import Counter, OrderedDict
from collections.abc import Mapping
from pathlib import Path

VOCAB_FILES = ("vocab.json", "vocab.pkl", "vocab.bin")

# torch.save's legacy (non-zip) format: these pickles come before the saved object.
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
TORCH_LEGACY_PROTOCOL = 1001


class UnsafePickleError(ValueError):
    """A pickle asked for something other than plain data; ``.name`` says what."""

    def __init__(self, name: str, path: str | Path):
        self.name = name
        self.path = str(path)
        super().__init__(
            f"{self.path}: refusing to unpickle {name}: a vocabulary file may hold only plain "
            "data (dict, list, str, numbers, Counter, OrderedDict); nothing was executed"
        )


class InertObject:
    """Stands in for an object of the reference tokenizer's state; it runs nothing.

    Creating one (REDUCE, NEWOBJ) ignores the arguments and restoring its state (BUILD)
    discards it, so a placeholder never holds or calls what the pickle handed it.
    """

    origin = "?"

    def __new__(cls, *args, **kwargs):
        return super().__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state) -> None:
        pass

    def __repr__(self) -> str:
        return f"<inert placeholder for {self.origin}>"


def _placeholder(qualname: str) -> type[InertObject]:
    name = qualname.rsplit(".", 1)[1]
    return type(name, (InertObject,), {"origin": qualname, "__module__": __name__})


# What transformers 4.37.2's save_vocabulary pickles besides plain data (pickletools.dis of
# a real file): compiled regexes go through re._compile; AddedToken came from
# transformers.tokenization_utils_base before `tokenizers` provided it.
INERT_GLOBALS = {
    qualname: _placeholder(qualname)
    for qualname in (
        "re._compile",
        "sacremoses.normalize.MosesPunctNormalizer",
        "sacremoses.tokenize.MosesTokenizer",
        "sacremoses.tokenize.MosesDetokenizer",
        "transformers.tokenization_utils.Trie",
        "tokenizers.AddedToken",
        "transformers.tokenization_utils_base.AddedToken",
    )
}


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """Protocols 0-2 write bytes as ``_codecs.encode(text, "latin1")``; only that is allowed
    (another codec name could make Python import a module to look it up)."""
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"_codecs.encode used for something else: {encoding!r}")
    return text.encode("latin1")


# The real thing, for plain data only. copyreg._reconstructor is deliberately absent: plain
# data never needs it, and it would call whichever class the pickle names.
SAFE_GLOBALS = {
    **{f"builtins.{t.__name__}": t for t in (dict, list, tuple, set, frozenset, str, bytes,
                                              bytearray, int, float, bool, complex)},
    "collections.OrderedDict": OrderedDict,
    "collections.Counter": Counter,
    "_codecs.encode": _latin1_bytes,
}


def _python3_name(module: str, name: str) -> str:
    """Pickles below protocol 3 spell some globals the Python 2 way (``__builtin__.set``)."""
    module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
    module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    return f"{module}.{name}"


class RestrictedUnpickler(pickle.Unpickler):
    """Builds plain data; known-inert globals become placeholders; anything else raises."""

    def __init__(self, file, path: str | Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        qualname = _python3_name(module, name)
        if qualname in SAFE_GLOBALS:
            return SAFE_GLOBALS[qualname]
        if qualname in INERT_GLOBALS:
            return INERT_GLOBALS[qualname]
        raise UnsafePickleError(qualname, self.path)

    def persistent_load(self, pid):
        """torch's tensors (and anything else stored outside the pickle) arrive this way."""
        raise UnsafePickleError(f"persistent id {pid!r}", self.path)


def _unpickle(file, path: str | Path):
    """One pickle from ``file`` through :class:`RestrictedUnpickler`, errors as ValueError."""
    try:
        return RestrictedUnpickler(file, path).load()
    except UnsafePickleError:
        raise
    except Exception as err:  # a truncated or corrupt pickle: any of a dozen error types
        raise ValueError(f"{path}: not a readable pickle ({type(err).__name__}: {err})") from err


def _torch_zip_state(path: Path):
    """The object in a zip-format torch.save file: its ``<archive>/data.pkl`` member."""
    with zipfile.ZipFile(path) as archive:
        members = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith("/data.pkl")]
        if len(members) != 1:
            raise ValueError(f"{path}: a zip file without exactly one <archive>/data.pkl")
        return _unpickle(io.BytesIO(archive.read(members[0])), path)


def _torch_legacy_state(file, path: Path):
    """After the magic number: protocol version, system info, then the saved object."""
    version = _unpickle(file, path)
    if version != TORCH_LEGACY_PROTOCOL:
        raise ValueError(f"{path}: unsupported torch.save protocol version {version!r}")
    _unpickle(file, path)  # sys_info: byte order and type sizes, plain data
    return _unpickle(file, path)


def _read_pickled_state(path: Path):
    """The object in a pickle, a legacy torch.save file or a zip torch.save file."""
    if zipfile.is_zipfile(path):
        return _torch_zip_state(path)
    with open(path, "rb") as file:
        state = _unpickle(file, path)
        # The reference's own check: "loading a torch-saved vocab with pickle gives an int".
        if type(state) is int and state == TORCH_LEGACY_MAGIC:
            return _torch_legacy_state(file, path)
        return state


def _checked_symbols(symbols, source: str) -> list[str]:
    """``symbols`` as a fresh list, once it is known to be distinct strings."""
    if type(symbols) not in (list, tuple):
        kind = type(symbols).__name__
        raise ValueError(f"{source}: idx2sym must be a list of strings, got {kind}")
    if not symbols:
        raise ValueError(f"{source}: the vocabulary is empty")
    bad = [(i, s) for i, s in enumerate(symbols) if type(s) is not str]
    if bad:
        i, s = bad[0]
        raise ValueError(f"{source}: symbol {i} is a {type(s).__name__}, not a string: {s!r}")
    seen: dict[str, int] = {}
    for i, s in enumerate(symbols):
        if s in seen:
            raise ValueError(f"{source}: symbol {s!r} appears twice (ids {seen[s]} and {i})")
        seen[s] = i
    return list(symbols)


def _symbols_from_mapping(sym2idx, source: str) -> list[str]:
    """idx2sym from a {symbol: id} mapping whose ids are exactly 0..n-1."""
    if not isinstance(sym2idx, Mapping):
        raise ValueError(f"{source}: sym2idx must be a mapping, got {type(sym2idx).__name__}")
    symbols: list[str | None] = [None] * len(sym2idx)
    for sym, idx in sym2idx.items():
        if type(sym) is not str or type(idx) is not int:
            raise ValueError(f"{source}: sym2idx entry {sym!r}: {idx!r} is not string: int")
        if not 0 <= idx < len(symbols) or symbols[idx] is not None:
            raise ValueError(
                f"{source}: sym2idx ids must be 0..{len(symbols) - 1}, each once; "
                f"{sym!r} has id {idx}"
            )
        symbols[idx] = sym
    return _checked_symbols(symbols, source)


def _symbols_from_state(state, source: str) -> list[str]:
    """idx2sym from a dict holding ``idx2sym`` and/or ``sym2idx``; both must agree."""
    if not isinstance(state, dict):
        raise ValueError(f"{source}: expected a dict with idx2sym / sym2idx, "
                         f"got {type(state).__name__}")
    if "idx2sym" not in state and "sym2idx" not in state:
        keys = ", ".join(sorted(repr(k) for k in state)[:20])
        raise ValueError(f"{source}: the dict has neither idx2sym nor sym2idx (keys: {keys})")
    from_list = _checked_symbols(state["idx2sym"], source) if "idx2sym" in state else None
    from_map = _symbols_from_mapping(state["sym2idx"], source) if "sym2idx" in state else None
    if from_list is not None and from_map is not None and from_list != from_map:
        first = next((i for i, (a, b) in enumerate(zip(from_list, from_map)) if a != b),
                     min(len(from_list), len(from_map)))
        raise ValueError(
            f"{source}: idx2sym ({len(from_list)} symbols) and sym2idx ({len(from_map)}) "
            f"disagree first at id {first}"
        )
    return from_list if from_list is not None else from_map


def load_pickled_vocab(path: str | Path) -> list[str]:
    """idx2sym from a ``vocab.pkl`` (pickled dict) or ``vocab.bin`` (torch.save'd dict)."""
    path = Path(path)
    return _symbols_from_state(_read_pickled_state(path), str(path))


def read_vocab_json(path: str | Path) -> list[str] | None:
    """idx2sym when ``vocab.json`` holds the mapping, else None.

    The mapping may be ``{symbol: id}`` with ids 0..n-1, ``{"idx2sym": [...]}`` (with or
    without ``sym2idx``) or a plain list. A JSON object with other content (a tokenizer
    config, say) is not a vocabulary: None. A mapping that is broken raises ValueError.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    if isinstance(data, list):
        return _checked_symbols(data, str(path))
    if not isinstance(data, dict):
        return None
    if "idx2sym" in data or "sym2idx" in data:
        return _symbols_from_state(data, str(path))
    if data and all(type(v) is int for v in data.values()):
        return _symbols_from_mapping(data, str(path))
    return None


def load_word_vocab(files: Mapping[str, str | Path]) -> list[str]:
    """idx2sym from the first usable of vocab.json (when it holds the mapping), vocab.pkl,
    vocab.bin among ``files`` ({file name: local path}; other names are ignored)."""
    tried = []
    if "vocab.json" in files:
        symbols = read_vocab_json(files["vocab.json"])
        if symbols is not None:
            return symbols
        tried.append("vocab.json (holds no symbol-to-id mapping)")
    for name in ("vocab.pkl", "vocab.bin"):
        if name in files:
            return load_pickled_vocab(files[name])
    absent = [name for name in VOCAB_FILES if name not in files]
    tried.append(f"{', '.join(absent)} (not given)")
    raise ValueError(f"no word vocabulary found: tried {'; '.join(tried)}")
