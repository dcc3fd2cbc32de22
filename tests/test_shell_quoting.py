"""shell.py's quoting forms, each read back by a real bash: what bash reads is the text that went in.

Run through one bash per test (every example a line of one script), so a few hundred examples cost one
process start."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest
from hypothesis import example, given, settings, strategies as st

from envlayers import scripttext, shell
from envlayers.engines.command import RankCommand, shell_line
from srcscan import lines_matching

# bash text holds no NUL byte; anything else may come in a value (newlines, quotes, '$(...)', UTF-8)
TEXT = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=40)


def bash_reads(lines: list[str], env: dict[str, str] | None = None) -> list[str]:
    """Each bash word (or word list) in ``lines`` as bash reads it, one ``printf '%s\\0'`` per line. A line's
    words end with the byte 0xff, which is no UTF-8 text: it reads back as a lone surrogate, which TEXT never
    makes, so no word can be taken for the end of a line."""
    script = "".join(f"printf '%s\\0' {line}; printf '\\377\\0'\n" for line in lines)
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True, env=env or {"PATH": "/usr/bin:/bin"})
    groups, cur = [], []
    for part in out.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]:
        if part == "\udcff":
            groups.append(cur)
            cur = []
        else:
            cur.append(part)
    return groups


@settings(max_examples=200, deadline=None)
@given(st.lists(TEXT, min_size=1, max_size=20))
@example(["\x01", "\xff"])  # bytes a separator of the reader could be taken for
def test_every_form_reads_back_as_the_text(texts):
    lines = []
    for t in texts:
        lines += [shell.word(t), shell.single_quote(t), f'"{shell.dq_escape(t)}"', shell.word_with_refs(t)]
    got = bash_reads(lines)
    want = [[t] for t in texts for _form in range(4)]
    assert got == want


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(TEXT, max_size=5), min_size=1, max_size=10))
@example([["\x01"], ["\xff", ""]])
def test_words_reads_back_as_the_argv(argvs):
    # printf with no argument still prints its format once: an empty argv reads as one empty word
    assert bash_reads([shell.words(argv) for argv in argvs]) == [list(a) if a else [""] for a in argvs]


def test_words_of_an_empty_argv_is_empty_text():
    assert shell.words([]) == ""


def test_word_leaves_a_safe_word_bare_and_quotes_the_rest():
    assert shell.word("/a/b-c_d.e:f@g%h+i=j,k") == "/a/b-c_d.e:f@g%h+i=j,k"
    assert shell.word("") == "''"
    assert shell.word("it's") == "'it'\"'\"'s'"  # shlex.quote's form: the scripts' bytes
    assert shell.single_quote("it's") == "'it'\\''s'"  # the render's form: its bytes
    assert shell.single_quote("abc") == "'abc'"


def test_word_with_refs_leaves_the_references_to_the_shell():
    line = shell.word_with_refs("${ENVLAYERS_MASTER_ADDR}:29500 $HOME `x` \"y\" \\")
    assert line == '"${ENVLAYERS_MASTER_ADDR}:29500 \\$HOME \\`x\\` \\"y\\" \\\\"'
    env = {"PATH": "/usr/bin:/bin", "ENVLAYERS_MASTER_ADDR": "nid001", "HOME": "/h"}
    assert bash_reads([line], env) == [["nid001:29500 $HOME `x` \"y\" \\"]]


def test_the_script_filters_are_shell_quoting():
    for text in ("plain", "it's", "a b", "$(id)", "", "x\ny"):
        assert scripttext.sh(text) == shell.word(text)
        assert scripttext.dq(text) == shell.dq_escape(text)
    assert scripttext.words(["a b", "c"]) == shell.words(["a b", "c"])


def test_a_rank_line_quotes_each_word_once():
    cmd = RankCommand(argv=("vllm", "serve", "--host", "${ENVLAYERS_MASTER_ADDR}", "a b"), env={"X": "it's"})
    assert shell_line(cmd) == "X='it'\"'\"'s' vllm serve --host \"${ENVLAYERS_MASTER_ADDR}\" 'a b'"
    assert shlex.split(shell_line(cmd))[0] == "X=it's"


# every other module quotes through shell.py; the standalone scripts beside the package (run with the standard
# library only) are the exceptions
_BY_HAND = re.compile(r"shlex\.(quote|join)\(|'\\\\''")
_ALLOWED = {"shell.py", "launch/raynode.py", "gateway_app.py"}


def test_no_module_quotes_for_bash_by_hand():
    assert lines_matching(_BY_HAND, _ALLOWED, ()) == []


@pytest.mark.parametrize("line", ["return shlex.quote(x)", "f'{shlex.join(argv)}'", "t.replace(\"'\", \"'\\\\''\")"])
def test_the_quoting_check_sees_quoting_by_hand(line):
    assert _BY_HAND.search(line)
