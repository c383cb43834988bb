"""scripts/generation_check.py, the check of memory in what the model writes: its scenes are
the validation text's own, its headings and casts are read as a play writes them, its
batched generation is the model's own sampling, and its heading probe reads the model's
direct bits."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

from tests.test_app import tiny_model
from txl import TransformerXL
from txl.sampling import filter_logits
from txl.scoring import memory_nll, sliding_nll
from txl.tokenizer import CharTokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import generation_check as check  # noqa: E402

SPEAKERS = ["ROMEO", "JULIET", "NURSE", "FRIAR LAURENCE", "TYBALT", "Lady Capulet"]
WORDS = ["east", "sun", "moon", "light", "night", "rose", "name", "word", "love", "hate"]
PLAY = "".join(  # speakers in turn, some returning soon, some late
    f"{SPEAKERS[(i * 7 // 3) % 6]}:\nIt is the {WORDS[i % 10]}, and {WORDS[i // 10 % 10]} "
    f"is the sun.\nArise, fair {WORDS[i // 100 % 10]}.\n\n"
    for i in range(1200)
)


def test_headings_are_names_alone_on_their_line_after_a_blank_line():
    text = "ROMEO:\nWhat, ho!\nWho: is it?\n\nFRIAR LAURENCE:\nThe grey-eyed morn\n\nJuliet:\n"
    assert check.headings(text) == [(0, "ROMEO"), (30, "FRIAR LAURENCE"), (66, "Juliet")]
    assert text[30:].startswith("FRIAR") and "Who" not in dict(check.headings(text)).values()
    # the cast: speakers whose heading lies in the last `reach` characters
    assert check.cast(text, len(text) - 30) == {"FRIAR LAURENCE", "Juliet"}
    assert check.cast(text, len(text)) == {"ROMEO", "FRIAR LAURENCE", "Juliet"}


def test_real_scenes_are_the_texts_own_prompts_ending_where_a_speech_starts():
    scenes = check.real_scenes(PLAY, 5, 300, seed=2)
    assert len(scenes) == 5
    for prompt, own in scenes:
        assert len(prompt) == check.PROMPT_CHARS and prompt.endswith("\n\n")
        assert prompt + own in PLAY and check.headings(own)[0][0] == 0  # a heading comes next
        assert len(own) == 300
    assert scenes == check.real_scenes(PLAY, 5, 300, seed=2)  # seeded


def test_made_up_scenes_end_with_three_new_speakers_who_each_speak_twice():
    for prompt, names in check.made_up_scenes(PLAY, 6, seed=3):
        assert len(prompt) == check.PROMPT_CHARS and prompt.endswith("\n\n")
        assert len({n[:2].upper() for n in names}) == 3  # told apart by two letters
        written = [name for _, name in check.headings(prompt)][-6:]
        assert written == names + names and not set(names) & set(SPEAKERS)


def test_renamed_text_keeps_every_speech_and_names_each_speaker_one_way_per_scene():
    text = check.renamed(PLAY, seed=4, chunk=30)
    old, new = check.headings(PLAY), check.headings(text)
    assert len(old) == len(new)
    assert [s.split("\n", 1)[1] for s in text.split("\n\n") if s] == [
        s.split("\n", 1)[1] for s in PLAY.split("\n\n") if s
    ]
    for a in range(0, len(old), 30):
        pairs = {(o, n) for (_, o), (_, n) in zip(old[a : a + 30], new[a : a + 30])}
        assert len({o for o, _ in pairs}) == len(pairs) == len({n for _, n in pairs})
        assert not {n for _, n in pairs} & set(SPEAKERS)


def reference_generate(model, prompts, n, temperature, seed, mem_len, top_p=1.0):
    """The same sampling through the model's plain forward (hidden-state memory), from the
    page's sampler's nucleus (txl.sampling.filter_logits)."""
    W, tok = model.config.tgt_len, model.tokenizer
    ids = torch.tensor([tok.encode(p) for p in prompts])
    generator, mems, written = torch.Generator().manual_seed(seed), None, []
    with torch.no_grad():
        if mem_len is not None:
            for a in range(0, ids.size(1), W):
                out = model(ids[:, a : a + W], mems=mems, mem_len=mem_len)
                mems = out.mems
        for _ in range(n):
            if mem_len is None:
                out = model(ids[:, -W:], mem_len=W)
            p = filter_logits(out.logits[:, -1], temperature, top_p=top_p).softmax(-1)
            nxt = torch.multinomial(p, 1, generator=generator)
            written.append(nxt)
            ids = torch.cat([ids, nxt], 1)
            if mem_len is not None:
                out = model(nxt, mems=out.mems, mem_len=mem_len)
    return [tok.decode(row) for row in torch.cat(written, 1).tolist()]


def test_batched_generation_is_the_models_own_sampling_with_memory_and_through_the_window(
    tmp_path,
):
    model = TransformerXL.from_pretrained(tiny_model(tmp_path / "m", seed=5)).eval()
    prompts = [p for p, _ in check.real_scenes(PLAY, 3, 100, seed=1)]
    for mem_len in (None, 40):
        texts = check.generate(model, prompts, 30, 0.8, 7, mem_len)
        assert [len(t) for t in texts] == [30, 30, 30]
        assert texts == reference_generate(model, prompts, 30, 0.8, 7, mem_len)


def test_a_nucleus_cut_samples_as_the_page_does_and_names_its_readings(tmp_path):
    model = TransformerXL.from_pretrained(tiny_model(tmp_path / "m", seed=5)).eval()
    prompts = [p for p, _ in check.real_scenes(PLAY, 3, 100, seed=1)]
    whole = check.generate(model, prompts, 30, 1.0, 7, 40)
    cut = check.generate(model, prompts, 30, 1.0, 7, 40, top_p=0.5)
    assert cut == reference_generate(model, prompts, 30, 1.0, 7, 40, top_p=0.5) != whole
    args = check.argparse.Namespace(top_p=0.5)
    assert check.label("memory", 0.8, args) == "memory T=0.8 top-p=0.5"
    assert check.label("memory", 0.8, check.argparse.Namespace(top_p=1.0)) == "memory T=0.8"


def test_forced_writing_reads_the_given_text_and_the_first_step_is_the_sampled_ones(tmp_path):
    model = TransformerXL.from_pretrained(tiny_model(tmp_path / "m", seed=5)).eval()
    scenes = check.real_scenes(PLAY, 3, 100, seed=1)
    prompts, own = [p for p, _ in scenes], [t for _, t in scenes]
    for mem_len in (None, 40):
        sampled, p_sampled = check.write(model, prompts, 30, 0.8, 7, mem_len)
        forced, p_forced = check.write(model, prompts, 30, 0.8, 7, mem_len, forced=own)
        assert forced == [t[:30] for t in own] != sampled
        assert p_forced.shape == p_sampled.shape == (3, 30, len(model.tokenizer))
        assert torch.allclose(p_forced.sum(-1), torch.ones(3, 30))
        assert torch.equal(p_forced[:, 0], p_sampled[:, 0])  # the same prompt, the same step
        assert not torch.equal(p_forced[:, 1:], p_sampled[:, 1:])


def test_the_casts_probability_is_read_where_each_heading_starts():
    tokenizer = CharTokenizer.from_text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz :\n")
    texts = ["ROMEO:\nHo.\n\nJULIET:\nHa.\n\nBENVOLIO:\n", "Still speaking.\n\nNURSE:\n"]
    casts = [{"ROMEO", "Juliet"}, {"ROMEO"}]
    probs = torch.zeros(2, 40, len(tokenizer))
    R, J, B = (tokenizer.encode(c)[0] for c in "RJB")
    probs[0, 0, R], probs[0, 0, J], probs[0, 0, B] = 0.5, 0.25, 0.25  # the first heading
    probs[0, 12, J], probs[0, 12, R] = 0.2, 0.1  # JULIET's J at 12
    probs[0, 25, B], probs[0, 25, R] = 0.9, 0.05  # BENVOLIO's B at 25
    probs[1, 17, R] = 0.3  # NURSE's N at 17: not after the prompt
    reading = check.cast_probability(texts, probs, casts, tokenizer)
    assert reading["first_n"] == 1 and math.isclose(reading["first"], 0.75, rel_tol=1e-6)
    later = (0.3 + 0.05 + 0.3) / 3  # J's 0.2 + R's 0.1; R's 0.05 (B is not cast); R's 0.3
    assert reading["later_n"] == 3 and math.isclose(reading["later"], later, rel_tol=1e-6)


def test_the_heading_probe_reads_returning_speakers_from_the_models_direct_bits(tmp_path):
    model = TransformerXL.from_pretrained(tiny_model(tmp_path / "m", seed=6)).eval()
    text, mem_len = PLAY[:3000], 400
    reading = check.heading_bits(model, text, mem_len)
    W, ids = model.config.tgt_len, torch.tensor(model.tokenizer.encode(text))
    memory = memory_nll(model, ids, W, mem_len).double() / math.log(2)
    window = sliding_nll(model, ids, W).double() / math.log(2)
    last, first, rest = {}, [], []
    for at, name in check.headings(text):
        if name in last and at - last[name] <= mem_len + W and at >= W:
            first.append(memory[at - 1].item())
            rest.append(window[at : at + len(name) - 1].mean().item())
        last[name] = at
    assert reading["returning"] == len(first) > 10
    assert math.isclose(reading["first_letter_memory"], sum(first) / len(first))
    assert math.isclose(reading["rest_window"], sum(rest) / len(rest), abs_tol=1e-5)


def test_made_up_names_are_drawn_afresh_by_seed():
    a = [n for _, n in check.made_up_scenes(PLAY, 4, seed=1)]
    assert a == [n for _, n in check.made_up_scenes(PLAY, 4, seed=1)]
    assert a != [n for _, n in check.made_up_scenes(PLAY, 4, seed=2)]


def test_the_real_scenes_reading_reports_choice_and_copy_apart(tmp_path):
    import argparse

    model = TransformerXL.from_pretrained(tiny_model(tmp_path / "m", seed=5)).eval()
    args = argparse.Namespace(mem_len=40, scenes=3, chars=60, seed=1, temperatures=[0.8],
                              window_temperatures=[0.8], samples=1, top_p=1.0)  # fmt: skip
    result = check.read_real(model, PLAY, args)
    ref = result["reference"]  # the text's own continuations: its headings are the play's
    scenes = check.real_scenes(PLAY, 3, 60, 1)
    casts = [check.cast(p, 40 + model.config.tgt_len) for p, _ in scenes]
    names = [(n, c) for (_, t), c in zip(scenes, casts) for _, n in check.headings("\n\n" + t)]
    assert ref["headings"] == len(names) > 0
    assert ref["cast_letter"] == sum(n[0] in {m[0] for m in c} for n, c in names) / len(names)
    assert set(result) == {"reference", "memory T=0.8", "window T=0.8"}
    assert ref["cast_probability T=0.8"]["first_n"] == 3  # every continuation opens a heading
    text = check.report("tiny", {"real": result}, args, model.config.tgt_len)
    assert "the text itself: " in text and "memory T=0.8: " in text and "window T=0.8: " in text


def test_misses_are_read_as_blends_of_a_cast_name_or_the_priors_names():
    """Of the headings begun with a cast member's letter and not one: a blend is within two
    letters of that member, the prior's name a speaker of the training text."""
    assert check.letters_apart("BETRUCHIO", "PETRUCHIO") == 1
    assert check.letters_apart("MIRANDAND", "MIRANDA") == 2 and check.letters_apart("", "AB") == 2
    cast = {"PETRUCHIO", "PROSPERO", "KATHARINA"}
    written = (
        "PETRUCHIO:\nay.\n\nPETRUCHO:\nno.\n\nPAULINA:\nso.\n\nPANDARUS:\nhm.\n\nROMEO:\nah.\n\n"
    )
    r = check._heading_share([written], [cast], known={"PAULINA", "ROMEO", "PETRUCHIO"})
    assert (r["headings"], r["from_cast"], r["missed"]) == (5, 1, 3)  # ROMEO: no cast letter
    assert r["blend_of_missed"] == 1 / 3 and r["prior_of_missed"] == 1 / 3
