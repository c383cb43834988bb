"""Nothing breaks it (issue 6).

Every bad input gets a clear message (the parameter and why: never a stack trace, never
Gradio's "the upstream app has raised an exception"), leaves the session usable and keeps
the text so far. Each case is tried through the API (gradio_client; raw HTTP for the NaN and
Infinity that gradio_client will not send) and through the Session object. Load faults name
their cause and the app keeps serving its model. Hypothesis fuzzes the tokenizer, the
Session and the HTTP API. And the package never unpickles.

The policy (docs/serving.md, "Limits"): a value outside its range is refused with gr.Error and
nothing changes; what can be served in a well-defined way is served with a notice
(characters outside the vocabulary are replaced, with a gr.Warning).
"""

from __future__ import annotations

import ast
import json
import math
import os
import random
import threading
import uuid
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import gradio as gr  # noqa: E402
import httpx  # noqa: E402
import huggingface_hub.file_download  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import app  # noqa: E402
from tests.hub_server import FakeHub, hub_environment  # noqa: E402
from tests.raw_api import call  # noqa: E402
from tests.test_app import MEM_LEN, SEG_LEN, VOCAB, new_client, serve, tiny_model  # noqa: E402
from txl import TransformerXL  # noqa: E402
from txl.hub import CONFIG_NAME, WEIGHTS_NAME  # noqa: E402
from txl.scoring import score_text  # noqa: E402
from txl.session import Session  # noqa: E402
from txl.tokenizer import CharTokenizer, UnknownCharactersError  # noqa: E402
from webapp import serve as webapp_serve  # noqa: E402
from webapp import visitors  # noqa: E402
from webapp.tabs import watch as watch_tab  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "ROMEO:\n"
GENERIC = "upstream Gradio app has raised an exception"
MEGABYTE = ("ROMEO: But soft! what light through yonder window breaks?\n" * 17_300)[:1_000_000]
assert len(MEGABYTE) == 1_000_000
# Keyboards make more than the model's 65 characters.
ODD_PROMPTS = {
    "empty": "",
    "space": " ",
    "whitespace": "   \n\t \r\n",
    "emoji": "😀🎭 ROMEO 👍🏽",
    "cjk": "中文の文字 한국어",
    "control": "\x01\x02\x1b[31mred\x7f\x08",
    "nul": "\x00ROMEO\x00",
    "surrogate": "a\ud800b",
    "combining": "Rome\u0301o",
    "bidi": "\u202eOEMOR\u202c",
    "zero-width": "RO\u200bMEO\ufeff",
}


# ---- fixtures and helpers --------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The app's model (2 layers) and another (1 layer) in a folder the app may read."""
    base = tmp_path_factory.mktemp("models")
    return {
        "base": base,
        "default": tiny_model(base / "default"),
        "other": tiny_model(base / "other", n_layer=1, seed=1),
    }


@pytest.fixture(scope="module")
def server(models):
    txl_app = app.Demo.serving(models["default"], model_dirs=[str(models["base"])])
    demo, url = serve(txl_app)
    yield url, txl_app
    demo.close()


@pytest.fixture
def client(server):
    c = new_client(server[0])
    yield c
    c.close()


def settings_kw(**overrides) -> dict:
    values = dict(memory=True, mem_len=MEM_LEN, temperature=1.0, top_k=0, top_p=1.0, seed=0)
    values.update(overrides)
    return values


def generate(c, prompt=PROMPT, n_tokens=20, **kw):
    return c.predict(prompt=prompt, n_tokens=n_tokens, **settings_kw(**kw), api_name="/generate")


def step(c, prompt=PROMPT, **kw):
    return c.predict(prompt=prompt, **settings_kw(**kw), api_name="/step")


def clear(message: str) -> str:
    """A message for a person: said, not a stack trace, not Gradio's generic one."""
    assert message and message != "None", "no message"
    assert GENERIC not in message and "Traceback" not in message, message
    assert len(message) < 800, message
    return message


def refused(fn, *args, **kwargs) -> str:
    """The error message of a call that must fail."""
    with pytest.raises(Exception) as error:  # gradio_client's AppError carries the message
        fn(*args, **kwargs)
    return clear(str(error.value))


def n_layers(out) -> int:
    """The number of layers of the model that answered a Step (from the step summary)."""
    return len(out[5]["memory_mass_per_layer"])


@pytest.fixture(scope="module")
def model(models):
    return TransformerXL.from_pretrained(models["default"])


def snapshot(s: Session):
    """Everything a failed call must leave as it was."""
    kv = None if s.kv is None else [t[:, :, s.kv.start : s.kv.end].clone() for t in s.kv.k + s.kv.v]
    logits = None if s.next_logits is None else s.next_logits.clone()
    plain = (
        list(s.ids),
        s.text,
        s.prompt,
        s.memory,
        s.mem_len,
        s.seg_len,
        s.temperature,
        s.top_k,
        s.top_p,
        s.seed,
        s.memory_info(),
    )
    return plain, kv, logits, s.generator.get_state()


def same(a, b) -> bool:
    (plain_a, kv_a, lg_a, gen_a), (plain_b, kv_b, lg_b, gen_b) = a, b
    tensors = [(kv_a, kv_b), ([lg_a], [lg_b])]
    for x, y in tensors:
        if (x is None) != (y is None):
            return False
        if x is not None and (
            len(x) != len(y) or not all(u is v or torch.equal(u, v) for u, v in zip(x, y))
        ):
            return False
    return plain_a == plain_b and torch.equal(gen_a, gen_b)


def started(model, **kw) -> Session:
    s = Session(model, temperature=1.0, seed=3, **kw)
    s.start(PROMPT)
    for _ in s.generate(12):
        pass
    return s


# ---- the Session object ------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ODD_PROMPTS))
def test_session_takes_any_prompt(model, name):
    prompt = ODD_PROMPTS[name]
    s = Session(model)
    unknown = s.start(prompt)
    assert unknown == list(dict.fromkeys(c for c in prompt if c not in VOCAB))
    expected = "".join(c if c in VOCAB else "?" for c in prompt) or "\n"  # "" starts a line
    assert s.text == expected
    trace = s.step()
    assert s.text == expected + trace.char
    assert s.feed(prompt) == unknown
    assert s.text.endswith(expected if prompt else trace.char)


def test_session_step_before_any_prompt(model):
    s = Session(model)
    trace = s.step()
    assert s.text == "\n" + trace.char and s.prompt == ""


def test_session_feeds_a_megabyte_prompt(model):
    # The app refuses prompts above 20,000 characters (see the API test); the Session itself
    # has no limit. Memory off, a prompt costs one forward over its last seg_len tokens.
    s = Session(model, memory=False)
    assert s.start(MEGABYTE) == []
    assert s.text == MEGABYTE and len(s.ids) == 1_000_000
    s.step()
    assert len(s.text) == 1_000_001 and s.memory_info()["context"] == SEG_LEN


def test_session_feeds_a_long_prompt_in_segments_with_bounded_memory(model):
    # Memory on, the prompt is fed seg_len tokens at a time: linear time (docs/serving.md, Limits:
    # characters per second), and the memory keeps mem_len positions whatever the length.
    long = MEGABYTE[:100_000]
    s = Session(model, seg_len=256)
    assert s.start(long) == []
    assert s.text == long and len(s.kv) == MEM_LEN
    assert s.memory_info()["span"] == (100_000 - MEM_LEN, 100_000)
    assert s.kv.k[0].size(2) <= 2 * (MEM_LEN + 256)  # the buffers did not grow with the text
    s.step()
    assert len(s.text) == 100_001


BAD_SETTINGS = [
    ("temperature", -1),
    ("temperature", -1e-9),
    ("temperature", math.nan),
    ("temperature", math.inf),
    ("temperature", -math.inf),
    ("temperature", "0.5"),
    ("temperature", None),
    ("top_k", -1),
    ("top_k", 2.5),
    ("top_k", math.nan),
    ("top_k", math.inf),
    ("top_k", "3"),
    ("top_p", 0),
    ("top_p", -0.5),
    ("top_p", 1.0001),
    ("top_p", math.nan),
    ("top_p", math.inf),
    ("seed", 2**64),
    ("seed", -(2**63) - 1),
    ("seed", 1.5),
    ("seed", math.nan),
    ("seed", math.inf),
    ("seed", "1"),
    ("mem_len", -1),
    ("mem_len", 1.5),
    ("mem_len", math.nan),
    ("mem_len", math.inf),
    ("mem_len", None),
    ("seg_len", 0),
    ("seg_len", -3),
    ("n", -1),
    ("n", 2.5),
    ("n", math.nan),
]


def apply(s: Session, name: str, value):
    if name in ("temperature", "top_k", "top_p"):
        setattr(s, name, value)
    elif name == "seed":
        s.set_seed(value)
    elif name == "mem_len":
        s.set_mem_len(value)
    elif name == "seg_len":
        s.set_seg_len(value)
    else:
        s.generate(value)


@pytest.mark.parametrize("memory", [True, False], ids=["memory", "no-memory"])
def test_session_refuses_bad_settings_and_changes_nothing(model, memory):
    for name, value in BAD_SETTINGS:
        s, twin = started(model, memory=memory), started(model, memory=memory)
        before = snapshot(s)
        with pytest.raises(ValueError, match=name.split("_")[0]):
            apply(s, name, value)
        assert same(snapshot(s), before), (name, value)
        # ... and the session goes on exactly as one that never saw the bad value
        for _ in range(5):
            s.step(), twin.step()
        assert s.text == twin.text, (name, value)
        if name != "n" and value is not None:  # and the constructor refuses it too
            with pytest.raises(ValueError, match=name.split("_")[0]):
                Session(model, **{name: value})


def test_session_extreme_but_valid_settings(model):
    greedy = started(model, top_k=0)
    greedy.temperature = 0
    expected = [greedy.step().token_id for _ in range(10)]
    for kw in (
        dict(temperature=1e-300),  # logits / temperature overflow: the limit is greedy
        dict(temperature=5e-324),
        dict(temperature=1.0, top_p=1e-12),  # only the best token is left
        dict(temperature=1.0, top_k=1),
    ):
        s = started(model, top_k=0)
        s.temperature, s.top_k, s.top_p = (
            kw["temperature"],
            kw.get("top_k", 0),
            kw.get("top_p", 1.0),
        )
        assert [s.step().token_id for _ in range(10)] == expected, kw
    # top_k as large as the vocabulary, or larger, keeps every token: top-k off
    texts = set()
    for top_k in (0, len(VOCAB), len(VOCAB) + 1, 10**12):
        s = started(model, top_k=top_k)
        for _ in s.generate(20):
            pass
        texts.add(s.text)
    assert len(texts) == 1
    s = started(model)
    s.temperature = 1e6  # almost uniform, still a distribution
    s.step()
    for seed in (-1, -(2**63), 2**64 - 1, 0):  # torch's whole seed range
        a, b = Session(model, seed=seed), Session(model, seed=seed)
        a.start(PROMPT), b.start(PROMPT)
        assert [a.step().char for _ in range(8)] == [b.step().char for _ in range(8)]
    for mem_len in (0, 10**6):
        s = started(model, mem_len=mem_len)
        s.step()
        assert len(s.kv) == min(mem_len, len(s.ids))
    s = started(model)
    assert list(s.generate(0)) == [] and s.text == started(model).text


# ---- the API: prompts --------------------------------------------------------------------


def test_api_takes_any_prompt(client):
    for name, prompt in ODD_PROMPTS.items():
        if name == "surrogate":  # not UTF-8: no client can send it (raw HTTP fuzz tries)
            continue
        text = step(client, prompt=prompt)[0]
        expected = "".join(c if c in VOCAB else "?" for c in prompt) or "\n"
        assert text[:-1] == expected and len(text) == len(expected) + 1, name
        assert client.predict(api_name="/reset")[0] == ""


def test_api_refuses_a_megabyte_prompt_and_keeps_the_text(client):
    text = generate(client, n_tokens=30)[0]
    message = refused(step, client, prompt=MEGABYTE)
    assert "1,000,000 characters" in message and "20,000" in message
    message = refused(generate, client, prompt=MEGABYTE)
    assert "1,000,000 characters" in message
    message = refused(client.predict, text=MEGABYTE, mem_len=MEM_LEN, api_name="/score")
    assert "1,000,000 characters" in message
    assert step(client)[0][:-1] == text


def test_api_step_before_any_prompt(server):
    c = new_client(server[0])
    out = step(c, prompt="")  # the first call of a session, no prompt
    assert out[0][0] == "\n" and len(out[0]) == 2 and out[5]["position"] == 1
    assert c.predict(api_name="/reset")[0] == ""
    assert len(step(c, prompt="")[0]) == 2
    fresh = new_client(server[0])
    assert fresh.predict(api_name="/reset")[0] == ""  # Reset as the very first call
    c.close(), fresh.close()


# ---- the API: every setting out of range -------------------------------------------------

BAD_STEP = [
    ("temperature", -1, "minimum"),
    ("temperature", -1e-9, "minimum"),
    ("temperature", 2.5, "maximum"),
    ("temperature", "hot", "must be a number"),
    ("temperature", None, "must be a number"),
    ("top_k", -1, "minimum"),
    ("top_k", 101, "maximum"),
    ("top_k", 10**12, "maximum"),
    ("top_k", 2.5, "integer"),
    ("top_k", None, "must be a number"),
    ("top_p", 0, "minimum"),
    ("top_p", -0.5, "minimum"),
    ("top_p", 1.5, "maximum"),
    ("top_p", "all", "must be a number"),
    ("seed", 2**64, "2**64"),
    ("seed", 10**30, "2**64"),
    ("seed", -(2**63) - 1, ">="),
    ("seed", 2.5, "integer"),
    ("seed", "x", "must be a number"),
    ("seed", None, "must be a number"),
    ("mem_len", -1, "minimum"),
    ("mem_len", 10**9, "maximum"),
    ("mem_len", 2.5, "integer"),
    ("mem_len", None, "must be a number"),
    ("memory", "yes", "true or false"),
    ("memory", None, "true or false"),
    ("memory", 1, "true or false"),
]
BAD_GENERATE = [
    ("n_tokens", 0, "minimum"),
    ("n_tokens", -1, "minimum"),
    ("n_tokens", 10**9, "maximum"),
    ("n_tokens", 2.5, "integer"),
    ("n_tokens", "many", "must be a number"),
]


def test_api_refuses_every_bad_setting_by_name_and_keeps_the_text(client):
    text = generate(client, n_tokens=30, seed=5)[0]
    for name, value, why in BAD_STEP:
        message = refused(step, client, **{name: value})
        assert message.startswith(name) and why in message, (name, value, message)
    for name, value, why in BAD_GENERATE:
        kw = {"n_tokens": value} if name == "n_tokens" else {name: value}
        message = refused(generate, client, **kw)
        assert message.startswith(name) and why in message, (name, value, message)
    for layer in ("layer 9", "nonsense"):
        message = refused(client.predict, prompt=PROMPT, layer=layer, api_name="/step")
        assert "not in the list of choices" in message
    # the text is what it was: a Step continues it, exactly as if nothing had happened
    after = step(client, seed=5)[0]
    assert after[:-1] == text
    assert generate(client, n_tokens=31, seed=5)[0] == after


def test_api_extreme_but_valid_settings(client):
    greedy = generate(client, temperature=0.0, n_tokens=25)[0]
    assert generate(client, temperature=1e-300, n_tokens=25)[0] == greedy
    # top_k 100 is more than the 65 characters: the same as top-k off
    assert generate(client, top_k=100, seed=4)[0] == generate(client, top_k=0, seed=4)[0]
    for seed in (-1, -(2**63), 2**64 - 1):
        assert generate(client, seed=seed)[0] == generate(client, seed=seed)[0]
    out = step(client, mem_len=0)
    assert out[5]["n_memory"] == 0
    generate(client, n_tokens=500)  # the most per call
    assert step(client, memory=False)[5]["n_keys"] == SEG_LEN


def test_api_nan_and_infinity_are_refused_by_name(server):
    """gradio_client cannot send NaN or Infinity (they are not JSON); a JavaScript or curl
    client can. Raw HTTP, in one session (one session hash)."""
    url, h = server[0], uuid.uuid4().hex

    def step_data(**kw):
        values = dict(settings_kw(), **kw)
        keys = ("memory", "mem_len", "temperature", "top_k", "top_p", "seed")
        return [PROMPT, *(values[k] for k in keys), None, None]

    with httpx.Client(timeout=300) as http:
        ok, out = call(url, "step", step_data(), h, http)
        assert ok, out
        text = out[0]
        for name in ("temperature", "top_k", "top_p", "seed", "mem_len"):
            for value in (math.nan, math.inf, -math.inf):
                ok, message = call(url, "step", step_data(**{name: value}), h, http)
                assert not ok and clear(message).startswith(name), (name, value, message)
        for value in (math.nan, math.inf):
            data = [PROMPT, value, *step_data()[1:]]
            ok, message = call(url, "generate", data, h, http)
            assert not ok and clear(message).startswith("n_tokens"), message
        ok, message = call(url, "score", ["To be, or not to be", math.nan], h, http)
        assert not ok and clear(message).startswith("mem_len"), message
        ok, out = call(url, "step", step_data(), h, http)
        assert ok and out[0][:-1] == text


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    values=st.lists(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-(2**80), 2**80),
            st.floats(allow_nan=True, allow_infinity=True),
            st.text(max_size=8),
            st.lists(st.integers(), max_size=2),
            st.dictionaries(st.text(max_size=3), st.integers(), max_size=1),
        ),
        min_size=6,
        max_size=6,
    ),
    prompt=st.text(max_size=30),
)
def test_fuzz_the_step_api(server, values, prompt):
    """Any JSON at all for the six settings: a Step, or a message that names the
    problem; never an unexplained failure; the session stays usable."""
    url, h = server[0], uuid.uuid4().hex
    with httpx.Client(timeout=300) as http:
        ok, out = call(url, "step", [prompt, *values, None, None], h, http)
        if not ok:
            clear(out)
        good = [True, MEM_LEN, 1.0, 0, 1.0, 0, None, None]
        ok, again = call(url, "step", [prompt, *good], h, http)
        assert ok, again


# ---- the API: many clicks, and models switched mid-session -------------------------------


def test_a_double_step_click_steps_twice_in_order(client):
    text = generate(client, n_tokens=30)[0]
    jobs = [client.submit(prompt=PROMPT, **settings_kw(), api_name="/step") for _ in range(2)]
    results = sorted((job.result(timeout=300)[0] for job in jobs), key=len)
    assert [len(t) for t in results] == [len(text) + 1, len(text) + 2]
    assert results[1][:-1] == results[0] and results[0][:-1] == text
    assert step(client)[0][:-1] == results[1]  # nothing lost, nothing doubled


def test_switching_models_mid_session(client, models):
    text = generate(client, n_tokens=30, seed=2)[0]
    out = client.predict(source=models["other"], api_name="/load_model")
    assert "1 layers" in out[0] and out[1] == ""  # the new model starts a new text
    first = step(client, seed=2)
    assert n_layers(first) == 1 and first[0].startswith(PROMPT)
    message = refused(client.predict, source="no such model", api_name="/load_model")
    assert message.startswith("Could not load the model, keeping the current one.")
    kept = step(client, seed=2)
    assert n_layers(kept) == 1 and kept[0][:-1] == first[0]  # the failed load kept it all
    out = client.predict(source=models["default"], api_name="/load_model")
    assert "2 layers" in out[0]
    assert generate(client, n_tokens=30, seed=2)[0] == text  # same model, same seed, same text


def test_loading_a_model_while_generating_takes_effect(server, client, models, monkeypatch):
    """Load during a long Generate of the same session: the Load waits for it, and the
    session then has the new model (the Generate, ending later, must not bring back the
    old one). The Generate is held at its 100th step until the Load has reached the
    server, so the two overlap whatever the machine's speed."""
    _, txl_app = server
    generating, loading, go_on = threading.Event(), threading.Event(), threading.Event()
    session_step, cache_get = Session.step, txl_app.service.cache.get
    steps = []

    def held_step(self, *args, **kwargs):
        steps.append(len(self.ids))
        if len(steps) == 100:
            generating.set()
            go_on.wait(60)
        return session_step(self, *args, **kwargs)

    def signalled_get(*args, **kwargs):
        loading.set()
        return cache_get(*args, **kwargs)

    monkeypatch.setattr(Session, "step", held_step)
    # No frame streamed before the Load (a fast machine writes 100 steps of the tiny model
    # within one STREAM_EVERY_S): the visitor's first state must reach Gradio all the same.
    monkeypatch.setattr(watch_tab, "STREAM_EVERY_S", 1e9)
    monkeypatch.setattr(txl_app.service.cache, "get", signalled_get)
    job = client.submit(prompt=PROMPT, n_tokens=500, **settings_kw(), api_name="/generate")
    assert generating.wait(60), "the Generate never reached its 100th step"
    load = client.submit(source=models["other"], api_name="/load_model")
    try:
        assert loading.wait(60), "the Load never reached the server"
        assert not job.done()
    finally:
        go_on.set()
    assert "1 layers" in load.result(timeout=300)[0]
    assert len(job.result(timeout=300)[0]) == len(PROMPT) + 500
    monkeypatch.undo()
    assert n_layers(step(client)) == 1


# ---- the API: Hub ids and load faults ----------------------------------------------------

MALFORMED_IDS = [
    "../x",
    "a/b/c",
    "has space/x",
    "org/name with space",
    "org/--bad",
    "org/na\nme",
    "\x00/x",
    "😀/x",
    "x" * 256,  # a single file name too long for the file system
    "/" + "x" * 255,
    "a/" + "x" * 498,  # 500 characters
    "x" * 500,
]


def assert_keeps_serving(c, text: str, layers: int = 2) -> None:
    out = step(c)
    assert out[0][:-1] == text and n_layers(out) == layers


def test_malformed_hub_ids(client, tmp_path, monkeypatch):
    text = generate(client, n_tokens=30)[0]
    hub = FakeHub()  # any request that reaches it is a failure
    with hub, hub_environment(hub.url, tmp_path / "hf"):
        for source in MALFORMED_IDS:
            message = refused(client.predict, source=source, api_name="/load_model")
            assert message.startswith("Could not load the model, keeping the current one.")
            assert any(
                why in message
                for why in (
                    "not a valid Hub repo id",
                    "neither a folder",
                    "characters:",
                    "outside the ones this app may read",
                )
            ), (source, message)
    assert hub.requests == []
    assert_keeps_serving(client, text)


def test_hub_ids_that_do_not_exist_or_cannot_be_reached(client, tmp_path, monkeypatch):
    text = generate(client, n_tokens=30)[0]
    with FakeHub() as hub, hub_environment(hub.url, tmp_path / "hf"):
        message = refused(client.predict, source="someorg/no-such-model", api_name="/load_model")
        assert "someorg/no-such-model" in message and "does not exist" in message
    with hub_environment(None, tmp_path / "hf", offline=True):  # HF_HUB_OFFLINE=1
        message = refused(client.predict, source="someorg/model", api_name="/load_model")
        assert "cannot be reached" in message
    # Nothing listening on the port. huggingface_hub retries a failed connection for ~23 s
    # (backoff); the test turns the retries off, the outcome is the same.
    follow = huggingface_hub.file_download._httpx2_follow_hub_redirects_with_backoff

    def no_retries(*args, **kwargs):
        return follow(*args, **{**kwargs, "retry_on_errors": False})

    monkeypatch.setattr(
        huggingface_hub.file_download, "_httpx2_follow_hub_redirects_with_backoff", no_retries
    )
    with hub_environment("http://127.0.0.1:9", tmp_path / "hf-dead"):
        message = refused(client.predict, source="someorg/model", api_name="/load_model")
        assert "someorg/model" in message and "cannot be reached" in message
    assert_keeps_serving(client, text)


def _damaged(folder: str) -> dict[str, dict[str, bytes]]:
    """Broken copies of a model: {case: {file: bytes or None (missing)}}."""
    weights = (Path(folder) / WEIGHTS_NAME).read_bytes()
    config = json.loads((Path(folder) / CONFIG_NAME).read_text())
    header = 8 + int.from_bytes(weights[:8], "little")
    garbage = random.Random(0).randbytes(4096)
    return {
        "weights-empty": {WEIGHTS_NAME: b""},
        "weights-4-bytes": {WEIGHTS_NAME: weights[:4]},
        "weights-cut-in-header": {WEIGHTS_NAME: weights[: header // 2]},
        "weights-header-only": {WEIGHTS_NAME: weights[:header]},
        "weights-cut-in-data": {WEIGHTS_NAME: weights[: (header + len(weights)) // 2]},
        "weights-garbage": {WEIGHTS_NAME: garbage},
        "weights-a-pickle": {WEIGHTS_NAME: b"\x80\x04\x95" + garbage[:200]},
        "weights-missing": {WEIGHTS_NAME: None},
        "config-missing": {CONFIG_NAME: None},
        "config-garbage": {CONFIG_NAME: garbage},
        "config-not-json": {CONFIG_NAME: b"{ not json"},
        "config-d_model": {CONFIG_NAME: json.dumps({**config, "d_model": 48}).encode()},
        "config-n_layer": {CONFIG_NAME: json.dumps({**config, "n_layer": 3}).encode()},
        "config-vocab": {
            CONFIG_NAME: json.dumps(
                {**config, "vocab": config["vocab"][:-5], "vocab_size": len(config["vocab"]) - 5}
            ).encode()
        },
    }


def _copy_with(folder: str, changes: dict[str, bytes | None], to: Path) -> dict[str, bytes]:
    files = {name: (Path(folder) / name).read_bytes() for name in (CONFIG_NAME, WEIGHTS_NAME)}
    for name, data in changes.items():
        if data is None:
            files.pop(name)
        else:
            files[name] = data
    to.mkdir(parents=True)
    for name, data in files.items():
        (to / name).write_bytes(data)
    return files


def test_load_faults_name_the_cause_and_keep_the_model(client, models):
    text = generate(client, n_tokens=30)[0]
    cases = _damaged(models["default"])
    for case, changes in cases.items():
        folder = models["base"] / "damaged" / case
        _copy_with(models["default"], changes, folder)
        message = refused(client.predict, source=str(folder), api_name="/load_model")
        assert message.startswith("Could not load the model, keeping the current one.")
        assert str(folder) in message, (case, message)
        named = CONFIG_NAME if case.startswith("config") else WEIGHTS_NAME
        assert named in message, (case, message)
        if case in ("weights-missing", "config-missing"):
            assert "missing" in message
        if case in ("config-d_model", "config-n_layer", "config-vocab"):
            assert "does not match" in message, (case, message)
    assert_keeps_serving(client, text)


def test_load_faults_from_the_hub(client, models, tmp_path):
    text = generate(client, n_tokens=30)[0]
    cases = _damaged(models["default"])
    with FakeHub() as hub, hub_environment(hub.url, tmp_path / "hf"):
        for case in ("weights-cut-in-data", "weights-garbage", "weights-missing", "config-n_layer"):
            repo = f"someorg/{case}"
            hub.add_repo(repo, _copy_with(models["default"], cases[case], tmp_path / case))
            message = refused(client.predict, source=repo, api_name="/load_model")
            assert repo in message, message
            named = CONFIG_NAME if case.startswith("config") else WEIGHTS_NAME
            assert named in message, (case, message)
    assert_keeps_serving(client, text)


def test_a_broken_default_model_falls_back_to_the_bundled_one(models, tmp_path):
    folder = tmp_path / "broken"
    _copy_with(models["default"], _damaged(models["default"])["weights-garbage"], folder)
    txl_app = app.Demo.serving(str(folder))
    assert txl_app.service.load_error is None and txl_app.service.default_model is not None
    assert txl_app.service.default_source == str(ROOT / webapp_serve.BUNDLED_MODEL)
    notice = txl_app.service.load_notice
    assert str(folder) in notice and WEIGHTS_NAME in notice
    assert "serving the bundled model instead" in txl_app.service.load_notice
    txl_app.build()  # the page says so
    with hub_environment(None, tmp_path / "hf", offline=True):  # the Hub, unreachable at start
        txl_app = app.Demo.serving("someorg/model")
    service = txl_app.service
    assert "cannot be reached" in service.load_notice and service.default_model is not None


# ---- the API: scoring, and the session's size -------------------------------------------


def test_score_bad_inputs(client):
    for text in ("", "a", "\x00"):
        message = refused(client.predict, text=text, mem_len=MEM_LEN, api_name="/score")
        assert "Nothing to score" in message or "characters" in message, message
    for mem_len, why in ((-1, "minimum"), (10**6, "maximum"), (1.5, "integer"), ("x", "number")):
        message = refused(client.predict, text="To be, or not", mem_len=mem_len, api_name="/score")
        assert message.startswith("mem_len") and why in message, message
    _, summary, numbers, _, _ = client.predict(text="To be, or not", mem_len=0, api_name="/score")
    assert "bits per character" in summary
    # memory 0 is segments read alone: the two ways agree
    assert numbers["mem_len"] == 0
    assert numbers["bpc"]["memory"] == numbers["bpc"]["segments_alone"]


def test_a_session_holds_at_most_max_text_chars(client, monkeypatch):
    text = generate(client, n_tokens=30)[0]
    monkeypatch.setattr(watch_tab, "MAX_TEXT_CHARS", len(text) + 1)
    full = step(client)[0]
    for call_it in (
        lambda: step(client),
        lambda: client.predict(  # /continue is undocumented: positional arguments only
            PROMPT,
            5,
            *settings_kw().values(),
            "all layers",
            "mean over heads",
            api_name="/continue",
        ),
    ):
        message = refused(call_it)
        assert f"{len(full):,} characters" in message and "Reset" in message
    monkeypatch.setattr(watch_tab, "MAX_TEXT_CHARS", 10**6)
    assert step(client)[0][:-1] == full  # nothing was lost
    monkeypatch.setattr(watch_tab, "MAX_TEXT_CHARS", len(text) + 1)
    assert generate(client, n_tokens=30)[0] == text  # Generate starts over: allowed


# ---- sessions expire ---------------------------------------------------------------------


def test_sessions_release_idle_sessions_and_keep_busy_ones(model):
    sessions = visitors.Visitors(ttl=60, every=3600)  # swept by hand here
    states = [visitors.VisitorState("m", started(model)) for _ in range(3)]
    for state in states:
        sessions.add(state)
    assert len(sessions) == 3
    states[0].last_used -= 120  # idle for two minutes
    states[1].last_used -= 120
    states[1].lock.acquire()  # ... but busy with a request
    assert sessions.sweep() == 1
    assert states[0].expired and states[0].session.text == "" and states[0].session.kv.k == []
    assert not states[1].expired and states[1].session.text
    assert not states[2].expired and states[2].session.text
    states[1].lock.release()
    assert sessions.sweep() == 1 and states[1].expired
    sessions.release(None)  # Gradio's delete_callback with nothing in the state
    del states[:2]
    assert len(sessions) == 1  # held weakly: dropped states are gone


def test_an_expired_session_starts_again_with_a_warning(server):
    url, txl_app = server
    state = txl_app.service.ensure(None)
    txl_app.watch.step(PROMPT, True, MEM_LEN, 0.8, 0, 1.0, 0, None, None, state)
    state.last_used -= 10 * txl_app.service.visitors.ttl
    txl_app.service.visitors.sweep()
    assert state.expired
    with pytest.warns(UserWarning, match="idle"):
        *_, fresh = txl_app.watch.step(PROMPT, True, MEM_LEN, 0.8, 0, 1.0, 0, None, None, state)
    assert fresh is not state and len(fresh.session.text) == len(PROMPT) + 1


# ---- hypothesis: the tokenizer and the Session -------------------------------------------

ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(-3, 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(0, 2),
    st.text(max_size=4),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=100, deadline=None)
@given(
    vocab=st.lists(st.characters(), min_size=1, max_size=30, unique=True),
    text=st.text(max_size=60),
    errors=st.one_of(st.sampled_from(["strict", "replace", "ignore"]), st.text(max_size=6)),
)
def test_fuzz_the_tokenizer(vocab, text, errors):
    tok = CharTokenizer(vocab)
    unknown = [c for c in dict.fromkeys(text) if c not in tok.stoi]
    assert tok.unknown_chars(text) == unknown
    if errors not in ("strict", "replace", "ignore"):
        with pytest.raises(ValueError, match="errors must be one of"):
            tok.encode(text, errors=errors)
        return
    if errors == "strict" and unknown:
        with pytest.raises(UnknownCharactersError) as e:
            tok.encode(text)
        assert e.value.chars == unknown
        return
    if errors == "replace" and unknown and tok.unk_symbol is None:
        with pytest.raises(ValueError, match="unk_symbol"):
            tok.encode(text, errors="replace")
        return
    ids = tok.encode(text, errors=errors)
    known = "".join(c for c in text if c in tok.stoi)
    if errors == "replace":
        assert tok.decode(ids) == "".join(c if c in tok.stoi else tok.unk_symbol for c in text)
    else:
        assert tok.decode(ids) == (known if errors == "ignore" else text)


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(-(2**40), 2**40), max_size=10))
def test_fuzz_decoding_any_ids(ids):
    tok = CharTokenizer(VOCAB)
    if all(0 <= i < len(VOCAB) for i in ids):
        assert len(tok.decode(ids)) == len(ids)
    else:
        with pytest.raises(ValueError, match="token ids outside"):
            tok.decode(ids)


SESSION_OPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["start", "feed", "score"]), st.text(max_size=40)),
        st.tuples(
            st.sampled_from(
                [
                    "temperature",
                    "top_k",
                    "top_p",
                    "set_seed",
                    "set_mem_len",
                    "set_seg_len",
                    "set_memory",
                    "generate",
                ]
            ),
            ANY_VALUE,
        ),
        st.tuples(st.sampled_from(["step", "reset", "memory_info"]), st.none()),
    ),
    min_size=1,
    max_size=10,
)


def run_op(s: Session, op: str, value):
    if op in ("temperature", "top_k", "top_p"):
        setattr(s, op, value)
    elif op == "generate":
        for i, _ in enumerate(s.generate(value)):
            if i == 2:
                break
    elif op in ("step", "reset", "memory_info"):
        getattr(s, op)()
    elif op == "score":  # with the session's settings; its text and memory untouched
        score_text(s.model, value, s.seg_len, s.mem_len)
    else:
        getattr(s, op)(value)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=SESSION_OPS, memory=st.booleans())
def test_fuzz_the_session(model, ops, memory):
    """Any sequence of calls with any values: each works, or raises ValueError with a
    message and changes nothing; the session always steps afterwards."""
    s = Session(model, memory=memory, seg_len=4)
    for op, value in ops:
        before = snapshot(s)
        try:
            run_op(s, op, value)
        except ValueError as e:
            assert str(e), (op, value)
            assert same(snapshot(s), before), (op, value)
    n = len(s.ids)
    s.step()
    assert len(s.ids) == max(n, 1) + 1


def test_huge_seg_len_is_valid_for_a_session(model):
    s = Session(model, seg_len=2**70)  # valid: every fed text is one segment
    s.start(PROMPT)
    s.step()
    assert len(s.text) == len(PROMPT) + 1


# ---- no pickle: nothing in the package runs code from a downloaded file -------------------

UNPICKLERS = {"pickle.Unpickler", "_pickle.Unpickler"}
FORBIDDEN = {
    "pickle.load",
    "pickle.loads",
    "_pickle.load",
    "_pickle.loads",
    "dill.load",
    "dill.loads",
    "cloudpickle.load",
    "cloudpickle.loads",
    "joblib.load",
    "marshal.load",
    "marshal.loads",
    "shelve.open",
    "pandas.read_pickle",
    "eval",
    "exec",
    "builtins.eval",
    "builtins.exec",
    *UNPICKLERS,
}
# The one restricted unpickler: txl/vocab.py reads the WikiText-103 vocabulary pickle with a
# pickle.Unpickler subclass whose find_class admits only plain data.
RESTRICTED_UNPICKLER_FILES = {"txl/vocab.py"}


def unsafe_calls(source: str, path: str) -> list[str]:
    """Calls that can run code from a file: pickle and friends, torch.load without a
    literal weights_only=True, numpy.load with allow_pickle=True, eval and exec; and
    pickle.Unpickler subclasses, allowed only in RESTRICTED_UNPICKLER_FILES and only with
    their own find_class. Import aliases are followed ("import pickle as p", "from torch
    import load")."""
    tree = ast.parse(source)
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = (
                    a.name if a.asname else a.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"

    def dotted(node) -> str | None:
        if isinstance(node, ast.Name):
            return names.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def keyword(call: ast.Call, name: str):
        for kw in call.keywords:
            if kw.arg == name:
                return kw.value.value if isinstance(kw.value, ast.Constant) else "<not literal>"
        return None

    found = []
    for node in ast.walk(tree):
        where = f"{path}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call):
            name = dotted(node.func)
            if name in FORBIDDEN:
                found.append(f"{where}: {name}()")
            elif name in ("torch.load", "torch.serialization.load"):
                if keyword(node, "weights_only") is not True:
                    found.append(f"{where}: {name}() without weights_only=True")
            elif name in ("numpy.load",) and keyword(node, "allow_pickle") not in (None, False):
                found.append(f"{where}: {name}(allow_pickle=...)")
        elif isinstance(node, ast.ClassDef) and any(dotted(b) in UNPICKLERS for b in node.bases):
            methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
            if path not in RESTRICTED_UNPICKLER_FILES:
                found.append(f"{where}: an Unpickler subclass outside {RESTRICTED_UNPICKLER_FILES}")
            elif "find_class" not in methods:
                found.append(f"{where}: an Unpickler subclass without its own find_class")
    return found


def package_files() -> list[Path]:
    packages = [f for pkg in ("txl", "webapp") for f in sorted((ROOT / pkg).rglob("*.py"))]
    return [ROOT / "app.py", *packages]


def test_no_pickle_no_eval_in_the_package():
    files = package_files()
    assert len(files) > 10 and ROOT / "txl" / "session.py" in files
    assert ROOT / "webapp" / "serve.py" in files
    found = []
    for f in files:
        found += unsafe_calls(f.read_text(encoding="utf-8"), f.relative_to(ROOT).as_posix())
    assert found == [], "\n".join(found)


RESTRICTED = """
import pickle
class RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(name)
def read(f):
    return RestrictedUnpickler(f).load()
"""


@pytest.mark.parametrize(
    "path, source",
    [
        ("txl/x.py", "import pickle\npickle.load(f)"),
        ("txl/x.py", "import pickle as p\np.loads(b)"),
        ("txl/x.py", "from pickle import loads\nloads(b)"),
        ("txl/x.py", "from pickle import load as read\nread(f)"),
        ("txl/x.py", "import pickle\npickle.Unpickler(f).load()"),
        ("txl/x.py", "import _pickle\n_pickle.loads(b)"),
        ("txl/x.py", "import marshal\nmarshal.loads(b)"),
        ("txl/x.py", "import pandas as pd\npd.read_pickle(p)"),
        ("txl/x.py", "import torch\ntorch.load(p)"),
        ("txl/x.py", "import torch\ntorch.load(p, map_location='cpu')"),
        ("txl/x.py", "import torch\ntorch.load(p, weights_only=False)"),
        ("txl/x.py", "import torch\ntorch.load(p, weights_only=safe)"),
        ("txl/x.py", "from torch import load\nload(p)"),
        ("txl/x.py", "import numpy as np\nnp.load(p, allow_pickle=True)"),
        ("txl/x.py", "eval(text)"),
        ("txl/x.py", "exec(code, {})"),
        ("txl/x.py", "import builtins\nbuiltins.eval(s)"),
        ("txl/x.py", RESTRICTED),  # a restricted unpickler, but not where it is allowed
        ("txl/vocab.py", "import pickle\nclass U(pickle.Unpickler):\n    pass"),
        ("txl/vocab.py", RESTRICTED + "\npickle.loads(b)"),
    ],
)
def test_the_scanner_catches_unsafe_code(path, source):
    assert unsafe_calls(source, path)


@pytest.mark.parametrize(
    "path, source",
    [
        ("txl/x.py", "model.eval()"),
        ("txl/x.py", "import torch\ntorch.load(p, map_location='cpu', weights_only=True)"),
        ("txl/x.py", "import numpy as np\nnp.load(p)"),
        ("txl/x.py", "import ast\nast.literal_eval(s)"),
        ("txl/x.py", "import pickle\nraise pickle.UnpicklingError('no')"),
        ("txl/vocab.py", RESTRICTED),
    ],
)
def test_the_scanner_lets_safe_code_pass(path, source):
    assert unsafe_calls(source, path) == []


# ---- gr.Error, not a crash, from the handlers called directly ---------------------------


def test_handlers_turn_bad_values_into_gr_error(server):
    _, txl_app = server
    state = txl_app.service.ensure(None)
    txl_app.watch.step(PROMPT, True, MEM_LEN, 0.8, 0, 1.0, 0, None, None, state)
    text = state.session.text
    for args in (
        (PROMPT, True, MEM_LEN, math.nan, 0, 1.0, 0),
        (PROMPT, True, MEM_LEN, 0.8, -1, 1.0, 0),
        (PROMPT, True, MEM_LEN, 0.8, 0, 0.0, 0),
        (PROMPT, True, -5, 0.8, 0, 1.0, 0),
        (PROMPT, True, MEM_LEN, 0.8, 0, 1.0, 2**64),
        (MEGABYTE, True, MEM_LEN, 0.8, 0, 1.0, 0),
    ):
        with pytest.raises(gr.Error):
            txl_app.watch.step(*args, None, None, state)
        assert state.session.text == text
    with pytest.raises(gr.Error, match="n_tokens"):
        list(txl_app.watch.generate(PROMPT, 0, True, MEM_LEN, 0.8, 0, 1.0, 0, None, None, state))
    assert state.session.text == text


def test_a_busy_session_answers_instead_of_waiting_forever(server):
    _, txl_app = server
    state = txl_app.service.ensure(None)
    errors = []
    holding, done = threading.Event(), threading.Event()

    def busy():
        with visitors.user_errors(state):
            holding.set()
            done.wait(60)  # until the other request has had its answer

    holder = threading.Thread(target=busy)
    holder.start()
    assert holding.wait(60)
    try:
        with visitors.user_errors(state, timeout=0.05):
            pass
    except gr.Error as e:
        errors.append(str(e))
    finally:
        done.set()
        holder.join()
    assert errors and "Still busy" in errors[0]


def test_redraw_refuses_bad_history_values_and_keeps_the_views(server):
    _, txl_app = server
    assert txl_app.watch.redraw(-1, None, None, None) == (gr.skip(),) * 4  # no session yet
    state = txl_app.service.ensure(None)
    text_view, attention, summary, bars = txl_app.watch.redraw(0, None, None, state)  # no step yet
    assert attention is None and text_view["w"] is None and summary is bars is None
    for _ in range(3):
        txl_app.watch.step(PROMPT, True, MEM_LEN, 0.8, 0, 1.0, 0, None, None, state)
    text = state.session.text
    for back, why in ((1, "between"), (-(10**6), "between"), ("x", "number"), (0.5, "integer")):
        with pytest.raises(gr.Error, match=f"history.*{why}"):
            txl_app.watch.redraw(back, None, None, state)
    assert state.session.text == text and len(state.session.history) == 3
    # unknown layer or head names fall back to the means; -k is k steps back
    text_view, attention, *_ = txl_app.watch.redraw(-1, "layer 99", "head x", state)
    assert attention["rows"] == ["layer 0", "layer 1"] and attention["pos"] == len(text) - 2
    assert text_view["layer"] == "mean over layers"
