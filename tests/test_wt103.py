"""The WikiText-103 path end to end, on a checkpoint of the paper's model in miniature.

The reference (transformers 4.37.2) builds a TransfoXLLMHeadModel shaped like
transfo-xl/transfo-xl-wt103 (three tail clusters, div_val 4, same_length, clamp_len,
untie_r) but tiny, saves it with save_pretrained and its word vocabulary with its own
tokenizer (vocab.pkl, a pickle). The loopback Hub serves that folder under the real repo
id; from_pretrained must recognise it, read the vocabulary without running the pickle,
convert, cache the conversion, and agree with the reference's log-probabilities.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hub_server import FakeHub, hub_environment
from safetensors.torch import load_file

import app
from tests.test_app import new_client
from tests.tolerance import AGAINST_REFERENCE, REFERENCE_FLOOR, ROW_SUM, assert_ulps_close
from txl import TransformerXL
from txl.hub import TXLLoadError
from txl.scoring import score_text
from txl.session import Session
from webapp.figures import token_label

ROOT = Path(__file__).resolve().parents[1]
REPO = "transfo-xl/transfo-xl-wt103"
COMMON = ["<eos>", "<unk>", "the", ",", ".", "of", "and", "in", "to", "a", "=", "was",
          "The", "@-@", "'s", "that", "for", "on", "is", "as"]
WORDS = COMMON + ["city"] + [f"word{i}" for i in range(44)]  # 65: clusters of 20, 20, 15, 10
CONFIG = dict(vocab_size=len(WORDS), cutoffs=[20, 40, 55], div_val=4, d_model=64, d_embed=64,
              n_head=4, d_head=16, d_inner=128, n_layer=2, mem_len=12, clamp_len=10,
              same_length=True, untie_r=True, pre_lnorm=False, attn_type=0, dropout=0.0,
              dropatt=0.0)
SEGMENTS = [5, 9, 4]


@pytest.fixture(scope="module")
def checkpoint(peer_python, tmp_path_factory) -> Path:
    """The reference's folder: model/ (config.json, model.safetensors, vocab.pkl) and
    reference.safetensors (input ids, log-probabilities per segment)."""
    out = tmp_path_factory.mktemp("wt103")
    spec = {"cases": [dict(out=str(out), config=CONFIG, seed=3, init_std=0.3,
                           segments=SEGMENTS, batch=1, words=WORDS)]}
    (out / "spec.json").write_text(json.dumps(spec))
    result = subprocess.run(
        [peer_python, str(ROOT / "tests" / "peer_reference.py"), str(out / "spec.json")],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, f"reference run failed:\n{result.stderr[-4000:]}"
    return out


@pytest.fixture
def hub_files(checkpoint) -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in (checkpoint / "model").iterdir()}
    assert {"config.json", "model.safetensors", "vocab.pkl"} <= set(files)
    assert json.loads(files["config.json"])["model_type"] == "transfo-xl"
    return files


@pytest.fixture
def caches(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(huggingface_hub cache, converted-model cache), both fresh."""
    monkeypatch.setenv("TXL_CACHE", str(tmp_path / "txl-cache"))
    return tmp_path / "hf", tmp_path / "txl-cache"


def reference_logprobs(model: TransformerXL, ref: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ours, reference) log-probabilities of each segment, memory carried from empty."""
    pairs, mems, start = [], None, 0
    with torch.no_grad():
        for s, length in enumerate(SEGMENTS):
            out = model(ref["input_ids"][:, start : start + length], mems=mems)
            start, mems = start + length, out.mems
            pairs.append((out.logits, ref[f"float32/logprobs.{s}"]))
    return pairs


def test_loads_from_the_hub_and_matches_the_reference(checkpoint, hub_files, caches):
    hf_home, txl_cache = caches
    with FakeHub({REPO: hub_files}) as hub, hub_environment(hub.url, hf_home):
        model = TransformerXL.from_pretrained(REPO)
    cfg = model.config
    assert (cfg.tokenizer, cfg.vocab, cfg.unk_symbol) == ("word", WORDS, "<unk>")
    assert (cfg.cutoffs, cfg.div_val, cfg.same_length, cfg.clamp_len) == ([20, 40, 55], 4, True, 10)
    ref = load_file(checkpoint / "reference.safetensors")
    for ours, expected in reference_logprobs(model, ref):
        assert_ulps_close(ours, expected, AGAINST_REFERENCE, floor=REFERENCE_FLOOR)
        assert_ulps_close(ours.exp().sum(-1), 1.0, ROW_SUM)  # log-probs
    # The conversion is kept per commit, in the txl format (config + safetensors, no pickle).
    converted = list(txl_cache.glob("converted/transfo-xl--transfo-xl-wt103/*"))
    assert len(converted) == 1 and len(converted[0].name) == 40
    assert {"config.json", "model.safetensors"} <= {p.name for p in converted[0].iterdir()}


def test_the_second_load_reads_the_converted_cache(hub_files, caches):
    hf_home, _ = caches
    with FakeHub({REPO: hub_files}) as hub:
        with hub_environment(hub.url, hf_home):
            first = TransformerXL.from_pretrained(REPO)
        hub.requests.clear()
        with hub_environment(hub.url, hf_home):
            second = TransformerXL.from_pretrained(REPO)
        fetched = [path for method, path in hub.requests if method == "GET"]
    assert not any(name in path for path in fetched for name in ("safetensors", "vocab"))
    with hub_environment(None, hf_home, offline=True):  # and with no network at all
        third = TransformerXL.from_pretrained(REPO)
    ids = torch.tensor([[2, 3, 25, 47, 60, 0]])
    with torch.no_grad():
        expected = first(ids).logits
        assert torch.equal(second(ids).logits, expected)
        assert torch.equal(third(ids).logits, expected)


def test_bfloat16_halves_the_memory(hub_files, caches):
    hf_home, _ = caches
    with FakeHub({REPO: hub_files}) as hub, hub_environment(hub.url, hf_home):
        full = TransformerXL.from_pretrained(REPO)
        half = TransformerXL.from_pretrained(REPO, dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    sessions = [Session(m, seed=0) for m in (full, half)]
    for s in sessions:
        s.start("the city was")
        list(s.generate(20))
    assert sessions[1].memory_info()["bytes"] * 2 == sessions[0].memory_info()["bytes"]
    # bfloat16 is close to float32: the first distribution agrees to a few percent.
    p_full, p_half = (F.softmax(s.next_logits.float(), -1) for s in sessions)
    assert (p_full - p_half).abs().sum().item() < 1.0  # a sanity bound, not exactness


def test_a_word_session_writes_words(hub_files, caches):
    hf_home, _ = caches
    with FakeHub({REPO: hub_files}) as hub, hub_environment(hub.url, hf_home):
        model = TransformerXL.from_pretrained(REPO)
    s = Session(model, temperature=1.0, seed=1)
    unknown = s.start("The city was word3 , zebra .")
    assert unknown == ["zebra"]
    assert s.ids[-2] == WORDS.index("<unk>")
    traces = list(s.generate(30, capture_last_only=False))
    assert len(s.ids) == 7 + 30 and s.text == "".join(s.pieces)
    assert [t.char for t in traces] == list(s.pieces[7:])
    last = traces[-1]
    assert last.attentions.shape == (2, 4, len(last.key_positions))
    assert last.n_memory == 12
    assert (last.attentions[:, :, 0] == 0).all()  # same_length hides the oldest: 12 keys seen
    labels = [token_label(s.pieces[p]) for p in last.key_positions]
    assert all(label in WORDS or label == "\n" for label in labels)
    result = score_text(model, "the city was word3 , the city was word3 .", s.seg_len, s.mem_len)
    assert len(result.chars) == 9 and result.bits_with.shape == (9,)  # 10 words


def test_a_hostile_vocabulary_is_refused_and_runs_nothing(hub_files, caches, tmp_path):
    hf_home, _ = caches
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(marker)],))

    files = dict(hub_files, **{"vocab.pkl": pickle.dumps({"idx2sym": Exploit()})})
    with (
        FakeHub({REPO: files}) as hub,
        hub_environment(hub.url, hf_home),
        pytest.raises(TXLLoadError, match="refusing to unpickle subprocess.call"),
    ):
        TransformerXL.from_pretrained(REPO)
    assert not marker.exists()


def test_the_app_loads_generates_and_shows_attention(hub_files, caches, monkeypatch):
    """The app serves the WT103 id; a big model's memory is capped per session (here the
    cap is forced below mem_len: 0.01 MB / (1.25 x 1 kB per position) = 8 positions)."""
    hf_home, _ = caches
    monkeypatch.setenv("TXL_SESSION_MEMORY_MB", "0.01")
    with FakeHub({REPO: hub_files}) as hub, hub_environment(hub.url, hf_home):
        txl_app = app.Demo.serving(REPO)
        assert txl_app.service.load_error is None
        demo = txl_app.build()
        _, url, _ = app.launch(demo, server_name="127.0.0.1", server_port=None,
                               prevent_thread_lock=True, quiet=True, ssr_mode=False)
        try:
            client = new_client(url)
            text, text_view, status, attention, history, summary, _ = client.predict(
                prompt="The city", n_tokens=12, memory=True, mem_len=12, temperature=1.0,
                top_k=0, top_p=1.0, seed=0, api_name="/generate")
        finally:
            demo.close()
    assert text.startswith("The city ") and len(text.split()) >= 8
    assert "words" in txl_app.watch.model_info()
    assert "memory capped at 8 positions per session" in txl_app.watch.model_info()
    assert summary["memory_tokens"] == 8  # asked for 12, capped
    assert summary["predictions"]["chosen"] == summary["char"].removeprefix(" ")  # a word
    assert summary["n_keys"] >= 2 and attention["n_keys"] == summary["n_keys"]
    assert attention["unit"] == text_view["unit"] == "word"
    assert attention["rows"] == ["layer 0", "layer 1"] and attention["pos"] == summary["position"]
    assert attention["n_mem_cols"] == summary["n_memory"] <= 8  # one column per word
    assert all(label in WORDS or "↵" in label for label in attention["labels"])
    # the text view's runs make up the text; the newest word is the last run, on its own
    assert "".join("".join(piece) for _, _, piece in text_view["runs"]) == text
    role, first, piece = text_view["runs"][-1]
    assert role == "newest" and first == text_view["pos"] == summary["position"]
    assert piece == [summary["char"]]  # a word with its leading space: one span


def test_the_converter_takes_the_vocabulary_along(checkpoint, tmp_path):
    """python -m txl.convert on the folder: a word model that loads with no pickle left."""
    result = subprocess.run(
        [sys.executable, "-m", "txl.convert", str(checkpoint / "model"), str(tmp_path / "out")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "vocab 65" in result.stdout
    assert not list((tmp_path / "out").glob("*.pkl")) and not list((tmp_path / "out").glob("*.bin"))
    model = TransformerXL.from_pretrained(tmp_path / "out")
    assert model.config.vocab == WORDS and model.tokenizer.unit == "word"
    ref = load_file(checkpoint / "reference.safetensors")
    for ours, expected in reference_logprobs(model, ref):
        assert_ulps_close(ours, expected, AGAINST_REFERENCE, floor=REFERENCE_FLOOR)
