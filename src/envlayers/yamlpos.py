"""YAML with positions: the one reader of the project's YAML files, and their one error format.

``experiments/setups.yaml``, ``containers/edfs/*.yaml`` and the diagnose rules are read here, so every
error they raise reads the same way and names the line::

    experiments/setups.yaml:12: models.glm53.env.PORT: is a YAML bool ('yes'), not a string; hint: quote it

:func:`read` returns a :class:`Doc`: the composed node tree (PyYAML nodes, each with its line), the
line of every key path, and :meth:`Doc.fail`, which raises the caller's error class in that format.
The reader is also the guard against hostile input, whatever the file:

- anchors and aliases are refused (a few hundred bytes of nested aliases expand to gigabytes);
- nesting deeper than :data:`MAX_DEPTH` is refused before it can exhaust the stack or the time: flow
  collections (``[[[...]]]``) in one pass over the text before any parser runs, the rest as it is composed;
- a file that is not UTF-8, cannot be read, is not a regular file (a FIFO would block), is larger than
  :data:`MAX_BYTES` or is not valid YAML is one error, naming the line where there is one;
- every error message is bounded (:data:`MAX_MESSAGE`), and :func:`clip` bounds a value quoted in one.

It composes with libyaml's event parser (PyYAML's ``CParser``) when PyYAML was built with it and
PyYAML's pure-Python parser otherwise; the composer is PyYAML's own, with the two checks above added.
A hand reader rather than a schema library: the checks above and the file:line of every error need the
composed nodes, which PyYAML gives as they are.
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

from .errors import EnvLayersError

MAX_DEPTH = 64  # the project's files nest 6 deep at most
MAX_MESSAGE = 600  # characters of one error message (and of its hint)
MAX_VALUE = 80  # characters of a value quoted in a message
MAX_BYTES = 4 << 20  # a file larger than this is not one of ours (a YAML file or a layer: read_regular)
NOT_REGULAR_HINT = "point it at a regular file: a FIFO or a device (/dev/zero) would block the read or never end"

Path_ = tuple  # a key path: ("models", "glm53", "env", "PORT") or ("rules", 3, "trend")


def clip(value: Any, limit: int = MAX_VALUE) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error quotes what it found, boundedly."""
    text = repr(value[: limit + 1] if isinstance(value, str) else value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def _bounded(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_MESSAGE:
        return text
    return text[:MAX_MESSAGE] + f"... ({len(text) - MAX_MESSAGE} more characters)"


def dotted(path: Path_) -> str:
    """("models", "m", "layers", 0) -> "models.m.layers[0]"."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _compose_class(libyaml: bool = True):
    """A loader whose composer refuses anchors, aliases and deep nesting: libyaml's event parser
    when PyYAML has it (and ``libyaml``), else PyYAML's pure-Python reader, scanner and parser."""
    import yaml
    from yaml.composer import Composer
    from yaml.constructor import SafeConstructor
    from yaml.resolver import Resolver

    try:
        if not libyaml:
            raise ImportError("the pure-Python parser was asked for")
        from yaml.cyaml import CParser as _Parser

        parts: tuple = (_Parser,)

        def init_parser(self, text):
            _Parser.__init__(self, text)
    except ImportError:  # PyYAML without libyaml
        from yaml.parser import Parser
        from yaml.reader import Reader
        from yaml.scanner import Scanner

        parts = (Reader, Scanner, Parser)

        def init_parser(self, text):
            Reader.__init__(self, text)
            Scanner.__init__(self)
            Parser.__init__(self)

    class _Refused(Exception):
        def __init__(self, line: int, message: str, hint: str):
            super().__init__(message)
            self.line, self.message, self.hint = line, message, hint

    class Loader(Composer, *parts, SafeConstructor, Resolver):
        def __init__(self, text: str):
            init_parser(self, text)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self.depth = 0

        def compose_node(self, parent, index):
            event = self.peek_event()
            line = event.start_mark.line + 1
            if isinstance(event, yaml.AliasEvent):
                raise _Refused(line, f"alias *{clip(event.anchor, 40)[1:-1]} is not allowed",
                               "write the value out; anchors and aliases are refused in these files")
            if getattr(event, "anchor", None) is not None:
                raise _Refused(line, f"anchor &{clip(event.anchor, 40)[1:-1]} is not allowed",
                               "write the value out; anchors and aliases are refused in these files")
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise _Refused(line, f"nested more than {MAX_DEPTH} levels deep", "flatten the document")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return Loader, _Refused


_LOADER = None


def _loader():
    global _LOADER
    if _LOADER is None:
        _LOADER = _compose_class()
    return _LOADER


class Doc:
    """One YAML document read from ``file`` (the name errors show, e.g. ``experiments/setups.yaml``)."""

    def __init__(self, file: str, root: Any, error: type[EnvLayersError]):
        self.file = file
        self.root = root  # a yaml Node, or None for an empty document
        self.error = error
        self.lines: dict[Path_, int] = {}
        if root is not None:
            self._index(root, ())

    # -- errors -------------------------------------------------------------------------------

    def line_of(self, path: Path_) -> int | None:
        """The line of ``path``, else of its nearest parent that has one."""
        for n in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:n]))
            if line is not None:
                return line
        return None

    def fail(self, path: Path_, message: str, hint: str | None = None, *, node: Any = None,
             line: int | None = None) -> NoReturn:
        """Raise ``file:line: key.path: message; hint: ...`` (the line of ``node`` when given, else of
        ``path`` or its nearest parent)."""
        if line is None:
            line = node.start_mark.line + 1 if node is not None else self.line_of(path)
        label = dotted(path)
        raise self.error(_bounded(f"{label}: {message}" if label else message),
                         where=f"{self.file}:{line or 1}", hint=_bounded(hint))

    # -- reading ------------------------------------------------------------------------------

    def data(self) -> Any:
        """The document as Python values (safe types only)."""
        if self.root is None:
            return None
        loader, _ = _loader()
        return loader("").construct_document(self.root)

    def mapping(self, node: Any, path: Path_, what: str = "a mapping") -> dict[str, tuple[Any, Any]]:
        """``{key: (key node, value node)}`` of a mapping node (keys are unique strings: see _index)."""
        import yaml

        if not isinstance(node, yaml.MappingNode):
            self.fail(path, f"must be {what}, got {kind_of_node(node)}", "write 'key: value' lines", node=node)
        return {k.value: (k, v) for k, v in node.value}

    def _index(self, node: Any, path: Path_) -> None:
        """Record the line of every key path; refuse duplicate and non-string keys (PyYAML keeps the
        last of two equal keys, silently)."""
        import yaml

        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for knode, vnode in node.value:
                if not isinstance(knode, yaml.ScalarNode):
                    self.fail(path, "a key must be a plain name, not a list or mapping", "quote the key", node=knode)
                key = knode.value
                if key in seen:
                    self.fail(path + (key,), "duplicate key", "YAML would keep only the last one",
                              node=knode)
                seen.add(key)
                self.lines[path + (key,)] = knode.start_mark.line + 1
                self._index(vnode, path + (key,))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._index(item, path + (i,))


def kind_of_node(node: Any) -> str:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    tag = node.tag.rsplit(":", 1)[-1]
    return "nothing (null)" if tag == "null" else f"a YAML {tag} ({clip(node.value)})"


# The depth bound's patterns (each led by a literal character, so the regular-expression engine skips to it):
# quoted scalars on one line and comments, which are text, where they can begin; quoted scalars over several
# lines (their newlines are kept, for the line number); a quote that never closes; '[' or '{' inside a plain
# word ('a[b' is a plain scalar); everything but brackets and newlines.
_PATTERNS = None
_STEPS = bytes.maketrans(b"[{]}\n", b"\x02\x02\x00\x00\x01")  # an opener 1 up, a closer 1 down; plus 1


def _patterns():
    global _PATTERNS
    if _PATTERNS is None:
        import re

        one_line = r"""'(?<=[\s\[{,:]')(?:[^'\n]|'')*'|"(?<=[\s\[{,:]")(?:[^"\\\n]|\\.)*"|#(?<=\s#)[^\n]*"""
        lines = r"""'(?<=[\s\[{,:]')(?:[^']|'')*'|"(?<=[\s\[{,:]")(?:[^"\\]|\\.)*""" '"'
        _PATTERNS = (re.compile(one_line), re.compile(lines), re.compile(r"""['"](?<=[\s\[{,:]['"])"""),
                     re.compile(r"(?<=[^\s,\[\]{}:])[\[{]+"), re.compile(r"[^\[\]{}\n]+"))
    return _PATTERNS


def _first_too_deep(brackets: str, limit: int) -> int | None:
    """The index in ``brackets`` (brackets and newlines) where the nesting first passes ``limit``, else None;
    counted in C (accumulate, map, compress): a closer too many only lowers the count."""
    from itertools import accumulate, compress, count
    from operator import sub

    depths = map(sub, accumulate(brackets.encode("ascii").translate(_STEPS)), count(1))
    return next(compress(count(), map(limit.__lt__, depths)), None)


def flow_depth_line(text: str, limit: int = MAX_DEPTH) -> int | None:
    """The line where ``text``'s flow collections (``[...]``, ``{...}``) first nest more than ``limit`` deep,
    else None: a few linear passes of the regular-expression engine over the text, before any parser runs,
    so no parser (libyaml's, or PyYAML's pure-Python one, whose scanner looks ahead over every open
    collection) ever sees a deep document, and a 4 MiB file is judged in about a second.

    Quoted text and comments do not count, nor a ``[`` or ``{`` inside a plain word (``a[b``), and a closer
    lowers the count; what it may count that YAML does not is a bracket after a blank inside a plain scalar
    (``see [1]``), and no file of ours holds 64 of those. A deep block structure (indentation) is bounded
    by the composer's check as it is built."""
    if text.count("[") + text.count("{") <= limit:
        return None  # every file of ours
    one_line, lines, unclosed, in_word, other = _patterns()
    text = one_line.sub("", "\n" + text)  # the newline: a quote or '#' at the very start begins a value
    text = lines.sub(lambda m: "\n" * m.group().count("\n"), text)
    cut = unclosed.search(text)
    if cut:  # an unclosed quote: the rest is text, and the parser says what is wrong
        text = text[:cut.start()]
    brackets = other.sub("", in_word.sub("", text))  # the counted brackets, and the newlines between them
    at = _first_too_deep(brackets, limit)
    if at is None:
        return None
    return brackets.count("\n", 0, at)  # the newline put first makes this the line's number


def parse(text: str, file: str, error: type[EnvLayersError], *, loader=None) -> Doc:
    """Compose ``text`` (read from ``file``) into a :class:`Doc` (``loader``: a ``_compose_class()``
    result, for tests of the pure-Python path). A document whose flow collections nest deeper than
    :data:`MAX_DEPTH` is refused before it is parsed (:func:`flow_depth_line`)."""
    deep = flow_depth_line(text)
    if deep is not None:
        raise error(f"nested more than {MAX_DEPTH} levels deep", where=f"{file}:{deep}", hint="flatten the document")
    import yaml

    loader_cls, refused = loader or _loader()
    try:
        loader = loader_cls(text)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except refused as err:
        raise error(err.message, where=f"{file}:{err.line}", hint=err.hint) from None
    except yaml.YAMLError as err:
        raise _syntax_error(text, file, error, err) from None
    except RecursionError:  # MAX_DEPTH stops this first; kept for a smaller stack
        raise error("nested too deep", where=file, hint="flatten the document") from None
    return Doc(file, root, error)


def _syntax_error(text: str, file: str, error: type[EnvLayersError], err: Exception) -> EnvLayersError:
    """The error for invalid YAML, worded by PyYAML's pure-Python parser: its messages and lines do not
    depend on whether libyaml is installed. Only events are parsed (no composing: nothing nests)."""
    import yaml

    try:
        for _ in yaml.parse(text, Loader=yaml.SafeLoader):
            pass
    except yaml.YAMLError as pure:
        err = pure
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    return error(_bounded(f"invalid YAML: {problem}"), where=f"{file}:{mark.line + 1 if mark else 1}",
                 hint="fix the YAML syntax")


def read(path: str | os.PathLike, file: str, error: type[EnvLayersError],
         missing_hint: str = "pass --root DIR, or create it") -> Doc:
    """Read and compose the YAML file ``path``; ``file`` is how errors name it."""
    return parse(read_text(path, file, error, missing_hint), file, error)


def read_text(path: str | os.PathLike, file: str, error: type[EnvLayersError],
              missing_hint: str = "pass --root DIR, or create it") -> str:
    """The text of the YAML file ``path``, with :func:`read`'s checks (a regular, bounded, UTF-8 file),
    not yet parsed: a caller with a parse cache keyed by the text (the catalog's) starts here."""
    try:
        data = read_regular(path, config=True)
    except FileNotFoundError:
        raise error("file not found", where=file, hint=missing_hint) from None
    except IsADirectoryError:
        raise error("is a directory, not a YAML file", where=file, hint="point it at a regular file") from None
    except NotRegularFile as err:
        raise error(err.reason, where=file, hint=err.hint or ("these files are a few kilobytes; is it the right "
                    "file?" if err.too_large else NOT_REGULAR_HINT)) from None
    except OSError as err:
        raise error(f"cannot read: {err.strerror or err}", where=file, hint="check the file's permissions") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - data.rfind(b"\n", 0, err.start)
        raise error(f"not UTF-8 (byte 0x{data[err.start]:02x} at column {column})",
                    where=f"{file}:{line}", hint="save the file as UTF-8") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return text


class NotRegularFile(OSError):
    """What :func:`read_regular` refuses: ``reason`` is ``"is a FIFO, not a regular file"`` or ``"is N bytes,
    more than the 4194304 this reader takes"``; ``too_large`` tells the two apart."""

    def __init__(self, reason: str, too_large: bool = False, hint: str | None = None):
        super().__init__(reason)
        self.reason, self.too_large, self.hint = reason, too_large, hint


def _kind(mode: int) -> str:
    import stat

    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"  # (no other kind of file exists on Linux)


def read_regular(path: str | os.PathLike, limit: int = MAX_BYTES, *, config: bool = False) -> bytes:
    """The bytes of the regular file ``path``: the one read of a file an operator names (a YAML file here, a
    layer in :mod:`envlayers.envfile`). It never blocks and never grows without bound: the file is opened
    without waiting (a FIFO has no writer to wait for), anything but a regular file (a FIFO, ``/dev/zero``,
    ``/dev/urandom``, a socket) is :class:`NotRegularFile`, and so is a file larger than ``limit`` bytes,
    whether its size says so or the read finds more. A directory is ``IsADirectoryError``; the rest of
    what ``open`` raises (``FileNotFoundError``, ``PermissionError``, ...) comes through as it is.
    ``config``: the file says what a job runs (a layer, a YAML file of the catalog), so one another user could
    change is :class:`NotRegularFile` too, with its ``hint`` (:func:`envlayers.filetrust.untrusted_config`)."""
    import errno
    import stat

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a device would block or never end
            raise NotRegularFile(f"is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise NotRegularFile(f"is {st.st_size} bytes, more than the {limit} this reader takes", True)
        if config:
            from .filetrust import untrusted_config

            found = untrusted_config(path, st, os.getuid())
            if found is not None:
                raise NotRegularFile(found[0], hint=found[1])
        chunks, size = [], 0
        while size <= limit:  # a file that grows while it is read still stops at the limit
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise NotRegularFile(f"is more than the {limit} bytes this reader takes", True)
    return b"".join(chunks)
