"""Layer stacks: which sources make a stack, and merging them with bash's meaning.

Sourcing the layers in order under ``set -a`` is the specification. The merge replays
that: each assignment's references are resolved against the assignments before it;
a reference to a name no earlier assignment defines is *deferred*: it stays a reference,
for the shell that sources the render (the job) to expand.
"""

from __future__ import annotations

import errno
import os
import re
from typing import Iterator, Mapping, NamedTuple

from . import catalog as cat
from .envfile import Assignment, Origin, Ref, Value, join_parts, parse_file, value_text
from .errors import EnvLayersError, StackError

SERVE_ENV = os.path.join("experiments", "serve-only.env")  # the launcher's own layer
SECRET_KEYS = ("SERVER_API_KEY",)  # never in a layer, so never in a render, a job script or a log
# a name that says it holds a credential (HF_TOKEN, OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD); a name
# that only points at one (HF_TOKEN_PATH, SERVER_API_KEY_FILE) is not, nor is a count (MAX_TOKENS)
_CREDENTIAL = re.compile(r"(?:^|_)(?:TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY)(?:_|$)")
_CREDENTIAL_POINTER = ("_PATH", "_FILE", "_DIR")
NOT_CREDENTIALS = frozenset({"HF_HUB_DISABLE_IMPLICIT_TOKEN"})  # a switch whose name says TOKEN
_NAME_OK = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")  # the catalog's rule for experiment and model names


class Deferred(NamedTuple):
    """A reference left for the job's shell: ``${name}``, ``${name-default}``, ``${name:-default}``."""

    name: str
    op: "str | None"
    default: "Resolved"
    origin: Origin  # the assignment that read it from the environment


Resolved = tuple[str | Deferred, ...]  # a merged value: literal text and deferred references


class Source(NamedTuple):
    """One layer of a stack: a file, or the inline ``env:`` of a setups.yaml entry."""

    label: str
    assignments: tuple[Assignment, ...]
    is_site: bool = False  # the site's layer (envlayers.sites)


class Binding(NamedTuple):
    """A key's final value and the history that led to it (oldest first)."""

    key: str
    value: Resolved
    origin: Origin
    overridden: "tuple[tuple[Resolved, Origin], ...]" = ()
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
        return {k: value_text(b.value) for k, b in self.bindings.items()}


class LaunchSources(NamedTuple):
    """The launcher's part of a stack (``env_layers serve``; ``explain --serve`` shows the same).

    ``base_env`` (SERVE_BASE_ENV) replaces the catalog layers; experiments/serve-only.env and then
    ``env_file`` (SERVE_ENV_FILE) go on top of everything.
    """

    base_env: "str | os.PathLike | None" = None
    env_file: "str | os.PathLike | None" = None


def stack_sources(root: str | os.PathLike, target: str, extra_files: tuple[str | os.PathLike, ...] = (),
                  launch: LaunchSources | None = None, site: "str | None" = None) -> list[Source]:
    """The stack for EXPERIMENT:MODEL, lowest precedence first. The one place the order is written:

    1. common.env < the site (``site``: a name in experiments/sites/ or a file's path; none given:
       setups.yaml's ``site:``, if any) < the experiment's layer files < its inline env <
       model-<m>.env (or the model's ``model_layer``) < the model's layer files < its inline env;
       with ``launch.base_env``, that one file instead (a whole render: no site on top of it)
    2. ``extra_files`` (``--layer``), in order
    3. with ``launch``: experiments/serve-only.env < ``launch.env_file``
    """
    experiment, model = cat.parse_target(target)
    if launch is not None and launch.base_env is not None:
        for name in (experiment, model):
            if not _NAME_OK.match(name):
                raise StackError(f"'{name}' is not an experiment or model name", where="target",
                                 hint="letters, digits, '.', '_' and '-'; `env_layers list` shows the names")
        if site:
            raise StackError(f"SITE={site} cannot apply to SERVE_BASE_ENV, which replaces every catalog layer",
                             where="SITE", hint="render the base env with that site (SITE=... env_layers render "
                                                "-o FILE), or unset SITE")
        out = [_path_source(root, launch.base_env, "SERVE_BASE_ENV")]
    else:
        out = _catalog_sources(root, experiment, model, site)
    out += [_path_source(root, path, "--layer") for path in extra_files]
    if launch is not None:
        out.append(_path_source(root, os.path.join(root, SERVE_ENV), SERVE_ENV))
        if launch.env_file is not None:
            out.append(_path_source(root, launch.env_file, "SERVE_ENV_FILE"))
    return out


def _catalog_sources(root: str | os.PathLike, experiment: str, model: str, site: "str | None") -> list[Source]:
    catalog = cat.load(root)
    exp, mod = catalog.experiment(experiment), catalog.model(model)
    model_layer = mod.model_layer or (f"model-{model}.env", mod.origin)
    out: list[Source] = [_file_source(root, "common.env", None)]
    site_layer = _site_source(root, site, catalog.site)
    if site_layer is not None:
        out.append(site_layer)
    out += [_file_source(root, name, ref) for name, ref in exp.layers]
    out.append(Source(f"{cat.SETUPS} experiments.{experiment}.env", exp.env))
    out.append(_file_source(root, *model_layer))
    out += [_file_source(root, name, ref) for name, ref in mod.layers]
    out.append(Source(f"{cat.SETUPS} models.{model}.env", mod.env))
    return [s for s in out if s.assignments or not s.label.startswith(str(cat.SETUPS))]


def _site_source(root: str | os.PathLike, site: "str | None", default: "tuple[str, Origin] | None") -> "Source | None":
    """The site's layer: ``site`` (SITE: a name, or a file's path) or else the catalog's default."""
    if site and cat.is_site_path(site):
        return _path_source(root, site, "SITE")._replace(is_site=True)
    name, where = (site, "SITE") if site else (default[0], str(default[1])) if default else (None, "")
    if name is None:
        return None
    if not _NAME_OK.match(name):
        raise StackError(f"'{name}' is not a site name", where=where,
                         hint="a name of experiments/sites/<SITE>.env, or a file's path; `env_layers list` "
                              "shows the sites")
    rel = cat.site_file(name)
    if not os.path.isfile(os.path.join(root, rel)):
        raise cat.unknown_site(root, name, where)
    return Source(rel, tuple(parse_file(os.path.join(root, rel), rel)), is_site=True)


def site_source(sources: list[Source]) -> "Source | None":
    """The site's layer of a stack, if it has one."""
    return next((s for s in sources if s.is_site), None)


def _path_source(root: str | os.PathLike, path: str | os.PathLike, what: str) -> Source:
    label = _checked_label(_display(root, path), what)
    try:
        os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise StackError(f"{what} is a symbolic link to {os.readlink(path)}, which does not exist", where=label,
                             hint="point it at the file itself") from None
        raise StackError(f"{what} names a file that does not exist", where=label,
                         hint="check the path: a relative one is read from the folder you run the command in") from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise StackError(f"{what} is a loop of symbolic links", where=label,
                             hint="point it at the file itself (`ls -l` on each link shows where it goes)") from None
        # anything else (a folder it cannot enter): the read below says it with the layer's words
    return Source(label, tuple(parse_file(path, label)))


def _checked_label(label: str, where: str) -> str:
    """A source's label goes into `#` lines of renders and job scripts: no control characters."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in label):
        raise StackError(f"the file name {label!r} holds a control character (a newline, ...)", where=where,
                         hint="rename the file: its name is written into renders, the job script and messages")
    return label


def _display(root: str | os.PathLike, path: str | os.PathLike) -> str:
    """``path`` relative to ``root`` when it is under it (links resolved), else as given."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    if real == top or real.startswith(top.rstrip(os.sep) + os.sep):
        return os.path.relpath(real, top)
    return os.fspath(path)


def _file_source(root: str | os.PathLike, name: str, ref: Origin | None) -> Source:
    rel = os.path.join(cat.LAYERS_DIR, name)
    path = os.path.join(root, rel)
    _checked_label(name, str(ref or rel))
    if "/" in name or name in ("", ".", ".."):
        raise StackError(f"layer '{name}' must be a file name in {cat.LAYERS_DIR}", where=str(ref or rel),
                         hint="write just the file name, e.g. replicas.env")
    if not os.path.isfile(path):
        raise StackError(f"layer file {rel} not found", where=str(ref or rel),
                         hint=f"create it, or fix the name (files in {cat.LAYERS_DIR})")
    return Source(rel, tuple(parse_file(path, rel)))


def merge(sources: list[Source], target: str = "", strict: bool = False) -> Env:
    """Replay the assignments in order, last assignment wins, with provenance.

    ``state`` gains a key only at its first assignment, so its order is the order of first assignment
    (the render's order) without a sort; only a key assigned again keeps a list of what it replaced,
    so a large stack of distinct keys costs the same per assignment as a small one."""
    state: dict[str, Resolved] = {}
    origin: dict[str, Origin] = {}
    first: dict[str, int] = {}
    replaced: dict[str, list[tuple[Resolved, Origin]]] = {}
    index = 0
    for source in sources:
        for a in source.assignments:
            key = a.key
            value = _resolve(a.value, state, a)
            if key in state:
                replaced.setdefault(key, []).append((state[key], origin[key]))
            else:
                first[key] = index
            state[key] = value
            origin[key] = a.origin
            index += 1
    bindings = {key: Binding(key, value, origin[key], tuple(replaced.get(key, ())), first[key])
                for key, value in state.items()}
    env = Env(target, tuple(s.label for s in sources), bindings)
    _check_render_order(env)
    if strict:
        for b in bindings.values():
            for d in deferred_in(b.value):
                raise StackError(f"{b.key} reads ${d.name}, which no layer assigns", where=str(d.origin),
                                 hint=f"assign {d.name} in a layer, or drop --strict to leave it for the job's shell")
    return env


def load_env(root: str | os.PathLike, target: str, extra_files: tuple[str | os.PathLike, ...] = (), strict: bool = False,
             launch: LaunchSources | None = None, site: "str | None" = None) -> Env:
    return merge(stack_sources(root, target, extra_files, launch, site), target, strict)


def role_stacks(root: str | os.PathLike, site: "str | None" = None) -> "dict[str, Env]":
    """CONTAINER_ROLE -> the merged stack of the first EXPERIMENT:MODEL of the catalog that runs it on
    ``site`` (None: the catalog's default); a target whose stack cannot be read adds nothing (``check`` names
    it). What install-edfs installs and ``images list`` lists: the roles a site's jobs run."""
    catalog = cat.load(root)
    out: dict[str, Env] = {}
    for exp in catalog.experiments:
        for model in catalog.models:
            try:
                env = load_env(root, f"{exp}:{model}", site=site)
            except EnvLayersError:  # one target's refusal: the others still count
                continue
            role = env.text().get("CONTAINER_ROLE")
            if role and role not in out:
                out[role] = env
    return dict(sorted(out.items()))


def looks_like_credential(key: str) -> bool:
    """Whether a key's name says it holds a secret (``HF_TOKEN``, ``*_API_KEY``, ``*_SECRET*``, ...)."""
    return (key not in NOT_CREDENTIALS and not key.endswith(_CREDENTIAL_POINTER)
            and _CREDENTIAL.search(key) is not None)


def refuse_secrets(env: Env) -> None:
    """Every path that writes a render (render, render -o, check --update, serve) calls this first: a
    secret written in a layer would be in the render, the job script, serve.env and the logs. A reference
    (``HF_TOKEN=${HF_TOKEN}``) is fine: only the reference is written, the job's shell reads the value; a default
    (``${HF_TOKEN:-hf_...}``) is written as it stands, so it is a written value."""
    for key in SECRET_KEYS:
        b = env.bindings.get(key)
        if b is not None and b.value:
            raise StackError(
                f"{key} in a layer would be written into the render, the job script and its logs",
                where=str(b.origin),
                hint="put the key in a file readable only by you and set SERVER_API_KEY_FILE=<path> instead",
            )
    for key, b in env.bindings.items():
        written = (*b.value, *(part for d in deferred_in(b.value) for part in d.default))  # a default is written too
        if looks_like_credential(key) and any(isinstance(part, str) and part for part in written):
            way = ("point the Hugging Face hub at a file readable only by you (chmod 600 FILE; HF_TOKEN_PATH=FILE "
                   "in the layer)" if key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN") else
                   "keep it in a file readable only by you and point the program at the file")
            raise StackError(
                f"{key} looks like a credential: a value written in a layer is copied into the render, the job "
                "script, the run directory's serve.env and the job's log",
                where=str(b.origin),
                hint=f"{way}, or export {key} in the shell you submit from and write {key}=${{{key}}} in the layer "
                     "(only the reference is written; the job's shell reads the value)")


class Unbound(NamedTuple):
    """A reference the job's shell expands without a default: unset there, ``set -u`` ends the job."""

    key: str  # the key whose value holds the reference
    name: str  # the variable read from the job's environment
    origin: Origin  # the assignment that reads it
    guards: tuple[tuple[str, str], ...]  # ((name, op), ...): only read when each of these is unset / empty


def unbound_refs(env: Env) -> list[Unbound]:
    """Every bare deferred reference of ``env`` (``$X``, ``${X}``; also inside a default, guarded)."""
    out: list[Unbound] = []
    seen: set = set()
    for b in env.bindings.values():
        for name, origin, guards in _bare(b.value, ()):
            if (b.key, name, guards) not in seen:
                seen.add((b.key, name, guards))
                out.append(Unbound(b.key, name, origin, guards))
    return out


def _bare(value: Resolved, guards: tuple) -> Iterator[tuple[str, Origin, tuple]]:
    for p in value:
        if isinstance(p, Deferred):
            if p.op is None:
                yield p.name, p.origin, guards
            else:
                yield from _bare(p.default, guards + ((p.name, p.op),))


# Every login shell carries these; a layer that sets one means to (PATH=/opt/x/bin:$PATH), nobody gave it for a run
SHELL_BASICS = frozenset(("PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "HOSTNAME", "LANG", "TERM",
                          "TMPDIR", "TZ", "MAIL", "SHLVL", "PYTHONPATH", "LD_LIBRARY_PATH", "MANPATH", "_"))


def shell_overridden(env: Env, environ: Mapping[str, str]) -> list[Binding]:
    """The bindings that overwrite a value the submitting shell gives the same name
    (``AGENT_READY_TIMEOUT_SECONDS=100 cluster/serve-only.sbatch``): the job script exports every layer
    key, so the shell's value never reaches the launcher. Not a key whose layer value reads the shell's
    own (``X=${X:-d}``, deferred to the job), not a value the layers give as well, not the shell's basics
    (SHELL_BASICS, ``LC_*``), and inside a job not the ``SLURM_*`` names Slurm set."""
    in_job = "SLURM_JOB_ID" in environ
    out = []
    for key, b in env.bindings.items():
        given = environ.get(key)
        if given is None or key in SHELL_BASICS or key.startswith("LC_") or in_job and key.startswith("SLURM_"):
            continue
        if any(d.name == key for d in deferred_in(b.value)) or expand(b.value, environ) == given:
            continue
        out.append(b)
    return out


def expand(value: Resolved, environ: Mapping[str, str]) -> "str | None":
    """The value bash gives ``value`` in ``environ`` (the login shell's, which sbatch passes on);
    None when a bare reference is unset there."""
    out = []
    for p in value:
        if isinstance(p, str):
            out.append(p)
            continue
        got = environ.get(p.name)
        if p.op == ":-" and not got or p.op == "-" and got is None:
            got = expand(p.default, environ)
        if got is None:
            return None
        out.append(got)
    return "".join(out)


# -- resolution ------------------------------------------------------------------------------

def _resolve(value: Value, state: dict[str, Resolved], a: Assignment) -> Resolved:
    out: list = []
    for part in value:
        if isinstance(part, str):
            out.append(part)
        else:
            out.extend(_resolve_ref(part, state, a))
    return join_parts(out)


def _resolve_ref(ref: Ref, state: dict[str, Resolved], a: Assignment) -> Resolved:
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
        f"${{{ref.name}:-...}} cannot be rendered: {ref.name} is '{value_text(value)}', and whether that is empty "
        "depends on the job's environment",
        where=str(a.origin),
        hint=f"use ${{{ref.name}-...}} or assign {ref.name} a plain value",
    )


def _emptiness(value: Resolved) -> bool | None:
    """True: surely empty; False: surely not; None: depends on the job's environment."""
    if not value:
        return True
    # parts are joined, so a str part is never empty
    return False if any(isinstance(p, str) for p in value) else None


def deferred_in(value: Resolved) -> Iterator[Deferred]:
    """Every deferred reference in a value, defaults included."""
    for p in value:
        if isinstance(p, Deferred):
            yield p
            yield from deferred_in(p.default)


def _check_render_order(env: Env) -> None:
    """The render writes each key once, in order of first assignment, so a line that reads
    NAME from the environment must come before the line that assigns NAME."""
    for b in env.bindings.values():
        for d in deferred_in(b.value):
            other = env.bindings.get(d.name)
            if other is None or d.name == b.key or other.first_index > b.first_index:
                continue
            assigned_at = other.overridden[0][1] if other.overridden else other.origin
            raise StackError(
                f"{b.key} reads ${d.name} from the environment at {d.origin}, but {d.name} is assigned at "
                f"{assigned_at}, before {b.key} is first set; a merged render cannot reproduce that order",
                where=str(d.origin),
                hint=f"assign {d.name} before reading it, or give the value read from the environment another name",
            )
