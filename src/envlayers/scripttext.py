"""The text of every shell script envlayers writes (the job script, ranks.sh, the tunnel step's script):
jinja2 templates in ``templates/``, rendered by the one environment here, safe by construction.

Every ``{{ ... }}`` in a template must end in one of these filters, which makes the value fit for its spot:

- ``sh``: one shell word, quoted by :func:`envlayers.shell.word` (a NUL byte is refused);
- ``words``: a list of shell words, each quoted as ``sh`` does, joined by spaces;
- ``dq``: text inside a double-quoted string (``"$run_dir/{{ name|dq }}"``): ``\\``, ``$``, backquote and ``"``
  escaped with a backslash by :func:`envlayers.shell.dq_escape`, so it stays text (a NUL byte is refused);
- ``comment``: the rest of a ``#`` line (a control character, which would end the comment, is refused);
- ``num``: an ``int`` and nothing else;
- ``ident``: a shell variable name and nothing else;
- ``code``: only a :class:`Code`, shell text envlayers built from checked names;
- ``heredoc(delimiter)``: the body of a quoted here-document (a line equal to its delimiter is refused).

Each filter returns a :class:`Quoted`; the environment's ``finalize`` hook refuses to print anything else,
so a place without a filter, or an expression that works on a filtered value (``x|sh ~ ''``), stops the
render with :class:`ScriptTextError`, as do an unknown filter and a name that was not given
(``StrictUndefined``). A value is printed once, never read as template text, so a value holding
``{{ ... }}`` is text like any other. Nothing a user typed can run as code where a script runs.

The quoting itself is :mod:`envlayers.shell`'s; this module decides what may go where. A module of its own
beside it: the launcher (ranks.sh) and ``tunnel`` render through it without importing what decides the
job (:mod:`envlayers.jobscript`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import jinja2

from .errors import EnvLayersError
from .shell import dq_escape, word

CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class ScriptTextError(EnvLayersError):
    """A value that cannot be placed in a script as it stands."""


class Code(str):
    """Shell text built by envlayers from checked names; the ``code`` filter passes only this type."""


class Quoted(str):
    """A value a filter made fit for its place; the only type a template may print."""


def shown(text: str, limit: int = 80) -> str:
    """``text`` quoted for a one-line message: control characters escaped, bounded in length."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


# -- the filters --------------------------------------------------------------------------------------

def sh(value) -> Quoted:
    text = str(value)
    if "\0" in text:
        raise ScriptTextError(f"a NUL byte cannot be written into a script: {shown(text)}")
    return Quoted(word(text))


def dq(value) -> Quoted:
    text = str(value)
    if "\0" in text:
        raise ScriptTextError(f"a NUL byte cannot be written into a script: {shown(text)}")
    return Quoted(dq_escape(text))


def words(values) -> Quoted:
    if isinstance(values, str):
        raise ScriptTextError(f"expected a list of words, got the text {shown(values)}")
    return Quoted(" ".join(sh(v) for v in values))


def comment(value) -> Quoted:
    text = str(value)
    if CONTROL_RE.search(text):
        raise ScriptTextError(f"{shown(text)} holds a control character (a newline, ...) and would "
                              "break out of its comment line in the job script", hint="rename it")
    return Quoted(text)


def num(value) -> Quoted:
    if type(value) is not int:
        raise ScriptTextError(f"expected a whole number for a script, got {shown(repr(value))}")
    return Quoted(value)


def ident(value) -> Quoted:
    if not isinstance(value, str) or not _IDENT_RE.match(value):
        raise ScriptTextError(f"expected a shell variable name, got {shown(repr(value))}")
    return Quoted(value)


def code(value) -> Quoted:
    if not isinstance(value, Code):
        raise ScriptTextError("only shell text built by envlayers itself may go into a script unquoted")
    return Quoted(str.__str__(value))


def heredoc(value, delimiter) -> Quoted:
    text = str(value)
    if str(delimiter) in text.split("\n") or "\0" in text:
        raise ScriptTextError(f"the text holds its own end marker {delimiter} or a NUL byte")
    return Quoted(text)


FILTERS = {"sh": sh, "dq": dq, "words": words, "comment": comment, "num": num, "ident": ident, "code": code,
           "heredoc": heredoc}


def _finalize(value):
    if not isinstance(value, Quoted):
        raise ScriptTextError(f"a script template prints {shown(repr(value))} without a filter "
                              f"({', '.join(FILTERS)})")
    return value


def _bytecode_cache() -> "jinja2.BytecodeCache | None":
    """Jinja's own cache of compiled templates, in its default folder (``$TMPDIR/_jinja2-cache-<uid>``, which it
    makes 0700 and refuses when another user owns it or can write it): a template is compiled once per
    source, not at every start (a fifth of a dry run). None when that folder cannot be trusted (the rule of
    the run folders, filetrust.unsafe_folder: also no folder above it that everyone can write without the
    sticky bit, where another user could swap it for theirs): then templates compile every time."""
    import tempfile

    from jinja2.bccache import FileSystemBytecodeCache

    from .filetrust import unsafe_folder

    uid = os.getuid()
    if unsafe_folder(os.path.join(tempfile.gettempdir(), f"_jinja2-cache-{uid}"), uid) is not None:
        return None
    try:
        return FileSystemBytecodeCache()
    except (RuntimeError, OSError):  # Jinja2's own checks refused it
        return None


def environment(loader: jinja2.BaseLoader | None = None) -> jinja2.Environment:
    """The one template environment: ``templates/``, strict about names, quoting filters only."""
    env = jinja2.Environment(loader=loader or jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             autoescape=False, undefined=jinja2.StrictUndefined, finalize=_finalize,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
                             bytecode_cache=_bytecode_cache() if loader is None else None)
    env.filters = dict(FILTERS)  # jinja2's own filters return plain text: none of them is offered
    return env


_ENV = environment()


def render(name: str, **values) -> str:
    """The template ``name`` (in templates/) filled with ``values``."""
    return _checked(lambda: _ENV.get_template(name).render(**values), name)


def render_text(source: str, **values) -> str:
    """``source`` as a template of the same environment (for tests of the rules above)."""
    return _checked(lambda: _ENV.from_string(source).render(**values), "a script template")


def _checked(make, name: str) -> str:
    try:
        return str.__str__(make())
    except jinja2.TemplateError as err:  # an unknown filter or name, a syntax error
        raise ScriptTextError(f"{name}: {err.message}", hint="every place is {{ name|filter }}") from None
    except TypeError as err:  # a filter called with the wrong arguments (heredoc needs its delimiter)
        raise ScriptTextError(f"{name}: {err}", hint="every place is {{ name|filter }}") from None
