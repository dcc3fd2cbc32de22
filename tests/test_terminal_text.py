"""terminal_text: the one filter for text a remote end sent, before any command prints it."""

from __future__ import annotations

import re

import pytest

from envlayers.cli.params import terminal_text

LEFT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


@pytest.mark.parametrize("text, one_line, lines", [
    pytest.param("plain text", "plain text", "plain text", id="plain"),
    pytest.param("a\x1b]0;pwned\x07b", "ab", "ab", id="osc-title-bel"),
    pytest.param("a\x1b]2;pwned\x1b\\b", "ab", "ab", id="osc-title-st"),
    pytest.param("a\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\b", "alinkb", "alinkb", id="osc-hyperlink"),
    pytest.param("a\x1b]52;c;ZXZpbA==\x07b", "ab", "ab", id="osc-clipboard"),
    pytest.param("\x1b[31mred\x1b[0m \x1b[2J\x1b[1;1H", "red ", "red ", id="csi"),
    pytest.param("a\x9b31mb\x9d0;t\x9cc", "abc", "abc", id="c1-csi-osc"),
    pytest.param("a\x1bPq#0;2;0;0;0\x1b\\b", "ab", "ab", id="dcs"),
    pytest.param("x\x00y\x07z\x08\x7f", "xyz", "xyz", id="nul-bel-bs-del"),
    pytest.param("l1\nl2\r\n\tx\ry", "l1 l2   x y", "l1\nl2\n\txy", id="newlines-tabs-cr"),
    pytest.param("safe\u202eexe.txt\u2066x\u2069", "safeexe.txtx", "safeexe.txtx", id="bidi"),
    pytest.param("a\u2028b", "ab", "ab", id="line-separator"),
    pytest.param("\x1b", "", "", id="lone-escape"),
    pytest.param("a\x1b]0;never closed", "a", "a", id="unterminated-osc"),
    pytest.param("\u00e9\u4e2d\U0001f600", "\u00e9\u4e2d\U0001f600", "\u00e9\u4e2d\U0001f600", id="unicode-kept"),
    pytest.param(None, "", "", id="none"),
    pytest.param(12, "12", "12", id="a-number"),
])
def test_terminal_text(text, one_line, lines):
    assert terminal_text(text) == one_line
    assert terminal_text(text, lines=True) == lines


def test_nothing_a_terminal_acts_on_is_left_whatever_the_bytes():
    every = "".join(chr(i) for i in range(0x00, 0x100)) + "\u202e\u2066\u2028\x1b]0;t\x07\x1b[2J"
    assert not LEFT.search(terminal_text(every)) and "\n" not in terminal_text(every)
    kept = terminal_text(every * 3, lines=True)
    assert not LEFT.search(kept) and "\r" not in kept
