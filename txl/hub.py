"""Finding a model's files: a local folder or a Hugging Face Hub repo id.

huggingface_hub raises a dozen exception types, and its mixin swallows some of them
(a missing repo then surfaces as a TypeError about __init__ arguments). Everything here
is turned into one :class:`TXLLoadError` whose message names the source, the file and
the cause, so the app can show it as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


class TXLLoadError(RuntimeError):
    """A model could not be loaded; the message says from where, which file and why."""


def fetch_file(
    source: str | Path,
    filename: str,
    revision: str | None = None,
    optional: bool = False,
    **hub_kwargs,
) -> Path | None:
    """Path to ``filename`` of a local folder, or of a Hub repo (downloaded or cached).
    optional: None when the folder or repo has no such file (other failures still raise)."""
    if not str(source).strip():
        raise TXLLoadError("no model given: pass a folder or a Hub repo id like 'org/name'")
    local = Path(source).expanduser()
    try:
        is_dir = local.is_dir()
    except OSError:  # ENAMETOOLONG & co: not a folder, maybe not a repo id either
        is_dir = False
    if is_dir:
        path = local / filename
        if optional and not path.exists():
            return None
        if not path.is_file():
            raise TXLLoadError(f"{source}: {filename} is missing from the folder")
        return path
    source = str(source)
    if "/" not in source or source.startswith((".", "/", "~")):
        raise TXLLoadError(f"{source!r} is neither a folder nor a Hub repo id like 'org/name'")
    try:
        validate_repo_id(source)
    except HFValidationError as e:
        raise TXLLoadError(f"{source!r} is not a valid Hub repo id: {e}") from None
    try:
        return Path(hf_hub_download(source, filename, revision=revision, **hub_kwargs))
    except GatedRepoError:  # before RepositoryNotFoundError: it is a subclass
        cause = "the repo is gated: accept its terms and log in"
    except RepositoryNotFoundError:
        cause = "the repo does not exist on the Hub (or is private)"
    except RevisionNotFoundError:
        cause = f"revision {revision!r} does not exist"
    except LocalEntryNotFoundError:  # before EntryNotFoundError and OSError: it is both
        cause = f"{filename} is not cached and the Hub cannot be reached (offline?)"
    except EntryNotFoundError:  # RemoteEntryNotFoundError
        if optional:
            return None
        cause = f"the repo has no {filename}"
    except HfHubHTTPError as e:
        cause = f"the Hub answered with an error: {e}"
    except (OSError, ValueError) as e:
        cause = f"download failed: {e}"
    raise TXLLoadError(f"{source}: {cause}")


def snapshot_commit(path: Path) -> str | None:
    """The commit sha of a file in the Hub cache (.../snapshots/<sha>/file), else None."""
    if path.parent.parent.name == "snapshots":
        return path.parent.name
    return None


def converted_cache_dir(repo_id: str, commit: str) -> Path:
    """Where a Hub checkpoint converted to the txl format is kept: $TXL_CACHE (default
    ~/.cache/txl) / converted / org--name / commit."""
    root = Path(os.environ.get("TXL_CACHE") or Path.home() / ".cache" / "txl")
    return root / "converted" / repo_id.replace("/", "--") / commit
