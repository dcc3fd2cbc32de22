"""What the commands share: click parameter types that refuse a bad number with one line, never a crash,
and :func:`terminal_text`, the one filter for text a remote end sent before it is printed.

click's own ``FloatRange`` raises a bare ValueError on ``nan``; these say what is wrong with the option
and exit 2 like every other bad input.
"""

from __future__ import annotations

import math
import re

import click

from ..errors import EnvLayersError

# A terminal's escape sequences, each removed whole (so no "]0;title" is left to read): CSI (ESC [ or the
# 8-bit 0x9b ... final byte), OSC (ESC ] or 0x9d ... BEL or ST: a window title, a hyperlink, the clipboard),
# DCS, SOS, PM and APC strings (ESC P, X, ^, _ or 0x90, 0x98, 0x9e, 0x9f ... ST), and ESC with one more byte.
_ESCAPE = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
                     r"|(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                     r"|\x1b[\x20-\x7e]?")
# What is left that a terminal acts on or that hides text: C0 and C1 controls, DEL, the bidirectional
# overrides and isolates (text shown in another order than it is), and the line and paragraph separators.
_CONTROL_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def terminal_text(text: object, *, lines: bool = False) -> str:
    """``text`` that a remote end sent (an HTTP body or error, a served model name, an engine's log line, what
    ssh said), safe to print on a terminal: escape sequences removed whole (an OSC title, a colour, a cursor
    move), every other control character removed. ``lines=False`` (one field of a one-line report) turns a
    newline, a carriage return or a tab into a space, so the text cannot start a line of its own;
    ``lines=True`` (a log shown as it is) keeps newlines and tabs and drops carriage returns. Every command
    prints remote text through this one function."""
    text = "" if text is None else str(text)
    if text.isprintable() and (lines or "\t" not in text):
        return text  # the common case: nothing to do
    text = _ESCAPE.sub("", text)
    if lines:
        return _CONTROL_LINES.sub("", text.replace("\r\n", "\n"))
    return _CONTROL.sub(lambda m: " " if m.group() in "\n\r\t" else "", text)


class Seconds(click.ParamType):
    """A number of seconds: finite, not negative, ``> 0`` unless ``zero_ok``, within ``minimum``..``maximum``.
    A bad one is a one-line ``EnvLayersError`` naming the option (exit 2), never a traceback or a hang."""

    name = "seconds"

    def __init__(self, zero_ok: bool, maximum: float | None = None, hint: str = "", minimum: float | None = None):
        self.zero_ok, self.maximum, self.hint, self.minimum = zero_ok, maximum, hint, minimum

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        else:
            try:
                number = float(str(value).strip())
            except ValueError:
                number = None
        option = param.opts[0] if param is not None and param.opts else "value"
        low = (f"from {self.minimum:g}" if self.minimum is not None
               else "more than 0" if not self.zero_ok else "0 or more")
        limit = f" and at most {self.maximum:g}" if self.maximum is not None else ""
        if number is None or not math.isfinite(number) or number < 0 or (number == 0 and not self.zero_ok) or \
                (self.maximum is not None and number > self.maximum) or \
                (self.minimum is not None and number < self.minimum):
            raise EnvLayersError(f"{value!r} is not a usable number of seconds: give a number {low}{limit}",
                                 where=option, hint=self.hint or f"e.g. {option} 5")
        return number


class Count(click.ParamType):
    """A whole number 0 or more (a line count); a bad one is a one-line ``EnvLayersError`` (exit 2)."""

    name = "count"

    def convert(self, value, param, ctx):
        text = str(value).strip()
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        if text.isdigit():
            return int(text)
        option = param.opts[0] if param is not None and param.opts else "value"
        raise EnvLayersError(f"{value!r} is not a number of lines: give a whole number 0 or more", where=option,
                             hint=f"e.g. {option} 50")
