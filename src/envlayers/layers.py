"""Layer stacks: which sources make a stack, and merging them with bash's meaning.

Sourcing the layers in order under ``set -a`` is the specification. The merge replays
that: each assignment's references are resolved against the assignments before it;
a reference to a name no earlier assignment defines is *deferred*: it stays a reference,
for the shell that sources the render (the job) to expand.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from . import catalog as cat
from .envfile import Assignment, Origin, Ref, Value, join_parts, parse_file
from .errors import StackError


class Deferred(NamedTuple):
    """A reference left for the job's shell: ``${name}``, ``${name-default}``, ``${name:-default}``."""

    name: str
    op: "str | None"
    default: tuple
    origin: Origin  # the assignment that read it from the environment


class Source(NamedTuple):
    """One layer of a stack: a file, or the inline ``env:`` of a setups.yaml entry."""

    label: str
    assignments: tuple[Assignment, ...]


class Binding(NamedTuple):
    """A key's final value and the history that led to it (oldest first)."""

    key: str
    value: tuple  # literal str parts and Deferred parts only
    origin: Origin
    overridden: tuple = ()  # ((value, origin), ...)
    first_index: int = 0


class Env:
    """The merged environment of a stack, in order of each key's first assignment."""

    __slots__ = ("target", "sources", "bindings")

    def __init__(self, target: str, sources: tuple[str, ...], bindings: dict[str, Binding]):
        self.target = target
        self.sources = sources
        self.bindings = bindings

    def __contains__(self, key: str) -> bool:
        return key in self.bindings

    def text(self) -> dict[str, str]:
        """key -> value as text; deferred references written ``${NAME}`` (for planning and dry runs)."""
        from .shell import value_text

        return {k: value_text(b.value) for k, b in self.bindings.items()}


def stack_sources(root: Path, target: str, extra_files: tuple[Path, ...] = ()) -> list[Source]:
    """The stack for EXPERIMENT:MODEL, lowest precedence first.

    common.env < the experiment's layer files < its inline env < model-<m>.env (or the model's
    ``model_layer``) < the model's layer files < its inline env < ``extra_files`` (the launcher's).
    """
    experiment, model = cat.parse_target(target)
    catalog = cat.load(root)
    exp, mod = catalog.experiment(experiment), catalog.model(model)
    model_layer = mod.model_layer or (f"model-{model}.env", mod.origin)
    files: list[tuple[str, Origin | None]] = [("common.env", None)]
    files += list(exp.layers)
    out: list[Source] = [_file_source(root, name, ref) for name, ref in files]
    out.append(Source(f"{cat.SETUPS} experiments.{experiment}.env", exp.env))
    out.append(_file_source(root, *model_layer))
    out += [_file_source(root, name, ref) for name, ref in mod.layers]
    out.append(Source(f"{cat.SETUPS} models.{model}.env", mod.env))
    for path in extra_files:
        out.append(Source(_display(root, path), tuple(parse_file(path, _display(root, path)))))
    return [s for s in out if s.assignments or not s.label.startswith(str(cat.SETUPS))]


def _display(root: Path, path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def _file_source(root: Path, name: str, ref: Origin | None) -> Source:
    rel = cat.LAYERS_DIR / name
    path = root / rel
    if "/" in name or name in ("", ".", ".."):
        raise StackError(f"layer '{name}' must be a file name in {cat.LAYERS_DIR}", where=str(ref or rel),
                         hint="write just the file name, e.g. replicas.env")
    if not path.is_file():
        raise StackError(f"layer file {rel} not found", where=str(ref or rel),
                         hint=f"create it, or fix the name (files in {cat.LAYERS_DIR})")
    return Source(str(rel), tuple(parse_file(path, str(rel))))


def merge(sources: list[Source], target: str = "", strict: bool = False) -> Env:
    """Replay the assignments in order, last assignment wins, with provenance."""
    state: dict[str, Value] = {}
    history: dict[str, list[tuple[Value, Origin]]] = {}
    first: dict[str, int] = {}
    index = 0
    for source in sources:
        for a in source.assignments:
            value = _resolve(a.value, state, a)
            state[a.key] = value
            history.setdefault(a.key, []).append((value, a.origin))
            first.setdefault(a.key, index)
            index += 1
    bindings: dict[str, Binding] = {}
    for key in sorted(state, key=first.__getitem__):
        past = history[key]
        bindings[key] = Binding(key, state[key], past[-1][1], tuple(past[:-1]), first[key])
    env = Env(target, tuple(s.label for s in sources), bindings)
    _check_render_order(env, history)
    if strict:
        for b in bindings.values():
            for d in deferred_in(b.value):
                raise StackError(f"{b.key} reads ${d.name}, which no layer assigns", where=str(d.origin),
                                 hint=f"assign {d.name} in a layer, or drop --strict to leave it for the job's shell")
    return env


def load_env(root: Path, target: str, extra_files: tuple[Path, ...] = (), strict: bool = False) -> Env:
    return merge(stack_sources(root, target, extra_files), target, strict)


# -- resolution ------------------------------------------------------------------------------

def _resolve(value: Value, state: dict[str, Value], a: Assignment) -> Value:
    out: list = []
    for part in value:
        if isinstance(part, str):
            out.append(part)
        else:
            out.extend(_resolve_ref(part, state, a))
    return join_parts(out)


def _resolve_ref(ref: Ref, state: dict[str, Value], a: Assignment) -> Value:
    if ref.name not in state:
        default = _resolve(ref.default, state, a) if ref.op else ()
        return (Deferred(ref.name, ref.op, default, a.origin),)
    value = state[ref.name]
    if ref.op != ":-":
        return value
    empty = _emptiness(value)
    if empty is True:
        return _resolve(ref.default, state, a)
    if empty is False:
        return value
    # the value is made of deferred references: only the job's shell knows whether it is empty
    if len(value) == 1 and (value[0].op is None or _emptiness(value[0].default) is True):
        inner = value[0]
        return (Deferred(inner.name, ":-", _resolve(ref.default, state, a), inner.origin),)
    raise StackError(
        f"${{{ref.name}:-...}} cannot be rendered: {ref.name} is '{_show(value)}', and whether that is empty "
        "depends on the job's environment",
        where=str(a.origin),
        hint=f"use ${{{ref.name}-...}} or assign {ref.name} a plain value",
    )


def _emptiness(value: Value) -> bool | None:
    """True: surely empty; False: surely not; None: depends on the job's environment."""
    if not value:
        return True
    # parts are joined, so a str part is never empty
    return False if any(isinstance(p, str) for p in value) else None


def deferred_in(value: Value):
    """Every deferred reference in a value, defaults included."""
    for p in value:
        if isinstance(p, Deferred):
            yield p
            yield from deferred_in(p.default)


def _show(value: Value) -> str:
    from .shell import value_text

    return value_text(value)


def _check_render_order(env: Env, history: dict[str, list[tuple[Value, Origin]]]) -> None:
    """The render writes each key once, in order of first assignment, so a line that reads
    NAME from the environment must come before the line that assigns NAME."""
    for b in env.bindings.values():
        for d in deferred_in(b.value):
            other = env.bindings.get(d.name)
            if other is None or d.name == b.key or other.first_index > b.first_index:
                continue
            assigned_at = history[d.name][0][1]
            raise StackError(
                f"{b.key} reads ${d.name} from the environment at {d.origin}, but {d.name} is assigned at "
                f"{assigned_at}, before {b.key} is first set; a merged render cannot reproduce that order",
                where=str(d.origin),
                hint=f"assign {d.name} before reading it, or give the value read from the environment another name",
            )
