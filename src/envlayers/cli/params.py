"""Click parameter types shared by the commands: numbers that are refused with one line, never a crash.

click's own ``FloatRange`` raises a bare ValueError on ``nan``; these say what is wrong with the option
and exit 2 like every other bad input.
"""

from __future__ import annotations

import math

import click

from ..errors import EnvLayersError


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
