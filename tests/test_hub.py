"""Loading by Hub repo id, with no internet: a loopback server that imitates the Hub's
endpoints (tests/hub_server.py), then the cache offline. Every failure, remote or local,
must be one TXLLoadError that names the repo (or folder), the file and the cause."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants, snapshot_download
from huggingface_hub.repocard import metadata_load
from safetensors.torch import save_model

from tests.hub_server import FakeHub, hub_environment
from txl import TransformerXL, TXLConfig
from txl.hub import CONFIG_NAME, WEIGHTS_NAME, TXLLoadError

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

ROOT = Path(__file__).resolve().parents[1]
REPO = "someorg/tiny-txl"
TINY = dict(
    vocab=list("abcdefgh \n"),
    d_model=16,
    n_layer=1,
    n_head=2,
    d_head=8,
    d_inner=32,
    tgt_len=4,
    mem_len=4,
)


def tiny_model(seed: int = 0, **overrides) -> TransformerXL:
    torch.manual_seed(seed)
    return TransformerXL(TXLConfig(**{**TINY, **overrides})).eval()


def read_folder(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def assert_same_model(loaded: TransformerXL, expected: TransformerXL) -> None:
    assert not loaded.training
    assert loaded.config == expected.config
    want = expected.state_dict()
    got = loaded.state_dict()
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    ids = torch.tensor([expected.tokenizer.encode("abc defgh\nab")])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, expected(ids).logits)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[TransformerXL, dict[str, bytes]]:
    """The tiny model and the files save_pretrained wrote for it."""
    model = tiny_model()
    folder = tmp_path_factory.mktemp("tiny-txl")
    model.save_pretrained(folder)
    return model, read_folder(folder)


@pytest.fixture
def fake_hub(saved):
    """A running loopback Hub serving the tiny model as REPO."""
    with FakeHub({REPO: saved[1]}) as hub:
        yield hub


@pytest.fixture
def hf_home(tmp_path) -> Path:
    return tmp_path / "hf-home"  # a fresh, empty cache for each test


@pytest.fixture
def online(fake_hub, hf_home):
    """huggingface_hub pointed at the fake hub, with a fresh cache."""
    with hub_environment(fake_hub.url, hf_home):
        yield fake_hub


def load_error(source, **kwargs) -> str:
    """The TXLLoadError message of from_pretrained(source) (any other exception fails)."""
    with pytest.raises(TXLLoadError) as info:
        TransformerXL.from_pretrained(source, **kwargs)
    return str(info.value)


# ---- loading by repo id ----------------------------------------------------------------


def test_load_by_repo_id_then_offline_from_the_cache(saved, fake_hub, hf_home):
    model, _ = saved
    with hub_environment(fake_hub.url, hf_home):
        loaded = TransformerXL.from_pretrained(REPO)
    assert_same_model(loaded, model)
    fetched = {path.rsplit("/", 1)[-1] for method, path in fake_hub.requests if method == "GET"}
    assert {CONFIG_NAME, WEIGHTS_NAME} <= fetched
    snapshots = hf_home / "hub" / "models--someorg--tiny-txl" / "snapshots"
    assert {p.name for p in snapshots.glob("*/*")} >= {CONFIG_NAME, WEIGHTS_NAME}

    fake_hub.stop()  # the Hub is gone: HF_HUB_OFFLINE=1 reads the cache
    n_requests = len(fake_hub.requests)
    with hub_environment(None, hf_home, offline=True):
        again = TransformerXL.from_pretrained(REPO)
    assert_same_model(again, model)
    assert len(fake_hub.requests) == n_requests


def test_local_files_only_reads_the_cache(saved, online, hf_home):
    TransformerXL.from_pretrained(REPO)  # fills the cache
    n_requests = len(online.requests)
    assert_same_model(TransformerXL.from_pretrained(REPO, local_files_only=True), saved[0])
    assert len(online.requests) == n_requests


def test_revisions_branch_and_commit_sha(saved, online):
    v2 = tiny_model(seed=1)
    v2_files = {**saved[1], WEIGHTS_NAME: _weights_bytes(v2)}
    sha = online.add_repo(REPO, v2_files, revision="v2")
    assert_same_model(TransformerXL.from_pretrained(REPO, revision="v2"), v2)
    assert_same_model(TransformerXL.from_pretrained(REPO, revision=sha), v2)
    assert_same_model(TransformerXL.from_pretrained(REPO), saved[0])

    message = load_error(REPO, revision="no-such-branch")
    assert REPO in message
    assert "'no-such-branch' does not exist" in message


def _weights_bytes(model: TransformerXL) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / WEIGHTS_NAME
        save_model(model, str(path))
        return path.read_bytes()


def test_snapshot_download_sees_the_whole_repo(saved, online, hf_home):
    # The tree and revision endpoints, for callers that fetch a whole repo.
    folder = Path(snapshot_download(REPO))
    assert read_folder(folder) == saved[1]
    assert any(path.startswith("/api/models/someorg/tiny-txl") for _, path in online.requests)


def test_hub_environment_restores_huggingface_hub(fake_hub, hf_home):
    before = (constants.ENDPOINT, constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE)
    env_before = os.environ.get("HF_ENDPOINT")
    with hub_environment(fake_hub.url, hf_home, offline=True):
        assert fake_hub.url == constants.ENDPOINT
        assert constants.is_offline_mode()
    assert before == (constants.ENDPOINT, constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE)
    assert os.environ.get("HF_ENDPOINT") == env_before


CHILD = """
import json, sys
import torch
from txl import TransformerXL
from txl.hub import TXLLoadError
result = {}
model = TransformerXL.from_pretrained(sys.argv[1])
result["params"] = torch.cat([p.flatten() for p in model.state_dict().values()]).tolist()
try:
    TransformerXL.from_pretrained("someorg/nope")
except TXLLoadError as e:
    result["missing"] = str(e)
print(json.dumps(result))
"""


def run_python(code: str, *args: str, env: dict[str, str]) -> dict:
    """Run ``code`` in a fresh interpreter with ``env`` added; its stdout as JSON."""
    inherited = ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN")
    child_env = {k: v for k, v in os.environ.items() if k not in inherited}
    child_env.update(env, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=child_env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a fresh interpreter imports torch (~5 s)
def test_environment_variables_at_import_time(saved, fake_hub, hf_home):
    # What a user does: HF_ENDPOINT & co in the environment before huggingface_hub loads.
    env = {
        "HF_ENDPOINT": fake_hub.url,
        "HF_HOME": str(hf_home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
    }
    result = run_python(CHILD, REPO, env=env)
    model = saved[0]
    want = torch.cat([p.flatten() for p in model.state_dict().values()])
    assert torch.equal(torch.tensor(result["params"], dtype=want.dtype), want)
    assert "someorg/nope" in result["missing"] and "does not exist" in result["missing"]
    # The cache the child filled serves this process offline, with the hub gone.
    fake_hub.stop()
    with hub_environment(None, hf_home, offline=True):
        assert_same_model(TransformerXL.from_pretrained(REPO), model)


# ---- remote failures: the repo id and the cause ------------------------------------------


def test_missing_repo(online):
    message = load_error("someorg/nope")
    assert "someorg/nope" in message
    assert "does not exist" in message
    assert any("/someorg/nope/" in path for _, path in online.requests)  # it did ask


def test_missing_file_in_repo(online, saved):
    online.add_repo("someorg/config-only", {CONFIG_NAME: saved[1][CONFIG_NAME]})
    message = load_error("someorg/config-only")
    assert "someorg/config-only" in message
    assert WEIGHTS_NAME in message
    assert CONFIG_NAME not in message  # config.json was there: the message is about weights


def test_missing_config_in_repo(online, saved):
    online.add_repo("someorg/weights-only", {WEIGHTS_NAME: saved[1][WEIGHTS_NAME]})
    message = load_error("someorg/weights-only")
    assert "someorg/weights-only" in message
    assert CONFIG_NAME in message


def test_gated_repo(online, saved):
    online.add_repo("someorg/gated", saved[1], gated=True)
    message = load_error("someorg/gated")
    assert "someorg/gated" in message
    assert "gated" in message.replace("someorg/gated", "")


def test_offline_and_not_cached(fake_hub, hf_home):
    # The hub is up, but HF_HUB_OFFLINE=1: nothing may be asked, and the cache is empty.
    with hub_environment(fake_hub.url, hf_home, offline=True):
        message = load_error(REPO)
    assert REPO in message
    assert "not cached" in message
    assert "offline" in message
    assert fake_hub.requests == []


def test_local_files_only_and_not_cached(online):
    message = load_error(REPO, local_files_only=True)
    assert REPO in message
    assert "not cached" in message
    assert online.requests == []


@pytest.mark.parametrize(
    "source",
    [
        "../x",
        "a/b/c",
        "has space/x",
        "org/name with space",
        "org/--bad",
        "a/" + "x" * 200,
        "x" * 500,
        "/" + "x" * 300,
    ],
    ids=[
        "dotdot",
        "three-parts",
        "space-org",
        "space-name",
        "dashes",
        "long-name",
        "500-chars",
        "long-abs-path",
    ],
)
def test_malformed_ids_fail_fast_without_network(online, source, monkeypatch):
    # "Fast" without a clock: no request reaches the Hub, and nothing waits to retry
    # (huggingface_hub's backoff sleeps between tries, in the caller's thread). Only this
    # thread's sleeps count: a thread an earlier test left running sleeps as it likes.
    slept, real_sleep, caller = [], time.sleep, threading.get_ident()

    def sleep(seconds):
        if threading.get_ident() == caller:
            slept.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    message = load_error(source)
    assert source[:40] in message
    assert online.requests == []
    assert slept == []


# ---- damaged files: the file and the cause ---------------------------------------------


def _garbage(n: int = 4096) -> bytes:
    return random.Random(0).randbytes(n)


def _damaged_weights(weights: bytes) -> dict[str, bytes]:
    header_len = int.from_bytes(weights[:8], "little")
    return {
        "empty": b"",
        "4-bytes": weights[:4],
        "mid-header": weights[: 8 + header_len // 2],
        "header-only": weights[: 8 + header_len],
        "mid-data": weights[: len(weights) // 2 + 8 + header_len // 2],
        "last-byte-cut": weights[:-1],
        "garbage": _garbage(),
        "huge-header-length": (2**40).to_bytes(8, "little") + b"{}",
        "header-not-json": (16).to_bytes(8, "little") + b"not json at all!" + b"\0" * 64,
        "pickle": b"\x80\x04\x95" + _garbage(200),  # a torch.save file is no safetensors
    }


DAMAGE = list(_damaged_weights(b"\0" * 64))


def _mismatched_configs(config: dict) -> dict[str, dict]:
    return {
        "d_model": {**config, "d_model": 32},
        "n_layer": {**config, "n_layer": 2},
        "n_head": {**config, "n_head": 4},
        "d_inner": {**config, "d_inner": 64},
        "vocab": {**config, "vocab": [*config["vocab"], "i", "j"], "vocab_size": 0},
        "untie_r": {**config, "untie_r": False},
    }


MISMATCH = list(_mismatched_configs({"vocab": []}))


def _write(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_weights_in_a_folder(saved, tmp_path, damage):
    files = {**saved[1], WEIGHTS_NAME: _damaged_weights(saved[1][WEIGHTS_NAME])[damage]}
    folder = _write(tmp_path / "model", files)
    message = load_error(folder)
    assert str(folder) in message
    assert WEIGHTS_NAME in message


@pytest.mark.parametrize("field", MISMATCH)
def test_config_that_does_not_match_the_weights(saved, tmp_path, field):
    config = json.loads(saved[1][CONFIG_NAME])
    bad = _mismatched_configs(config)[field]
    files = {**saved[1], CONFIG_NAME: json.dumps(bad).encode()}
    message = load_error(_write(tmp_path / "model", files))
    assert WEIGHTS_NAME in message
    assert CONFIG_NAME in message
    assert "does not match" in message


def test_config_with_other_settings_still_loads(saved, tmp_path):
    # mem_len / tgt_len / dropout change no weight: a different config.json loads.
    config = {**json.loads(saved[1][CONFIG_NAME]), "mem_len": 9, "tgt_len": 3, "dropout": 0.0}
    files = {**saved[1], CONFIG_NAME: json.dumps(config).encode()}
    loaded = TransformerXL.from_pretrained(_write(tmp_path / "model", files))
    assert loaded.mem_len == 9
    assert loaded.config.tgt_len == 3


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "not json",
        "[]",
        "null",
        '"a string"',
        "{}",
        '{"vocab_size": 10, "bogus": 1}',
    ],
    ids=["empty", "truncated", "not-json", "list", "null", "string", "no-vocab", "unknown"],
)
def test_invalid_config_json(saved, tmp_path, text):
    files = {**saved[1], CONFIG_NAME: text.encode()}
    message = load_error(_write(tmp_path / "model", files))
    assert CONFIG_NAME in message
    assert "not a valid txl config" in message


@pytest.mark.parametrize(
    "field, value",
    [
        ("d_model", 16.0),  # JSON written by another tool: a float where an int belongs
        ("n_head", 2.0),
        ("dropout", "x"),
        ("unk_symbol", "z"),  # not in the vocabulary
    ],
)
def test_config_values_of_the_wrong_kind(saved, tmp_path, field, value):
    config = {**json.loads(saved[1][CONFIG_NAME]), field: value}
    files = {**saved[1], CONFIG_NAME: json.dumps(config).encode()}
    message = load_error(_write(tmp_path / "model", files))
    assert CONFIG_NAME in message


def test_config_that_is_not_utf8(saved, tmp_path):
    files = {**saved[1], CONFIG_NAME: b"\xff\xfe{" + _garbage(64)}
    message = load_error(_write(tmp_path / "model", files))
    assert CONFIG_NAME in message


@pytest.mark.parametrize("missing", [WEIGHTS_NAME, CONFIG_NAME])
def test_missing_file_in_a_folder(saved, tmp_path, missing):
    files = {name: data for name, data in saved[1].items() if name != missing}
    folder = _write(tmp_path / "model", files)
    message = load_error(folder)
    assert str(folder) in message
    assert missing in message
    assert "missing" in message


def test_weights_that_are_a_folder(saved, tmp_path):
    folder = _write(tmp_path / "model", {CONFIG_NAME: saved[1][CONFIG_NAME]})
    (folder / WEIGHTS_NAME).mkdir()
    assert WEIGHTS_NAME in load_error(folder)


@pytest.mark.parametrize("damage", ["mid-data", "garbage", "header-only"])
def test_damaged_weights_from_the_hub(saved, online, damage):
    files = {**saved[1], WEIGHTS_NAME: _damaged_weights(saved[1][WEIGHTS_NAME])[damage]}
    online.add_repo("someorg/damaged", files)
    message = load_error("someorg/damaged")
    assert "someorg/damaged" in message
    assert WEIGHTS_NAME in message


@pytest.mark.parametrize("field", ["d_model", "n_layer"])
def test_mismatched_config_from_the_hub(saved, online, field):
    config = _mismatched_configs(json.loads(saved[1][CONFIG_NAME]))[field]
    online.add_repo("someorg/mismatch", {**saved[1], CONFIG_NAME: json.dumps(config).encode()})
    message = load_error("someorg/mismatch")
    assert "someorg/mismatch" in message
    assert WEIGHTS_NAME in message and CONFIG_NAME in message
    assert "does not match" in message


def test_invalid_config_from_the_hub(saved, online):
    online.add_repo("someorg/bad-config", {**saved[1], CONFIG_NAME: b"{ not json"})
    message = load_error("someorg/bad-config")
    assert "someorg/bad-config" in message
    assert CONFIG_NAME in message


# ---- the model card ----------------------------------------------------------------------


def test_save_pretrained_writes_a_model_card(saved, tmp_path):
    card = saved[1]["README.md"].decode()
    assert card.startswith("---\n")
    (tmp_path / "README.md").write_text(card)
    meta = metadata_load(tmp_path / "README.md")
    assert meta["library_name"] == "txl"
    assert meta["pipeline_tag"] == "text-generation"
    assert meta["license"] == "mit"
    assert {"transformer-xl", "text-generation", "character-level"} <= set(meta["tags"])
    assert "https://github.com/txl-project/txl" in card


def test_save_pretrained_keeps_an_existing_model_card(tmp_path):
    (tmp_path / "README.md").write_text("my own card\n")
    tiny_model().save_pretrained(tmp_path)
    assert (tmp_path / "README.md").read_text() == "my own card\n"
    assert (tmp_path / CONFIG_NAME).is_file() and (tmp_path / WEIGHTS_NAME).is_file()
