"""The one check of what a visitor sends: every handler and every number component of the
page goes through :func:`number` before a value reaches a Session, so that a refusal
always says which setting and why ("mem_len must be between 0 and 2048, got 4096").

- :func:`number` (and :func:`as_int`, its integer form): a number, an integer when asked,
  within a range when given; a ``ValueError`` otherwise (``serve.user_errors`` turns it
  into the page's message).
- :func:`name_input_errors`: the same check in front of Gradio's own (a Slider's range, a
  Number's precision), so that the API's refusals name the parameter too.
- :func:`parse_choice`: a layer or head as the dropdowns and the API send it.

txl checks its own arguments (``txl.session.check_temperature`` and friends); this is the
demo's side, for the values that come from the page.
"""

from __future__ import annotations

import re

import gradio as gr


def number(name: str, value, lo=None, hi=None, *, integer: bool = False, strict: bool = False):
    """``value`` as a number (an int when ``integer``), or a ValueError that names it.

    ``strict``: only a JSON number will do (what a component receives from the API: a
    string, a bool or a null is refused); otherwise a string such as "5" is read too.
    ``lo`` / ``hi``: the inclusive range (integers only)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            if strict:
                raise TypeError
            value = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number, got {value!r:.60}") from None
    if integer and isinstance(value, float) and not value.is_integer():  # 2.5, NaN, inf
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if integer and lo is not None and hi is not None:
        if not lo <= value <= hi:
            raise ValueError(f"{name} must be between {lo} and {hi}, got {int(value)}")
        return int(value)
    return value


def as_int(name: str, value, lo: int, hi: int) -> int:
    """An integer setting within [lo, hi] (see :func:`number`)."""
    return number(name, value, lo, hi, integer=True)


def parse_choice(value, prefix: str, limit: int) -> int | None:
    """'layer 3' / '3' -> 3; 'all layers' / 'mean over heads' / None / out of range -> None."""
    match = re.fullmatch(rf"\s*(?:{prefix}\s*)?(\d+)\s*", str(value or ""))
    if match is None:
        return None
    index = int(match.group(1))
    return index if index < limit else None


def name_input_errors(components) -> None:
    """Gradio checks a Slider's or a Number's range before the handler runs, with a message
    that does not say which setting ("Value 5 is greater than maximum value 2."), and a
    string, a null or a NaN sent through the API fails there with no message at all. Wrap
    the preprocessing of these inputs ((API name, component) pairs) so that every refusal
    says which parameter and why; a Checkbox takes true or false only."""
    for name, component in components:
        if isinstance(component, (gr.Slider, gr.Number)):
            integer = getattr(component, "precision", None) == 0  # gradio would round it
            component.preprocess = _named_number(name, component.preprocess, integer)
        elif isinstance(component, gr.Checkbox):
            component.preprocess = _strict_bool(name, component.preprocess)


def _named_number(name: str, preprocess, integer: bool = False):
    def checked(payload):
        try:
            number(name, payload, integer=integer, strict=True)
        except ValueError as e:
            raise gr.Error(str(e)) from None
        try:
            return preprocess(payload)
        except gr.Error as e:
            raise gr.Error(f"{name}: {e.message}") from None
        except (ValueError, OverflowError):  # NaN or infinity rounded to an integer
            raise gr.Error(f"{name} must be a finite number, got {payload}") from None

    return checked


def _strict_bool(name: str, preprocess):
    def checked(payload):
        if not isinstance(payload, bool):
            raise gr.Error(f"{name} must be true or false, got {payload!r:.60}")
        return preprocess(payload)

    return checked
