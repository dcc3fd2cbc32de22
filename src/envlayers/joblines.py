"""The lines a job prints into its own output, ``ENVLAYERS-<KIND>: <text>``: each kind, and each line the
operator's side reads back, declared once, as the text its producer makes and the pattern its reader
matches.

A :class:`Kind` is the prefix (``STAGE.line("...")`` makes a line, :func:`parse` splits one). A
:class:`Form` is one line of a kind that a reader takes apart (``rank 3 up on nid001``): a
``str.format`` text whose fields the producer fills (:meth:`Form.line`, or :meth:`Form.shell` for a job
script that fills them at run time) and the reader gets back (:meth:`Form.match`), the pattern built from
that same text. The package makes its lines with these (``STAGE.line(f"...")``); the standalone scripts
(``gateway_app.py``, ``launch/raynode.py``) cannot import this module and spell their lines themselves
(what is read of the gateway's, :data:`GATEWAY_LINES`, is declared here), and so do the job scripts'
templates for the lines no reader takes apart.
"""

from __future__ import annotations

import re
import string
from typing import Callable, Mapping

MARK = "ENVLAYERS-"  # every line of the job's own starts with it: `grep ENVLAYERS- job.out`


class Kind:
    """One kind of line: ``ENVLAYERS-<name>: ``."""

    __slots__ = ("name", "prefix")

    def __init__(self, name: str):
        self.name = name
        self.prefix = f"{MARK}{name}: "

    def __repr__(self) -> str:
        return f"Kind({self.name!r})"

    def line(self, text: str) -> str:
        return self.prefix + text


STAGE = Kind("STAGE")  # a step of the launch, said as it happens
TOPOLOGY = Kind("TOPOLOGY")  # what the plan decided, and why
WARN = Kind("WARN")  # something is off; the job goes on
ERROR = Kind("ERROR")  # why the job ends
DIAG = Kind("DIAG")  # Slurm's view of ranks that did not start
POOL = Kind("POOL")  # the elastic pool's decisions
TUNNEL = Kind("TUNNEL")  # a tunnel step's own lines (in its log, not the job output)
KINDS: tuple[Kind, ...] = (STAGE, TOPOLOGY, WARN, ERROR, DIAG, POOL, TUNNEL)
BY_NAME: Mapping[str, Kind] = {k.name: k for k in KINDS}
REPORTED: tuple[Kind, ...] = (STAGE, TOPOLOGY, WARN, ERROR, DIAG)  # the kinds the launcher's report reads

_LINE_RE = rf"^{MARK}({'|'.join(k.name for k in REPORTED)}):\s?(.*)$"


def parse(line: str) -> tuple[str, str] | None:
    """``(kind name, text)`` of a line of a :data:`REPORTED` kind (the text stripped), else None."""
    m = re.match(_LINE_RE, line)  # re's own cache keeps it compiled
    return (m.group(1), m.group(2).strip()) if m else None


def line(kind: str, text: str) -> str:
    """The line of kind ``kind`` (its name) saying ``text``: :func:`parse`'s inverse."""
    return BY_NAME[kind].line(text)


class Form:
    """One line of ``kind`` a reader takes apart. ``text``: a ``str.format`` text with named fields;
    ``fields``: each field's pattern for the reader; ``whole``: the pattern must reach the line's end
    (else the text only has to start the line); ``older``: a pattern for what earlier launchers printed,
    read as well (its named groups are the fields with ``_`` added: a pattern names a group once)."""

    def __init__(self, kind: Kind, text: str, fields: Mapping[str, str], *, whole: bool = False,
                 older: str | None = None):
        self.kind, self.text, self.fields, self.whole, self.older = kind, text, fields, whole, older
        self._pattern: re.Pattern | None = None

    def __repr__(self) -> str:
        return f"Form({self.kind.name}, {self.text!r})"

    @property
    def pattern(self) -> re.Pattern:
        """The reader's pattern, built from :attr:`text` (once, when first needed: the job script's
        render imports this module and reads nothing)."""
        if self._pattern is None:
            parts = []
            for literal, name, _spec, _conv in string.Formatter().parse(self.text):
                parts.append(re.escape(literal))
                if name is not None:
                    parts.append(f"(?P<{name}>{self.fields[name]})")
            body = "".join(parts) + ("$" if self.whole else "")
            if self.older:
                body = f"(?:{body}|{self.older})"
            self._pattern = re.compile("^" + body)
        return self._pattern

    def text_of(self, **values) -> str:
        """The text after the prefix, ``values`` filled in."""
        return self.text.format(**values)

    def line(self, **values) -> str:
        """The whole line, ``values`` filled in."""
        return self.kind.line(self.text_of(**values))

    def shell(self, exprs: Mapping[str, str], literal: Callable[[str], str]) -> str:
        """The whole line as a job script prints it: each field the shell expression ``exprs[name]`` (put
        in as it stands), each piece of literal text through ``literal`` (the script's quoting)."""
        out = [literal(self.kind.prefix)]
        for text, name, _spec, _conv in string.Formatter().parse(self.text):
            out.append(literal(text))
            if name is not None:
                out.append(exprs[name])
        return "".join(out)

    def match(self, text: str) -> dict[str, str] | None:
        """The fields of ``text`` (a line's text, after the prefix) when it is this line, else None."""
        m = self.pattern.match(text)
        if m is None:
            return None
        return {k.rstrip("_"): v for k, v in m.groupdict().items() if v is not None}  # older's names end in _

    def match_line(self, whole_line: str) -> dict[str, str] | None:
        """:meth:`match` of a whole line, its prefix included."""
        if not whole_line.startswith(self.kind.prefix):
            return None
        return self.match(whole_line[len(self.kind.prefix):])


# --- the lines a reader takes apart ---

RUN_DIR = Form(STAGE, "run_dir={path}", {"path": r".+"}, whole=True)  # the job script, first thing
RANK_UP = Form(STAGE, "rank {rank} up on {host}", {"rank": r"\d+", "host": r"\S+"})  # ranks.sh, a rank's first line
ALL_STARTED = Form(STAGE, "all {n} ranks started", {"n": r"\d+"},
                   older=r"all (?P<n_>\d+) ranks? (?:started|launched)")
LIVE = Form(STAGE, "endpoint live after {seconds:.1f}s", {"seconds": r"[\d.]+"},
            older=r"endpoint live after (?P<seconds_>[\d.]+)\s+s")
TAIL_HEADER = Form(ERROR, "last {n} lines of {log}:", {"n": r"\d+", "log": r".*"}, whole=True)  # a log's tail follows
UNRECORDED_END = Form(ERROR, "the launcher ended with code {code} but could not record it in {path} ({why}): "
                             "{reason}", {"code": r"-?\d+", "path": r".+", "why": r"[^()]*", "reason": r".*"},
                      whole=True)
RUN_DIR_UNWRITABLE = Form(ERROR, "cannot write the run directory {path}: {error} ({doing}); the job ends before "
                                 "any rank starts: free space there, or point SCRATCH (or RUN_ROOT) at a writable "
                                 "file system", {"path": r".+", "error": r"[^:]+?", "doing": r"[^()]*"})
FORMS: tuple[Form, ...] = (RUN_DIR, RANK_UP, ALL_STARTED, LIVE, TAIL_HEADER, UNRECORDED_END, RUN_DIR_UNWRITABLE)

# the gateway's own lines in rank 0's log, relayed into the job output (gateway_app.py prints them)
GATEWAY_LINES: tuple[str, ...] = tuple(k.prefix + "gateway: " for k in (ERROR, WARN, STAGE))
