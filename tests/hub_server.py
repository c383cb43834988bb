"""A loopback imitation of the Hugging Face Hub, enough for hf_hub_download and
snapshot_download (huggingface_hub 1.x / 2.x), so loading by repo id is tested offline.

    hub = FakeHub()
    hub.add_repo("someorg/tiny-txl", {"config.json": b"{...}", "model.safetensors": ...})
    with hub:                                  # serves on http://127.0.0.1:<free port>
        with hub_environment(hub.url, tmp_path / "hf"):
            TransformerXL.from_pretrained("someorg/tiny-txl")

Endpoints (what the client calls; see shared/notes/hub.md):

- HEAD / GET ``/{repo_id}/resolve/{revision}/{filename}``: the bytes, with the
  ``X-Repo-Commit`` and ``ETag`` headers the client needs to cache a file.
- GET ``/api/models/{repo_id}`` and ``/api/models/{repo_id}/revision/{revision}``:
  ``{"id", "sha", "siblings"}``.
- GET ``/api/models/{repo_id}/tree/{revision}[/{path}]``: ``[{"type", "path", "oid",
  "size"}]``.
- A miss is a 404 with ``X-Error-Code: RepoNotFound | RevisionNotFound | EntryNotFound``
  (or 401 ``GatedRepo`` for a repo added with ``gated=True``): the client turns these into
  its typed errors.

A repo is ``{revision: {filename: bytes}}``; each revision gets a stable 40-hex commit
sha, which is accepted as a revision too. Every request is logged in ``hub.requests``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

# A repo id is "name" or "namespace/name"; a revision is one URL segment (the client
# quotes "refs/pr/1" as "refs%2Fpr%2F1").
_REPO = r"(?P<repo>(?:[^/]+/)?[^/]+)"
_RESOLVE = re.compile(rf"^/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_INFO = re.compile(rf"^/api/models/{_REPO}(?:/revision/(?P<rev>[^/]+))?$")
_TREE = re.compile(rf"^/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<file>.+))?$")


def _commit_sha(repo_id: str, revision: str, files: dict[str, bytes]) -> str:
    h = hashlib.sha1(f"{repo_id}@{revision}".encode())
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


class _Miss(Exception):
    def __init__(self, code: str, message: str, status: int = 404):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


class FakeHub:
    """Repos served from memory on 127.0.0.1; start()/stop() or use as a context manager."""

    def __init__(self, repos: dict[str, dict[str, bytes]] | None = None):
        self.repos: dict[str, dict[str, dict[str, bytes]]] = {}  # repo -> revision -> files
        self.shas: dict[str, dict[str, str]] = {}  # repo -> revision -> commit sha
        self.gated: set[str] = set()
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        for repo_id, files in (repos or {}).items():
            self.add_repo(repo_id, files)

    # ---- content ---------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes],
        revision: str = "main",
        gated: bool = False,
    ) -> str:
        """Add (or replace) one revision of a repo; returns its commit sha."""
        files = {name: bytes(data) for name, data in files.items()}
        self.repos.setdefault(repo_id, {})[revision] = files
        sha = _commit_sha(repo_id, revision, files)
        self.shas.setdefault(repo_id, {})[revision] = sha
        if gated:
            self.gated.add(repo_id)
        return sha

    def add_folder(self, repo_id: str, folder: str | Path, **kwargs) -> str:
        """Add every file of ``folder`` (recursively) as a repo revision."""
        folder = Path(folder)
        files = {
            p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }
        return self.add_repo(repo_id, files, **kwargs)

    def _lookup(self, repo_id: str, revision: str) -> tuple[str, dict[str, bytes]]:
        if repo_id not in self.repos:
            raise _Miss("RepoNotFound", "Repository not found")
        if repo_id in self.gated:
            raise _Miss("GatedRepo", "Access to this repo is restricted", status=401)
        revisions = self.repos[repo_id]
        if revision in revisions:
            return self.shas[repo_id][revision], revisions[revision]
        for name, sha in self.shas[repo_id].items():
            if revision == sha:
                return sha, revisions[name]
        raise _Miss("RevisionNotFound", f"Invalid rev id: {revision}")

    # ---- server ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the fake hub is not running: call start()")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        if self._server is None:
            self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
            self._server.daemon_threads = True
            self._thread = threading.Thread(
                target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = self._thread = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _make_handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection: a clean stop()

        def log_message(self, format, *args):  # noqa: A002 - quiet
            pass

        def do_HEAD(self):
            self._dispatch(body=False)

        def do_GET(self):
            self._dispatch(body=True)

        def _dispatch(self, body: bool) -> None:
            path = urlsplit(self.path).path
            hub.requests.append((self.command, path))
            try:
                if m := _RESOLVE.match(path):
                    self._resolve(unquote(m["repo"]), unquote(m["rev"]), unquote(m["file"]), body)
                elif m := _TREE.match(path):
                    self._tree(unquote(m["repo"]), unquote(m["rev"]), unquote(m["file"] or ""))
                elif m := _INFO.match(path):
                    self._info(unquote(m["repo"]), unquote(m["rev"] or "main"))
                else:
                    raise _Miss("", "Not Found")
            except _Miss as miss:
                self._error(miss)

        def _resolve(self, repo_id: str, revision: str, filename: str, body: bool) -> None:
            sha, files = hub._lookup(repo_id, revision)
            if filename not in files:
                raise _Miss("EntryNotFound", f"{filename} does not exist on {revision!r}")
            data = files[filename]
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Repo-Commit", sha)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.end_headers()
            if body:
                self.wfile.write(data)

        def _info(self, repo_id: str, revision: str) -> None:
            sha, files = hub._lookup(repo_id, revision)
            siblings = [{"rfilename": name} for name in sorted(files)]
            self._json({"id": repo_id, "modelId": repo_id, "sha": sha, "siblings": siblings}, sha)

        def _tree(self, repo_id: str, revision: str, prefix: str) -> None:
            sha, files = hub._lookup(repo_id, revision)
            prefix = prefix.strip("/")
            entries = [
                {
                    "type": "file",
                    "path": name,
                    "oid": hashlib.sha1(files[name]).hexdigest(),
                    "size": len(files[name]),
                }
                for name in sorted(files)
                if not prefix or name == prefix or name.startswith(prefix + "/")
            ]
            if prefix and not entries:
                raise _Miss("EntryNotFound", f"{prefix} does not exist on {revision!r}")
            self._json(entries, sha)

        def _json(self, payload, sha: str) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Repo-Commit", sha)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _error(self, miss: _Miss) -> None:
            data = json.dumps({"error": miss.message}).encode()
            self.send_response(miss.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if miss.code:
                self.send_header("X-Error-Code", miss.code)
            self.send_header("X-Error-Message", miss.message)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

    return Handler


# ---- pointing huggingface_hub at the fake hub ------------------------------------------

# huggingface_hub copies its environment variables into huggingface_hub.constants at
# import time; hf_hub_download reads those attributes at call time, so patching them is
# enough in-process (no module in the download path copies them with `from ... import`).


@contextlib.contextmanager
def hub_environment(endpoint: str | None, cache: str | Path, offline: bool = False):
    """Point the already imported huggingface_hub at ``endpoint`` with its cache in
    ``cache``, no token, no telemetry, no Xet; ``offline`` = HF_HUB_OFFLINE=1. Restores
    everything on exit. (Environment variables are set too, for child processes.)

    ``endpoint=None`` keeps an unreachable endpoint (use with ``offline=True``).
    """
    from huggingface_hub import constants

    endpoint = (endpoint or "http://127.0.0.1:9").rstrip("/")
    cache = Path(cache)
    patches = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": str(cache),
        "HF_HUB_CACHE": str(cache / "hub"),
        "HF_HUB_OFFLINE": offline,
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": True,
        "HF_HUB_DISABLE_SHARED_BLOBS": True,
        "HF_TOKEN_PATH": str(cache / "token"),
        "HF_STORED_TOKENS_PATH": str(cache / "stored_tokens"),
    }
    env = {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(cache),
        "HF_HUB_CACHE": str(cache / "hub"),
        "HF_HUB_OFFLINE": "1" if offline else "0",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
    }
    missing = object()
    saved_attrs = {name: getattr(constants, name, missing) for name in patches}
    saved_env = {name: os.environ.get(name) for name in env}
    try:
        for name, value in patches.items():
            if saved_attrs[name] is not missing:
                setattr(constants, name, value)
        os.environ.update(env)
        yield
    finally:
        for name, value in saved_attrs.items():
            if value is not missing:
                setattr(constants, name, value)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
