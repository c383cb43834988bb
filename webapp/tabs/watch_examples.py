"""Where memory matters: the Watch tab's examples, above its prompt (webapp/tabs/watch.py
builds and wires them with the tab). Passages of the validation text that end just before
a character the bundled model predicts far better with memory than through its window,
found and measured by ``scripts/find_memory_moments.py`` (written to
``memory_moments.json`` beside this file: rerun the script when the weights change), and
the recall probe (a made-up speaker planted beyond the window). Choosing one puts it in
the prompt with memory on, and says what one Step will show."""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr

from txl.recall import probe_text
from webapp.serve import ROOT, resolve_source

from .examples import DEFAULT_NAME, DEFAULT_WATCH, RECALL_BEFORE, RECALL_FILLER

MOMENTS_FILE = Path(__file__).with_name("memory_moments.json")
RECALL_CHOICE = "recall"  # the dropdown's value for the recall probe; the passages: 0, 1, ...
TAIL_CHARS = 30  # of the passage's last line, in a choice's label


def load_moments(path: Path = MOMENTS_FILE) -> dict | None:
    """The script's report, or None when the file is missing or unreadable (the tab then
    offers the recall probe alone, and says why)."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
        report["moments"][0]["passage"]  # noqa: B018 (the one thing the tab needs)
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    return report


def shown(char: str) -> str:
    """A character as a label shows it: a newline or a space made visible."""
    return {"\n": "⏎ (a new line)", " ": "␣ (a space)"}.get(char, char)


def label(moment: dict) -> str:
    """'…and therefore look not sour.⏎⏎ → K · memory 3.94 bits, window 10.89': the end of
    the passage's last line (its new lines as ⏎), the character, and both figures."""
    passage, char = moment["passage"], moment["char"]
    text = passage.rstrip("\n")
    tail = text.split("\n")[-1][-TAIL_CHARS:] + "⏎" * (len(passage) - len(text))
    char = "⏎" if char == "\n" else char
    return (
        f"…{tail} → {char} · memory "
        f"{moment['bits_memory']:.2f} bits, window {moment['bits_window']:.2f}"
    )


def recall_prompt() -> tuple[str, int]:
    """The recall probe's prompt (the Recall tab's defaults: the name entering after
    RECALL_BEFORE, the filler, k = DEFAULT_WATCH; up to the first letter it scores) and how
    far back the name lies from that letter."""
    text, start = probe_text(DEFAULT_NAME, RECALL_FILLER, DEFAULT_WATCH, before=RECALL_BEFORE)
    return text[:start], start - len(RECALL_BEFORE)


def choices(report: dict | None) -> list[tuple[str, str]]:
    passages = [(label(m), str(i)) for i, m in enumerate(report["moments"])] if report else []
    back = recall_prompt()[1]
    recall = f"The recall probe: {DEFAULT_NAME} planted {back} characters back"
    return passages + [(recall, RECALL_CHOICE)]


def guide(report: dict | None, choice: str | None) -> str:
    """What to look at after one Step from the chosen prompt."""
    if choice == RECALL_CHOICE:
        _, back = recall_prompt()
        return (
            f"**Step once.** A speaker no play has, **{DEFAULT_NAME}**, spoke {back} characters "
            f"back, beyond the window of a model without memory; now the speaker returns, "
            f"cued by *{DEFAULT_NAME[:3]}*. Does the prediction with memory put "
            f"*{DEFAULT_NAME[3]}* first, where the window alone cannot know it? The "
            "**How far back can it recall?** tab measures it at every distance."
        )
    if report is None or choice is None:
        return (
            "**Start here:** pick a passage where memory matters, then **Step** once. "
            "(The passages are missing: run `scripts/find_memory_moments.py`.)"
            if report is None
            else "**Start here:** pick a passage where memory matters, then **Step** once."
        )
    m = report["moments"][int(choice)]
    after = m["after"].replace("\n", " ⏎ ")
    times = 2 ** m["bits_saved"]
    return (
        f"**Step once.** The play goes on with **{shown(m['char'])}** (“{after}”). With "
        f"memory ({report['mem_len']} positions) the bundled model (`{report['model']}`) "
        f"ranks it {ordinal(m['rank_memory'])} (p = {percent(m['bits_memory'])}, "
        f"{m['bits_memory']:.2f} bits); through the last {report['seg_len']} characters "
        f"alone, the window a model without memory has, {ordinal(m['rank_window'])} "
        f"(p = {percent(m['bits_window'])}, {m['bits_window']:.2f} bits): memory makes it "
        f"**{times:,.0f} times likelier**. Compare the two predictions under the attention "
        "view, and see where the newest character looks beyond the window. Step samples "
        "(temperature 0.8), so it may draw another character; the bars show both "
        "predictions either way. More: **How far back can it recall?**"
    )


def ordinal(rank: int) -> str:
    """1 -> '**first**', 3 -> '**3rd**' (of the model's guesses)."""
    if rank == 1:
        return "**first**"
    suffix = "th" if 10 <= rank % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(rank % 10, "th")
    return f"**{rank}{suffix}**"


def percent(bits: float) -> str:
    """2^-bits as a percentage with two significant digits (91 %, 6.5 %, 0.051 %)."""
    p = 100 * 2**-bits
    return f"{p:.2g} %" if p < 10 else f"{p:.0f} %"


def opening(service, report: dict | None) -> tuple[str, str | None]:
    """(prompt, choice) of a new page: the best passage when the app's model is the one
    the passages were measured on, so that the first Step shows memory at work; else
    the plain prompt."""
    measured_on = str((ROOT / report["model"]).resolve()) if report else None
    if service.default_model is not None and resolve_source(service.default_source) == measured_on:
        return report["moments"][0]["passage"], "0"
    return "ROMEO:\n", None


def build(service) -> dict:
    """The prompt, the examples above it and the words that say what to look at."""
    report = load_moments()
    prompt, choice = opening(service, report)
    ui = {}
    ui["example"] = gr.Dropdown(
        choices(report),
        value=choice,
        label="Start here: a passage where memory matters (then Step once)",
        elem_id="example",
    )
    ui["example_md"] = gr.Markdown(guide(report, choice), elem_id="example_guide")
    ui["prompt"] = gr.Textbox(prompt, lines=2, max_lines=6, label="Prompt", elem_id="prompt")
    return ui


def wire(service, ui: dict, state: gr.State) -> None:
    """Choosing an example: its prompt, memory on at the session's model's mem_len, and
    the words for it. Undocumented in the API (a test calls it as /watch_example)."""
    report = load_moments()

    def choose(choice, state):
        if choice is None:  # cleared (through the API): nothing to put in the prompt
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        if choice == RECALL_CHOICE:
            prompt = recall_prompt()[0]
        else:
            prompt = report["moments"][int(choice)]["passage"]
        model = state.model if state is not None else service.default_model
        mem_len = service.start_mem_len(model) if model is not None else gr.skip()
        return prompt, True, mem_len, guide(report, choice)

    ui["example"].input(
        choose,
        [ui["example"], state],
        [ui["prompt"], ui["memory"], ui["mem_len"], ui["example_md"]],
        api_name="watch_example",
        api_visibility="undocumented",
        show_progress="hidden",
        queue=False,
    )
