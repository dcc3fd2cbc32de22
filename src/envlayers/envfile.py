"""One env layer file -> ordered assignments, with bash's meaning.

The accepted language is a small, exact subset of bash: comments, blank lines, an optional
``export``, and one ``KEY=value`` per statement, where the value is made of unquoted text,
'single-quoted' text, "double-quoted" text and the references ``$NAME``, ``${NAME}``,
``${NAME-default}`` and ``${NAME:-default}``. Anything else is an error naming ``file:line``.
Quoted values may span lines, as in bash.

A value is a tuple of parts: ``str`` for literal text and :class:`Ref` for a reference.
Nothing is expanded here; :mod:`envlayers.layers` does that. :func:`value_text` writes a value back as
text, its references as ``${NAME}``, ``${NAME-default}``, ``${NAME:-default}``.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from .errors import LayerSyntaxError

ACCEPTED = (
    "accepted: comments, blank lines, [export] KEY=value with unquoted, 'single' or \"double\" "
    "quoted values, and $NAME, ${NAME}, ${NAME-default}, ${NAME:-default}"
)

_NAME_START = re.compile(r"[A-Za-z_]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BLANK = " \t"
# characters that end or break an unquoted word in bash
_UNQUOTED_STOP = set(" \t\n'\"\\$`;&|<>()")
_SPECIAL = "is a bash special variable and cannot be set from a layer"
_SPECIAL_FIX = "choose another name"
# Keys a layer may not assign: key -> (why, the safe alternative). One table; docs/layers.md lists it.
# Bash's own specials first, then keys that make bash, the dynamic loader or Python run code the
# layers never show. A layer's keys reach the launcher itself (`python -m envlayers launch` runs after
# the layers are exported), so where Python and the loader look for code is refused too: a layer file
# in a shared folder would otherwise run its author's code as the job's owner, and so would a value naming a
# folder another user can write (PYTHONPATH, LD_LIBRARY_PATH, HOME, ...). PATH stays allowed: the
# job runs its own commands by absolute path or through srun, and sites put their tools on it.
_ENGINE_ONLY = "set it for the engine only, in the EDF's [env] table or in the image (docs/containers.md)"
REFUSED: dict[str, tuple[str, str]] = {
    **{k: (_SPECIAL, _SPECIAL_FIX) for k in (
        "_ BASHPID BASH_ALIASES BASH_ARGC BASH_ARGV BASH_ARGV0 BASH_CMDS BASH_COMMAND BASH_COMPAT "
        "BASH_LINENO BASH_REMATCH BASH_SOURCE BASH_SUBSHELL BASH_VERSINFO COMP_WORDBREAKS DIRSTACK "
        "EPOCHREALTIME EPOCHSECONDS EUID FUNCNAME GROUPS HISTCMD IFS LINENO OPTARG OPTIND PIPESTATUS "
        "POSIXLY_CORRECT PPID RANDOM SECONDS SRANDOM UID").split()},
    "SHELLOPTS": ("bash turns on the shell options it lists (xtrace, ...) in every bash the job starts",
                  "set options in a script, not in the environment"),
    "BASHOPTS": ("bash turns on the shopt options it lists in every bash the job starts",
                 "set options in a script, not in the environment"),
    "BASH_ENV": ("bash runs the file it names at the start of every non-interactive bash, the job's own included",
                 "put the settings themselves in a layer, as KEY=value lines"),
    "ENV": ("sh and bash in POSIX mode run the file it names at start-up",
            "put the settings themselves in a layer, as KEY=value lines"),
    "PROMPT_COMMAND": ("bash runs it as a command before every prompt", "drop it: a launch needs no prompt"),
    "PS0": ("bash expands $(...) in it on every interactive command", "drop it: a launch needs no prompt"),
    "PS1": ("bash expands $(...) in it at every prompt", "drop it: a launch needs no prompt"),
    "PS2": ("bash expands $(...) in it at every continuation prompt", "drop it: a launch needs no prompt"),
    "PS4": ("bash expands $(...) in it on every line `set -x` traces", "drop it; `bash -x` traces with the default"),
    "LD_PRELOAD": ("the dynamic loader loads the libraries it names into every program the job starts (bash, srun, "
                   "the engine)", "set it for the engine only, in the EDF's [env] table or in the image"),
    "LD_AUDIT": ("the dynamic loader runs the audit libraries it names inside every program the job starts",
                 "set it for the engine only, in the EDF's [env] table or in the image"),
    "GCONV_PATH": ("glibc loads character-conversion modules (code) from the folders it names",
                   "install conversion modules in the image instead"),
    "PYTHONSTARTUP": ("Python runs the file it names at every interactive start", "drop it: a launch is not interactive"),
    **{k: (f"Python {how}, the launcher's own Python included (it runs in the job after the layers are exported)",
           _ENGINE_ONLY) for k, how in (
        ("PYTHONPATH", "imports modules (and runs a sitecustomize.py) from the folders it names"),
        ("PYTHONHOME", "loads its whole standard library from the folder it names"),
        ("PYTHONUSERBASE", "imports modules (and runs usercustomize.py) from the folder it names"),
        ("PYTHONSAFEPATH", "changes which folders it imports from"),
        ("PYTHONINSPECT", "stays interactive after the script, reading commands from stdin"),
        ("PYTHONEXECUTABLE", "reports another interpreter as itself"),
        ("PYTHONPLATLIBDIR", "loads its compiled standard library from another folder"),
        ("PYTHONPYCACHEPREFIX", "loads compiled modules (code) from the folder it names instead of beside their "
         "sources"))},
    "HOME": ("Python imports a usercustomize.py and runs the .pth files in its user site folder under it, the "
             "launcher's own Python included (it runs in the job after the layers are exported); every tool reads "
             "~ from it", "leave HOME to the job (sbatch passes yours on); give a tool its own folder through its "
                          "own variable (HF_HOME, XDG_CACHE_HOME, ...)"),
    "LD_LIBRARY_PATH": ("the dynamic loader loads libraries from the folders it names into every program the job starts "
                        "(bash, srun, the launcher's Python, the engine) before the system's", _ENGINE_ONLY),
}
_SLURM_INSTEAD = ("the launcher gives srun its options from the plan (the launch keys, docs/keys.md); an option of "
                  "your own for the job goes on sbatch's command line or in the shell you submit from")
# Prefixes a layer may not assign: Slurm's clients read variables of these names as their options, and every
# name a layer assigns is exported to every srun, sbatch and salloc the job runs (SLURM_TASK_PROLOG and
# SLURM_TASK_EPILOG make srun run a program on every node before and after each rank). Slurm sets the
# SLURM_* of the job itself (SLURM_JOB_ID, SLURM_PROCID, ...), which the launcher reads.
REFUSED_PREFIXES: dict[str, tuple[str, str]] = {
    "SLURM_": ("srun reads SLURM_* variables as its options (SLURM_TASK_PROLOG and SLURM_TASK_EPILOG run a program "
               "on every node around each rank) and Slurm sets the job's own SLURM_* (SLURM_JOB_ID, SLURM_PROCID): "
               "a layer would change the job behind the plan's back", _SLURM_INSTEAD),
    "SRUN_": ("srun reads SRUN_* variables as its options: a layer would change every step of the job behind the "
              "plan's back", _SLURM_INSTEAD),
    "SBATCH_": ("sbatch reads SBATCH_* variables as its options: a layer is sourced in the job, after your job was "
                "submitted, and would change only the sbatch the job runs itself (a chain's successor)",
                "export it in the shell you submit from (sbatch reads SBATCH_ACCOUNT, SBATCH_QOS, ... there), or "
                "give the option to sbatch"),
    "SALLOC_": ("salloc reads SALLOC_* variables as its options: a layer would change an allocation behind the "
                "plan's back", "export it in the shell you run salloc from"),
    "ENVLAYERS_": ("the job sets the launcher's own ENVLAYERS_* variables itself (each rank's number, the successor "
                   "chain, the key file a successor keeps, the readiness budget): a layer would steer the job "
                   "behind the plan's back", "leave them to the job; docs/keys.md lists the launch keys a layer sets"),
}
# Names of those prefixes a layer may assign: what the launcher knowingly passes on (docs/layers.md).
ALLOWED_SLURM = frozenset({
    "SLURM_PARTITION",  # the job's --partition (docs/keys.md); srun in the job reads it too: the same partition
})
# the launch keys (docs/keys.md) spelled ENVLAYERS_*: settings the operator gives, not the job's own variables
ALLOWED_ENVLAYERS = frozenset({"ENVLAYERS_HSN_IFACE", "ENVLAYERS_RANK_START_TIMEOUT"})


def refused(key: str) -> "tuple[str, str] | None":
    """(why, alternative) when a layer may not assign ``key``, else None."""
    why = REFUSED.get(key)
    if why is None and key not in ALLOWED_SLURM and key not in ALLOWED_ENVLAYERS:
        why = next((v for prefix, v in REFUSED_PREFIXES.items() if key.startswith(prefix)), None)
    return why


def refusal(key: str) -> "tuple[str, str] | None":
    """(message, hint) of the error for a layer that assigns ``key``, else None; the message follows the key
    (``'BASH_ENV' is refused in a layer: ...``): one wording for layer files and setups.yaml's ``env:``."""
    why = refused(key)
    if why is None:
        return None
    return (why[0] if why[0] == _SPECIAL else f"is refused in a layer: {why[0]}", why[1])


class Ref(NamedTuple):
    """A reference to a variable: ``op`` is None (``$X``), ``"-"`` or ``":-"``."""

    name: str
    op: "str | None" = None
    default: "tuple[Part, ...]" = ()


Part = str | Ref
Value = tuple[Part, ...]  # literal text and references, in order


def value_text(value: Value) -> str:
    """A value as text, deferred references written ${NAME}, ${NAME-default}, ${NAME:-default}."""
    out = []
    for p in value:
        if isinstance(p, str):
            out.append(p)
        else:
            out.append("${" + p.name + (p.op or "") + (value_text(p.default) if p.op else "") + "}")
    return "".join(out)


class Origin(NamedTuple):
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


class Assignment(NamedTuple):
    key: str
    value: Value
    origin: Origin
    text: str  # the statement as written, for explain and errors


def parse_file(path: str | os.PathLike, display: str | None = None) -> list[Assignment]:
    """Parse one layer file. ``display`` is the name used in messages (a relative path)."""
    from .yamlpos import NOT_REGULAR_HINT, NotRegularFile, read_regular  # the one bounded read of a named file

    name = display or os.fspath(path)
    try:
        raw = read_regular(path, config=True)
    except FileNotFoundError:
        raise LayerSyntaxError("layer file not found", where=name, hint="check the layer names in setups.yaml") from None
    except NotRegularFile as err:
        raise LayerSyntaxError(err.reason, where=name, hint=err.hint or ("a layer is a few kilobytes of text; is it "
                               "the right file?" if err.too_large else NOT_REGULAR_HINT)) from None
    except OSError as err:
        raise LayerSyntaxError(f"cannot read the layer file: {err.strerror or err}", where=name,
                               hint="make it a readable file (check its permissions)") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise LayerSyntaxError("not valid UTF-8", where=f"{name}:{line}", hint="save the file as UTF-8") from None
    return parse_text(text, name)


def parse_text(text: str, name: str = "<string>") -> list[Assignment]:
    return _Parser(text, name).parse()


def join_parts(parts: list) -> Value:
    """Merge adjacent literal parts, drop empty ones."""
    out: list = []
    for part in parts:
        if isinstance(part, str):
            if not part:
                continue
            if out and isinstance(out[-1], str):
                out[-1] += part
                continue
        out.append(part)
    return tuple(out)


class _Parser:
    def __init__(self, text: str, name: str):
        self.s = text
        self.name = name
        self.i = 0
        self.line = 1

    # -- helpers -------------------------------------------------------------------------
    def error(self, message: str, hint: str = ACCEPTED, line: int | None = None) -> LayerSyntaxError:
        return LayerSyntaxError(message, where=f"{self.name}:{line or self.line}", hint=hint)

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def advance(self, n: int = 1) -> str:
        chunk = self.s[self.i : self.i + n]
        self.line += chunk.count("\n")
        self.i += n
        return chunk

    def skip_blanks(self) -> None:
        while self.peek() and self.peek() in _BLANK:
            self.i += 1

    def rest_of_line(self) -> str:
        end = self.s.find("\n", self.i)
        return self.s[self.i : end if end >= 0 else len(self.s)]

    # -- grammar -------------------------------------------------------------------------
    def parse(self) -> list[Assignment]:
        if self.s.startswith("\ufeff"):
            raise self.error("the file starts with a byte-order mark (BOM)",
                             hint="bash reads it as part of the first word; save the file as UTF-8 without BOM", line=1)
        if "\0" in self.s:
            line = self.s[: self.s.index("\0")].count("\n") + 1
            raise self.error("NUL byte in file", hint="layer files are text", line=line)
        out: list[Assignment] = []
        while self.i < len(self.s):
            self.skip_blanks()
            c = self.peek()
            if c == "\n":
                self.advance()
                continue
            if c == "":
                break
            if c == "#":
                self.i += len(self.rest_of_line())
                continue
            out.append(self.statement())
        return out

    def statement(self) -> Assignment:
        start, line = self.i, self.line
        if "\r" in self.rest_of_line():
            raise self.error(
                "carriage return in line (CRLF line endings)",
                hint="bash keeps the \\r in the value; convert the file with dos2unix",
            )
        if self.s.startswith("export", self.i) and self.peek(6) in _BLANK and self.peek(6):
            self.i += 6
            self.skip_blanks()
            m = _NAME.match(self.s, self.i)
            if m and self.s[m.end():m.end() + 1] != "=" and not self.s.startswith("+=", m.end()):
                word = self.rest_of_line().strip()
                raise self.error(f"'export {word}' exports without assigning",
                                 hint="every key a layer names is exported; write KEY=value (KEY= for empty)")
        m = _NAME.match(self.s, self.i)
        after = self.s[m.end()] if m and m.end() < len(self.s) else ""
        if not m or after != "=":
            word = self.rest_of_line().strip()
            if m and after == "+" and self.s.startswith("+=", m.end()):
                raise self.error(f"append assignment '{word}' is not accepted", hint="a layer overrides a key: write KEY=full-value")
            if m and after in _BLANK and self.s[m.end() :].lstrip(_BLANK).startswith("="):
                raise self.error(f"space around '=' in '{word}'", hint="bash needs KEY=value with no spaces around '='")
            first = word.split()[0] if word.split() else word
            if first == "unset":
                raise self.error(f"'{word}' is not accepted: a layer can override a key, never unset it",
                                 hint="assign it empty (KEY=) to make it present and empty")
            raise self.error(f"not an assignment: '{word}'")
        key = m.group(0)
        why = refusal(key)
        if why:
            raise self.error(f"'{key}' {why[0]}", hint=why[1])
        self.i = m.end() + 1
        value = self.word()
        self.skip_blanks()
        c = self.peek()
        if c == "#":
            self.i += len(self.rest_of_line())
        elif c == "\\" and self.peek(1) in ("\n", ""):
            raise self.error("line continuation (backslash at end of line) is not accepted",
                             hint="put the value on one line, or in quotes")
        elif c not in ("", "\n"):
            raise self.error(
                f"unexpected text after the value of {key}: '{self.rest_of_line().strip()}'",
                hint="one assignment per line; quote values that contain spaces",
            )
        return Assignment(key, value, Origin(self.name, line), self.s[start : self.i].strip())

    def word(self) -> Value:
        parts: list = []
        at_start = True
        while True:
            c = self.peek()
            if c in ("", "\n", " ", "\t"):
                return join_parts(parts)
            if c == "'":
                parts.append(self.single_quoted())
            elif c == '"':
                parts.extend(self.double_quoted())
            elif c == "$":
                parts.append(self.dollar(quoted=False))
            elif c == "\\":
                nxt = self.peek(1)
                if nxt in ("\n", ""):
                    raise self.error("line continuation (backslash at end of line) is not accepted",
                                     hint="put the value on one line, or in quotes")
                self.advance(2)
                parts.append(nxt)
            elif c == "`":
                raise self.error("command substitution with backticks is not accepted")
            elif c in _UNQUOTED_STOP:
                raise self.error(f"unquoted '{c}' is not accepted in a value", hint="quote the value")
            elif c == "~" and (at_start or (parts and isinstance(parts[-1], str) and parts[-1].endswith(":"))):
                raise self.error("unquoted '~' would be tilde-expanded by bash",
                                 hint="write \"$HOME\" or quote the value")
            else:
                j = self.i
                while j < len(self.s) and self.s[j] not in _UNQUOTED_STOP and self.s[j] != "~":
                    j += 1
                if j == self.i:  # a '~' not in a tilde position
                    j += 1
                parts.append(self.advance(j - self.i))
            at_start = False

    def single_quoted(self) -> str:
        line = self.line
        end = self.s.find("'", self.i + 1)
        if end < 0:
            raise self.error("unterminated single quote", hint="close the quote", line=line)
        text = self.s[self.i + 1 : end]
        self.advance(end + 1 - self.i)
        return text

    def double_quoted(self) -> list:
        line = self.line
        self.advance()
        parts: list = []
        while True:
            c = self.peek()
            if c == "":
                raise self.error("unterminated double quote", hint="close the quote", line=line)
            if c == '"':
                self.advance()
                return parts or [""]
            if c == "\\":
                nxt = self.peek(1)
                if nxt == "\n":
                    raise self.error("line continuation (backslash-newline) inside double quotes is not accepted",
                                     hint="remove the backslash to keep the newline")
                if nxt in ('"', "\\", "$", "`"):
                    parts.append(nxt)
                    self.advance(2)
                else:
                    parts.append("\\")
                    self.advance()
            elif c == "$":
                parts.append(self.dollar(quoted=True))
            elif c == "`":
                raise self.error("command substitution with backticks is not accepted")
            else:
                j = self.i
                while j < len(self.s) and self.s[j] not in '"\\$`':
                    j += 1
                parts.append(self.advance(j - self.i))

    def _construct(self) -> str:
        """The ``$(...)`` or ``$((...))`` at the cursor, as written (up to its closing parens on this line)."""
        line = self.rest_of_line()
        depth = 0
        for j, c in enumerate(line):
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0 and not (line.startswith("$((") and j + 1 < len(line) and line[j + 1] == ")"):
                    return line[: j + 1]
        return line if len(line) <= 40 else line[:37] + "..."

    def dollar(self, quoted: bool) -> Part:
        nxt = self.peek(1)
        if nxt == "{":
            return self.braced()
        if nxt and _NAME_START.match(nxt):
            m = _NAME.match(self.s, self.i + 1)
            self.i = m.end()
            return Ref(m.group(0))
        if nxt == "(":
            kind = "arithmetic expansion" if self.peek(2) == "(" else "command substitution"
            raise self.error(f"{kind} '{self._construct()}' is not accepted")
        if nxt == "'" and not quoted:
            raise self.error("ANSI-C quoting $'...' is not accepted", hint="use '...' or \"...\"")
        if nxt == '"' and not quoted:
            raise self.error('locale quoting $"..." is not accepted', hint='use "..."')
        if nxt == "[":
            raise self.error("arithmetic expansion '$[' is not accepted")
        if nxt and (nxt.isdigit() or nxt in "@*#?-$!"):
            raise self.error(f"special parameter '${nxt}' is not accepted", hint="reference a named variable")
        # a lone '$' (end of value, before a space or a quote) is literal in bash
        self.advance()
        return "$"

    def braced(self) -> Ref:
        line = self.line
        self.advance(2)  # '${'
        m = _NAME.match(self.s, self.i)
        if not m:
            raise self.error(f"unsupported parameter expansion '${{{self.rest_of_line()[:20]}'",
                             hint="use ${NAME}, ${NAME-default} or ${NAME:-default}")
        name = m.group(0)
        self.i = m.end()
        if self.peek() == "}":
            self.advance()
            return Ref(name)
        if self.peek() == "-":
            op = "-"
            self.advance()
        elif self.peek() == ":" and self.peek(1) == "-":
            op = ":-"
            self.advance(2)
        else:
            bad = self.s[self.i : self.i + 2]
            raise self.error(f"unsupported parameter expansion '${{{name}{bad}...}}'",
                             hint="use ${NAME}, ${NAME-default} or ${NAME:-default}")
        parts: list = []
        while True:
            c = self.peek()
            if c == "":
                raise self.error(f"unterminated '${{{name}'", hint="close it with '}'", line=line)
            if c == "}":
                self.advance()
                return Ref(name, op, join_parts(parts))
            if c == "$":
                ref = self.dollar(quoted=True)
                parts.append(ref)
            elif c in "'\"\\`~\n":
                shown = {"\n": "a newline"}.get(c, f"'{c}'")
                raise self.error(f"{shown} inside the default of ${{{name}{op}...}} is not accepted",
                                 hint="keep defaults to plain text and $NAME references")
            else:
                j = self.i
                while j < len(self.s) and self.s[j] not in "}$'\"\\`~\n":
                    j += 1
                parts.append(self.advance(j - self.i))
