"""Where memory matters: the Watch tab's examples, above its prompt (webapp/tabs/watch.py
builds and wires them with the tab). Passages of the validation text that end just before
a character the bundled model predicts far better with memory than through its window,
found and measured by ``scripts/find_memory_moments.py`` (written to
``memory_moments.json`` beside this file: rerun the script when the weights change), and
the recall probe (a made-up speaker planted beyond the window). Choosing one puts it in
the prompt with memory on, and says what one Step will show."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from txl.recall import probe_text
from webapp.serve import ROOT, resolve_source

from .examples import (
    DEFAULT_NAME,
    DEFAULT_WATCH,
    RECALL_BEFORE,
    RECALL_FILLER,
    TEMPERATURE,
    TOP_P,
    read_report,
)

MOMENTS_FILE = Path(__file__).with_name("memory_moments.json")
RECALL_CHOICE = "recall"  # the dropdown's value for the recall probe; the passages: 0, 1, ...
TAIL_CHARS = 30  # of the passage's end, in a choice's label


def load_moments(path: Path = MOMENTS_FILE) -> dict | None:
    """The script's report, or None when the file is missing or unreadable (the tab then
    offers the recall probe alone, and says why)."""
    return read_report(path, "moments", "passage")


def shown(char: str) -> str:
    """A character as a label shows it: a newline or a space made visible."""
    return {"\n": "⏎ (a new line)", " ": "␣ (a space)"}.get(char, char)


def label(moment: dict) -> str:
    """The menu's entry of a moment, of the form '…the passage's end → X · 230× likelier
    with memory (3.83 bits; window 11.68)': the passage's last characters (its new lines
    as ⏎, so that a name cut short reads as the start of its line), the character, how
    much likelier memory makes it, and both figures."""
    passage, char = moment["passage"], moment["char"]
    tail = " ".join(passage[-TAIL_CHARS:].replace("\n", " ⏎ ").split())
    char = {"\n": "⏎", " ": "␣"}.get(char, char)
    return (
        f"…{tail} → {char} · {2 ** moment['bits_saved']:,.0f}× likelier with memory "
        f"({moment['bits_memory']:.2f} bits; window {moment['bits_window']:.2f})"
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


# True of both ways a prompt of one's own comes: typed (the Step samples) or put there by
# the Score tab's Watch it (the Step writes the text's own next character: score.py).
OWN_PROMPT_GUIDE = (
    "**Your own prompt.** Step once: the model writes the next character, sampled with the "
    "settings under *Memory and sampling* (after **Watch it** on the Score tab: the text's "
    "own next character), and the bars under the attention view show its prediction with "
    "memory and without. The passages above are where memory matters most."
)


def guide(report: dict | None, choice: str | None) -> str:
    """What the first Step from the chosen prompt shows: it writes the passage's own next
    character (``next_characters``), not a sample, so that the bars show the prediction
    the words quote."""
    if choice == RECALL_CHOICE:
        _, back = recall_prompt()
        return (
            f"**Step once.** A speaker no play has, **{DEFAULT_NAME}**, spoke {back} characters "
            f"back, beyond the window of a model without memory; now the speaker returns, "
            f"cued by *{DEFAULT_NAME[:3]}*. The Step writes the name's next letter, "
            f"**{DEFAULT_NAME[3]}**, and the bars say how likely the model found it with "
            "memory and through the window alone, which cannot know it. The **How far "
            "back can it recall?** tab measures it at every distance."
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
        f"**Step once.** The play goes on with **{shown(m['char'])}** (“{after}”): the Step "
        "writes it, the passage's own next character rather than a sample. With "
        f"memory ({report['mem_len']} positions) the bundled model (`{report['model']}`) "
        f"ranks it {ordinal(m['rank_memory'])} (p = {percent(m['bits_memory'])}, "
        f"{m['bits_memory']:.2f} bits); through the last {report['seg_len']} characters "
        f"alone, the window a model without memory has, {ordinal(m['rank_window'])} "
        f"(p = {percent(m['bits_window'])}, {m['bits_window']:.2f} bits): memory makes it "
        f"**{times:,.0f} times likelier**. Compare the two predictions under the attention "
        "view, and see where the newest character looks beyond the window. The Steps "
        f"after it sample as the sliders say (temperature {TEMPERATURE}, top-p {TOP_P} as "
        "the page opens). "
        "More: **How far back can it recall?**"
    )


def next_characters(report: dict | None) -> dict[str, str]:
    """prompt -> the character that follows it in its source: each passage's, and the
    recall probe's (its name's next letter). The first Step from one of these prompts
    writes that character (webapp/tabs/watch.py), as the guide says."""
    text, start = probe_text(DEFAULT_NAME, RECALL_FILLER, DEFAULT_WATCH, before=RECALL_BEFORE)
    passages = {m["passage"]: m["char"] for m in report["moments"]} if report else {}
    return {**passages, text[:start]: text[start]}


def choice_of(report: dict | None, prompt: str | None) -> str | None:
    """The example whose prompt this is (None: the visitor's own prompt)."""
    if prompt == recall_prompt()[0]:
        return RECALL_CHOICE
    passages = [m["passage"] for m in report["moments"]] if report else []
    return str(passages.index(prompt)) if prompt in passages else None


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
    """Choosing an example: its prompt, memory on at the session's model's mem_len (the
    passages' numbers were measured at the bundled model's), and the words for it
    (undocumented in the API: a test calls it as /watch_example). The prompt changed
    (typed, or set by Watch it): the menu and the words follow it, the visitor's own
    prompt when it is none of the examples."""
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

    def follow(prompt):
        choice = choice_of(report, prompt)
        return choice, guide(report, choice) if choice is not None else OWN_PROMPT_GUIDE

    ui["example"].input(
        choose,
        [ui["example"], state],
        [ui["prompt"], ui["memory"], ui["mem_len"], ui["example_md"]],
        api_name="watch_example",
        api_visibility="undocumented",
        show_progress="hidden",
        queue=False,
    )
    ui["prompt"].change(
        follow,
        [ui["prompt"]],
        [ui["example"], ui["example_md"]],
        api_visibility="private",
        show_progress="hidden",
        trigger_mode="always_last",
        queue=False,
    )
