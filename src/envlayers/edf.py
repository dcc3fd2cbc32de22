"""Container definitions (EDFs) for the CSCS Container Engine.

Sources are data, one YAML file per engine image in ``containers/edfs/<role>.yaml``::

    role: sglang-mi300                       # == the file name
    name: hpcagent-bench-sglang-mi300-latest # EDF name, `srun --environment=<name>`
    engine: sglang
    remote_image: lmsysorg/sglang-rocm:<tag> # pinned: a tag that is not `latest`, or a digest
    fabric_env: {NCCL_NET: "AWS Libfabric"}  # only in the pipeline EDF
    edf:                                     # Container Engine keys, with CE types
      image: "${SCRATCH}/ce-images/<file>.sqsh"
      entrypoint: false
      mounts: [...]
      env: {...}                             # strings only
      annotations: {com.hooks.cxi.enabled: "true", ...}   # dotted keys, strings only

Each source gives two EDFs (``VARIANTS``): the base name for a pipeline-parallel server (fabric
hooks on, ``fabric_env`` set) and ``<name>-intranode`` for single-node and replica servers (cxi and
aws_ofi_nccl hooks off, ``fabric_env`` unset). TOML comes from tomli-w; the only text this module
adds is a two-line comment header that names the source and carries the SHA-256 of the body, which
is how ``install`` recognises a file it wrote and that nobody edited since.

YAML and tomli-w are imported inside the functions that need them, so importing this module is
cheap (the CLI imports it for ``TOPOLOGIES``).
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import shlex
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .errors import EdfError
from .fsutil import atomic_write

TOPOLOGIES = ("single", "replicas", "pipeline")

SOURCE_DIR = Path("containers") / "edfs"
FETCH_SCRIPT = Path("containers") / "registry.sbatch"
INTRANODE_SUFFIX = "-intranode"

# variant -> the topologies that use it. A pipeline-parallel server crosses nodes and needs the
# Slingshot plugin; a single-node or replica server must run without it (docs/containers.md: with the
# plugin hooks and a forced NCCL_NET its tensor-parallel group fails at init).
VARIANTS: dict[str, tuple[str, ...]] = {
    "fabric": ("pipeline",),
    "intranode": ("single", "replicas"),
}
# hooks the intranode variant turns off; netstack stays (it also carries CSCS's NCCL defaults)
FABRIC_HOOKS = ("cxi", "aws_ofi_nccl")

# ---------------------------------------------------------------------------------------------
# schema

_TOP_KEYS = ("role", "name", "engine", "remote_image", "fabric_env", "edf")
_TOP_REQUIRED = ("role", "name", "engine", "remote_image", "edf")
# Container Engine EDF keys, in the order they are rendered
_EDF_KEYS = ("base_environment", "image", "workdir", "entrypoint", "writable", "mounts", "env", "annotations")
_EDF_REQUIRED = ("image",)

_BOOL_STRINGS = ("true", "false")
# annotation -> allowed values (None: any string)
_ANNOTATIONS: dict[str, tuple[str, ...] | None] = {
    "com.hooks.netstack.source": None,  # "host" | "artifact" | "artifact:<version>", checked below
    "com.hooks.netstack.version": None,
    "com.hooks.netstack.name": None,
    "com.hooks.cxi.enabled": _BOOL_STRINGS,
    "com.hooks.aws_ofi_nccl.enabled": _BOOL_STRINGS,
    "com.hooks.aws_ofi_nccl.variant": ("cuda11", "cuda12", "cuda13", "cuda-dl", "rocm5", "rocm6"),
    "com.hooks.ssh.enabled": _BOOL_STRINGS,
    "com.hooks.ssh.authorize_ssh_key": None,
    "com.hooks.ssh.port": None,
    "com.hooks.nvidia_cuda_mps.enabled": _BOOL_STRINGS,
}

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DIGEST_RE = re.compile(r"@sha256:[0-9a-f]{64}$")
_SQUASHFS_SUFFIXES = (".sqsh", ".squashfs", ".sqfs")
_VAR_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

_HEADER_RE = re.compile(r"\A# [^\n]*\n# [^\n]*envlayers-sha256: ([0-9a-f]{64})\n\n")
_TMP_PREFIX = ".envlayers-tmp-"


@dataclass(frozen=True)
class Source:
    """One validated source file."""

    role: str
    name: str
    engine: str
    remote_image: str
    fabric_env: dict[str, str]
    edf: dict[str, Any]  # CE keys; annotations flat (dotted keys)
    file: str  # relative to the catalog root, e.g. containers/edfs/sglang-mi300.yaml

    def edf_name(self, variant: str) -> str:
        return self.name if variant == "fabric" else self.name + INTRANODE_SUFFIX


@dataclass(frozen=True)
class InstallResult:
    """What ``install`` did with one EDF, and whether its image is on disk."""

    name: str
    role: str
    variant: str  # "fabric" | "intranode"
    topologies: tuple[str, ...]
    path: Path
    status: str  # "written" | "unchanged" | "differs" | "overwritten"
    reason: str | None  # why a file was kept or replaced; None for a plain write or no change
    diff: str | None  # unified diff installed -> rendered, for "differs" and "overwritten"
    remote_image: str
    image: str  # the SquashFS path as the EDF names it (unexpanded)
    image_path: Path | None  # expanded; None when a variable in it is not set
    image_present: bool | None  # None when image_path is None
    fetch_command: str | None  # the command that imports the image, when it is missing

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "variant": self.variant,
            "topologies": list(self.topologies),
            "path": str(self.path),
            "status": self.status,
            "reason": self.reason,
            "diff": self.diff,
            "remote_image": self.remote_image,
            "image": self.image,
            "image_path": None if self.image_path is None else str(self.image_path),
            "image_present": self.image_present,
            "fetch_command": self.fetch_command,
        }


# ---------------------------------------------------------------------------------------------
# public API


def roles(root: Path) -> list[str]:
    """The catalog's roles, sorted."""
    return sorted(load_catalog(root))


def edf_name(role: str, topology: str, root: Path) -> str:
    """The EDF a server of ``role`` in ``topology`` runs with (``srun --environment=<name>``)."""
    return _source(role, root).edf_name(variant_for(topology))


def render_edf(role: str, topology: str, root: Path) -> str:
    """The TOML text ``install`` writes for ``role`` in ``topology``, header included."""
    return _document(_source(role, root), variant_for(topology))


def edf_dict(role: str, topology: str, root: Path) -> dict[str, Any]:
    """The EDF as data (what the TOML parses back to)."""
    return _edf_data(_source(role, root), variant_for(topology))


def variant_for(topology: str) -> str:
    for variant, topologies in VARIANTS.items():
        if topology in topologies:
            return variant
    raise EdfError(
        f"unknown topology {topology!r}",
        where="topology",
        hint=f"one of: {', '.join(TOPOLOGIES)}",
    )


def edf_search_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the Container Engine looks up ``--environment=<name>``: the first folder of
    ``EDF_PATH`` when it is set, else ``~/.edf``."""
    env = os.environ if environ is None else environ
    for folder in env.get("EDF_PATH", "").split(":"):
        if folder:
            return Path(folder).expanduser()
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".edf"


def expand_vars(text: str, environ: Mapping[str, str] | None = None, *, where: str | None = None) -> str:
    """Expand ``${VAR}``, ``${VAR:-default}`` and ``$$`` the way the Container Engine does;
    an undefined variable without a default is an error, as it is for the CE."""
    env = os.environ if environ is None else environ

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, default = m.group(1), m.group(2)
        value = env.get(name)
        if default is not None and not value:
            return default
        if value is None:
            raise EdfError(
                f"${{{name}}} is not set",
                where=where,
                hint=f"export {name} (the Container Engine expands it the same way)",
            )
        return value

    return _VAR_RE.sub(repl, text)


def fetch_command(role: str, root: Path, cwd: Path | None = None) -> str:
    """The exact command that imports ``role``'s pinned image to the SquashFS its EDF names."""
    here = (cwd or Path.cwd()).resolve()
    script = (Path(root).resolve() / FETCH_SCRIPT)
    try:
        shown = script.relative_to(here).as_posix()
    except ValueError:
        shown = str(script)
    return f"sbatch {shlex.quote(shown)} pull {shlex.quote(role)}"


def image_info(role: str, root: Path, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What ``registry.sbatch pull <role>`` needs: the pinned reference and the SquashFS path."""
    src = _source(role, root)
    image = src.edf["image"]
    path = expand_vars(image, environ, where=f"{src.file}: edf.image")
    return {
        "role": src.role,
        "remote_image": src.remote_image,
        "enroot_uri": "docker://" + src.remote_image,
        "image": image,
        "squashfs": path,
        "roles_sharing": sorted(s.role for s in load_catalog(root).values() if s.edf["image"] == image),
        "root": str(Path(root).resolve()),
    }


def load_catalog(root: Path) -> dict[str, Source]:
    """Every source under ``containers/edfs/``, validated, by role."""
    folder = Path(root) / SOURCE_DIR
    files = sorted(folder.glob("*.yaml")) if folder.is_dir() else []
    if not files:
        raise EdfError(
            f"no container definitions (*.yaml) in {folder}",
            where=str(SOURCE_DIR),
            hint="run inside a checkout, or pass --root DIR",
        )
    catalog: dict[str, Source] = {}
    names: dict[str, str] = {}
    images: dict[str, Source] = {}
    for path in files:
        src = _load_source(path, Path(root))
        for variant in VARIANTS:
            name = src.edf_name(variant)
            if name in names:
                raise EdfError(
                    f"EDF name {name!r} is also produced by {names[name]}",
                    where=f"{src.file}: name",
                    hint="every role needs its own EDF name",
                )
            names[name] = src.file
        other = images.get(src.edf["image"])
        if other is not None and other.remote_image != src.remote_image:
            raise EdfError(
                f"edf.image {src.edf['image']!r} is also the SquashFS of {other.role}, "
                f"which pins {other.remote_image!r}, not {src.remote_image!r}",
                where=f"{src.file}: edf.image",
                hint="one SquashFS holds one image: give this role its own file name",
            )
        images.setdefault(src.edf["image"], src)
        catalog[src.role] = src
    return catalog


def install(
    root: Path,
    dest: Path,
    force: bool = False,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> list[InstallResult]:
    """Render every EDF of the catalog into ``dest``.

    Each file is written to a temporary file in ``dest`` and renamed over the target, so a reader
    (or a kill -9) sees the old file or the new one, never a part. A file whose bytes already
    match is not touched. A file this tool did not write, or that was edited since (its header
    hash no longer matches its body), is kept unless ``force``; the result carries the diff.
    The catalog is validated and rendered in full before anything is written.
    """
    env = os.environ if environ is None else environ
    catalog = load_catalog(root)
    rendered = [
        (src, variant, _document(src, variant)) for src in catalog.values() for variant in VARIANTS
    ]
    dest = Path(dest)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EdfError(f"cannot create {dest}: {err.strerror}", where="--dest") from None
    _remove_stale_temps(dest)

    images: dict[str, tuple[Path | None, bool | None]] = {}
    results = []
    for src, variant, text in rendered:
        name = src.edf_name(variant)
        path = dest / f"{name}.toml"
        status, reason, diff = _classify(path, text)
        if status == "differs" and force and not path.is_symlink():
            status = "overwritten"
        if status in ("written", "overwritten"):
            try:
                atomic_write(path, text, mode=0o644,
                             tmp_prefix=f"{_TMP_PREFIX}{socket.gethostname()}-{os.getpid()}-{path.name}.")
            except OSError as err:
                raise EdfError(
                    f"cannot write {path}: {err.strerror or err}",
                    where=str(dest),
                    hint="check the folder's permissions and free space; EDFs already written are complete",
                ) from None
        if src.edf["image"] not in images:
            images[src.edf["image"]] = _image_state(src, env)
        image_path, present = images[src.edf["image"]]
        results.append(
            InstallResult(
                name=name,
                role=src.role,
                variant=variant,
                topologies=VARIANTS[variant],
                path=path,
                status=status,
                reason=reason,
                diff=diff,
                remote_image=src.remote_image,
                image=src.edf["image"],
                image_path=image_path,
                image_present=present,
                fetch_command=None if present is not False else fetch_command(src.role, root, cwd),
            )
        )
    return results


# ---------------------------------------------------------------------------------------------
# loading and validation


def _source(role: str, root: Path) -> Source:
    catalog = load_catalog(root)
    if role not in catalog:
        close = difflib.get_close_matches(role, catalog, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise EdfError(
            f"unknown container role {role!r}",
            where=str(SOURCE_DIR),
            hint=f"{hint}roles: {', '.join(sorted(catalog))}",
        )
    return catalog[role]


class _Checker:
    """Raises EdfErrors that name the file, the line and the key path."""

    def __init__(self, rel: str, lines: dict[tuple, int]):
        self.rel = rel
        self.lines = lines

    def fail(self, path: tuple, message: str, hint: str | None = None) -> None:
        line = None
        for n in range(len(path), 0, -1):
            line = self.lines.get(path[:n])
            if line is not None:
                break
        where = f"{self.rel}:{line}" if line is not None else self.rel
        label = _dotted(path)
        raise EdfError(f"{label}: {message}" if label else message, where=where, hint=hint)

    def string(self, path: tuple, value: Any, *, hint: str | None = None) -> str:
        if not isinstance(value, str):
            self.fail(path, f"must be a string, got {_kind(value)}", hint or f"quote it: {_yaml_quoted(path, value)}")
        return value

    def table(self, path: tuple, value: Any, what: str) -> dict:
        if not isinstance(value, dict):
            self.fail(path, f"must be a table of {what}, got {_kind(value)}")
        return value


def _load_source(path: Path, root: Path) -> Source:
    import yaml

    try:
        rel = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        rel = str(path)
    try:
        stat = path.stat()
    except OSError as err:
        raise EdfError(f"cannot read: {err.strerror}", where=rel) from None
    key = (rel, stat.st_mtime_ns, stat.st_size, stat.st_ino)
    cached = _SOURCE_CACHE.get(path.resolve())
    if cached is not None and cached[0] == key:
        return cached[1]
    text = path.read_text(encoding="utf-8")
    fast = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        node = yaml.compose(text, Loader=fast)
        data = None if node is None else fast("").construct_document(node)
    except yaml.YAMLError:
        # report with the pure-Python parser: its messages and lines do not depend on libyaml
        try:
            yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"{rel}:{mark.line + 1}" if mark is not None else rel
            problem = getattr(err, "problem", None) or str(err)
            raise EdfError(f"not valid YAML: {problem}", where=where) from None
        raise
    lines: dict[tuple, int] = {}
    check = _Checker(rel, lines)
    if node is not None:
        _index_lines(node, (), lines, check)
    if not isinstance(data, dict):
        check.fail((), f"must be a mapping of {', '.join(_TOP_KEYS)}, got {_kind(data)}")

    _no_unknown_keys(check, (), data, _TOP_KEYS, "keys of a container source are")
    for key in _TOP_REQUIRED:
        if key not in data:
            check.fail((), f"missing key {key!r}", hint=f"a container source needs: {', '.join(_TOP_REQUIRED)}")

    role = check.string(("role",), data["role"])
    if role != path.stem:
        check.fail(("role",), f"role {role!r} does not match the file name {path.name!r}",
                   hint=f"name the file {role}.yaml, or set role: {path.stem}")
    name = check.string(("name",), data["name"])
    for key, value in (("role", role), ("name", name)):
        if not _NAME_RE.match(value):
            check.fail((key,), f"{value!r} is not a usable name", hint="letters, digits, '.', '_' and '-' only")
    if name.endswith(INTRANODE_SUFFIX):
        check.fail(("name",), f"must not end in {INTRANODE_SUFFIX!r}",
                   hint=f"the {INTRANODE_SUFFIX} variant is derived from the base name")
    engine = check.string(("engine",), data["engine"])
    remote = check.string(("remote_image",), data["remote_image"])
    if _is_local(remote):
        check.fail(("remote_image",), f"{remote!r} is a path, not a registry reference",
                   hint="write [REGISTRY#]IMAGE:TAG, e.g. vllm/vllm-openai-rocm:v0.28.0")
    problem = unpinned(remote)
    if problem:
        check.fail(("remote_image",), f"{remote!r} {problem}", hint=_PIN_HINT)

    fabric_env = _env_table(check, ("fabric_env",), data.get("fabric_env", {}))
    edf = _check_edf(check, check.table(("edf",), data["edf"], "Container Engine keys"))
    for key in fabric_env:
        if key in edf.get("env", {}):
            check.fail(("fabric_env", key), "is also set in edf.env",
                       hint="a key belongs either to every variant (edf.env) or to the pipeline EDF only (fabric_env)")
    src = Source(role=role, name=name, engine=engine, remote_image=remote,
                 fabric_env=fabric_env, edf=edf, file=rel)
    _SOURCE_CACHE[path.resolve()] = (key, src)
    return src


# validated sources by file, keyed on (relative name, mtime, size, inode): the launcher asks for
# names and renders several times per command, and an edit changes the key
_SOURCE_CACHE: dict[Path, tuple[tuple, Source]] = {}


_PIN_HINT = "pin a release tag or a digest (IMAGE:TAG or IMAGE@sha256:<digest>); the EDF name may say -latest, the image may not"


def unpinned(ref: str) -> str | None:
    """Why a remote reference ``[USER@][REGISTRY#]IMAGE[:TAG][@sha256:DIGEST]`` is not pinned,
    or None when it is."""
    if _DIGEST_RE.search(ref):
        return None
    if "@sha256:" in ref:
        return "has a malformed digest (want @sha256: and 64 hex digits)"
    image = ref.rsplit("#", 1)[-1]
    if "#" not in ref and "@" in image:
        image = image.split("@", 1)[1]  # USER@IMAGE
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "has no tag"
    tag = last.rsplit(":", 1)[1]
    if not tag:
        return "has an empty tag"
    if tag.lower() == "latest":
        return "is tagged 'latest', which moves"
    return None


def _check_edf(check: _Checker, edf: dict) -> dict:
    _no_unknown_keys(check, ("edf",), edf, _EDF_KEYS, "Container Engine EDF keys are")
    for key in _EDF_REQUIRED:
        if key not in edf:
            check.fail(("edf",), f"missing key {key!r}", hint="the EDF must name the image")
    out: dict[str, Any] = {}
    for key in _EDF_KEYS:
        if key not in edf:
            continue
        path, value = ("edf", key), edf[key]
        if key in ("image", "workdir"):
            out[key] = check.string(path, value)
        elif key in ("entrypoint", "writable"):
            if not isinstance(value, bool):
                check.fail(path, f"must be a boolean, got {_kind(value)}", hint="write true or false, unquoted")
            out[key] = value
        elif key == "base_environment":
            if isinstance(value, list):
                out[key] = [check.string(path + (i,), v) for i, v in enumerate(value)]
            else:
                out[key] = check.string(path, value, hint="a string or a list of strings")
        elif key == "mounts":
            if not isinstance(value, list):
                check.fail(path, f"must be a list of strings, got {_kind(value)}")
            out[key] = [check.string(path + (i,), v) for i, v in enumerate(value)]
            for i, mount in enumerate(out[key]):
                if not mount or mount.startswith(":"):
                    check.fail(path + (i,), f"{mount!r} is not SRC[:DST[:FLAGS]]")
        elif key == "env":
            out[key] = _env_table(check, path, value)
        elif key == "annotations":
            out[key] = _annotations(check, path, value)

    image = out["image"]
    if not _is_local(image):
        check.fail(("edf", "image"),
                   f"{image!r} is a registry reference; the EDF names the local SquashFS that registry.sbatch pull writes",
                   hint="put the reference in remote_image and set edf.image to \"${SCRATCH}/ce-images/<file>.sqsh\"")
    if not image.endswith(_SQUASHFS_SUFFIXES):
        check.fail(("edf", "image"), f"{image!r} is not a SquashFS file",
                   hint=f"end it in one of {', '.join(_SQUASHFS_SUFFIXES)}")
    return out


def _env_table(check: _Checker, path: tuple, value: Any) -> dict[str, str]:
    table = check.table(path, value, "strings")
    for key, item in table.items():
        if not _ENV_NAME_RE.match(key):
            check.fail(path + (key,), "is not an environment variable name")
        if not isinstance(item, str):
            check.fail(path + (key,), f"[env] values must be strings, got {_kind(item)}",
                       hint=f"quote it: {_yaml_quoted(path + (key,), item)}")
    return dict(table)


def _annotations(check: _Checker, path: tuple, value: Any) -> dict[str, str]:
    table = check.table(path, value, "strings (dotted keys)")
    for key, item in table.items():
        kpath = path + (key,)
        if key not in _ANNOTATIONS:
            close = difflib.get_close_matches(key, _ANNOTATIONS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            check.fail(kpath, "unknown annotation", hint=f"{hint}known: {', '.join(_ANNOTATIONS)}")
        if not isinstance(item, str):
            check.fail(kpath, f"annotation values must be strings, got {_kind(item)}",
                       hint=f"quote it: {_yaml_quoted(kpath, item)}")
        allowed = _ANNOTATIONS[key]
        if allowed is not None and item not in allowed:
            check.fail(kpath, f"{item!r} is not one of {', '.join(allowed)}")

    # The catalog's fabric policy: three hooks, pinned (see docs/containers.md).
    source = table.get("com.hooks.netstack.source")
    if source is None or not (source == "artifact" or source.startswith("artifact:")):
        check.fail(path, "the netstack hook must come from a pinned artifact",
                   hint='set com.hooks.netstack.source: "artifact" with com.hooks.netstack.version and .name')
    if source == "artifact" and "com.hooks.netstack.version" not in table:
        check.fail(path, "com.hooks.netstack.version is missing: an unversioned artifact follows CSCS's latest",
                   hint="pin the netstack version the image was tested with")
    if "com.hooks.netstack.name" not in table:
        check.fail(path, "com.hooks.netstack.name is missing", hint="pin the netstack artifact name")
    for hook in FABRIC_HOOKS:
        if table.get(f"com.hooks.{hook}.enabled") != "true":
            check.fail(path, f"com.hooks.{hook}.enabled must be \"true\" in the source",
                       hint=f"the pipeline EDF needs it; the {INTRANODE_SUFFIX} variant turns it off")
    if "com.hooks.aws_ofi_nccl.variant" not in table:
        check.fail(path, "com.hooks.aws_ofi_nccl.variant is missing", hint="rocm6 on AMD, cudaNN on NVIDIA")
    return dict(table)


def _no_unknown_keys(check: _Checker, path: tuple, table: dict, known: tuple[str, ...], what: str) -> None:
    for key in table:
        if not isinstance(key, str):
            check.fail(path, f"key {key!r} is not a string", hint="quote it")
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            check.fail(path + (key,), "unknown key", hint=f"{hint}{what}: {', '.join(known)}")


def _index_lines(node: Any, path: tuple, lines: dict[tuple, int], check: _Checker) -> None:
    """Record the line of every key path, and refuse duplicate keys (PyYAML keeps the last)."""
    import yaml

    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node)
            kpath = path + (key,)
            lines[kpath] = key_node.start_mark.line + 1
            if key in seen:
                check.fail(kpath, "duplicate key", hint="YAML would keep only the last one")
            seen.add(key)
            _index_lines(value_node, kpath, lines, check)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, path + (i,), lines, check)


def _dotted(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__} ({value})"


def _yaml_quoted(path: tuple, value: Any) -> str:
    key = path[-1] if path else "key"
    text = str(value).lower() if isinstance(value, bool) else ("" if value is None else str(value))
    return f'{key}: "{text}"'


def _is_local(image: str) -> bool:
    return image.startswith(("/", "./", "../", "$", "~"))


# ---------------------------------------------------------------------------------------------
# rendering


def _edf_data(src: Source, variant: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _EDF_KEYS:
        if key in src.edf and key not in ("env", "annotations"):
            value = src.edf[key]
            out[key] = list(value) if isinstance(value, list) else value
    env = dict(src.edf.get("env", {}))
    annotations = dict(src.edf.get("annotations", {}))
    if variant == "fabric":
        env.update(src.fabric_env)
    else:
        # "" unsets the variable in the container, so a value from the step's environment
        # cannot force the fabric either
        env.update({key: "" for key in src.fabric_env})
        annotations = {k: v for k, v in annotations.items() if _hook(k) not in FABRIC_HOOKS}
        # explicit "false": on some vClusters the CXI hook is on unless told otherwise
        for hook in FABRIC_HOOKS:
            annotations[f"com.hooks.{hook}.enabled"] = "false"
    if env:
        out["env"] = env
    if annotations:
        out["annotations"] = _nest(annotations)
    return out


def _hook(annotation: str) -> str | None:
    parts = annotation.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["com", "hooks"] else None


def _nest(flat: dict[str, str]) -> dict[str, Any]:
    """``{"com.hooks.cxi.enabled": "true"}`` -> ``{"com": {"hooks": {"cxi": {"enabled": "true"}}}}``:
    the CE reads annotations as nested tables; a quoted dotted key would be one odd key."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        table = out
        for part in parents:
            table = table.setdefault(part, {})
        table[leaf] = value
    return out


def _document(src: Source, variant: str) -> str:
    import tomli_w

    body = tomli_w.dumps(_edf_data(src, variant))
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    header = (
        f"# {src.edf_name(variant)}: rendered by env_layers from {src.file} "
        f"for {'topologies' if len(VARIANTS[variant]) > 1 else 'topology'} {' and '.join(VARIANTS[variant])}.\n"
        f"# Do not edit: change the source, then run `env_layers install-edfs`. envlayers-sha256: {digest}\n"
        "\n"
    )
    return header + body


def written_by_envlayers(text: str) -> bool | None:
    """True: our header and an unedited body. False: our header, edited since. None: no header."""
    m = _HEADER_RE.match(text)
    if not m:
        return None
    body = text[m.end():]
    return hashlib.sha256(body.encode("utf-8")).hexdigest() == m.group(1)


# ---------------------------------------------------------------------------------------------
# installing


def _classify(path: Path, text: str) -> tuple[str, str | None, str | None]:
    if not path.exists() and not path.is_symlink():
        return "written", None, None
    try:
        current = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as err:
        return "differs", f"cannot be read ({err.strerror})", None
    if current == text:
        return "unchanged", None, None
    if path.is_symlink():
        reason = ("a symbolic link (it may point into a shared folder): never replaced, not even with --force; "
                  "remove the link or install with --dest")
    else:
        ours = written_by_envlayers(current)
        if ours is True:
            return "written", "replaced an older render", _diff(current, text, path)
        reason = "edited since env_layers wrote it" if ours is False else "not written by env_layers"
    return "differs", reason, _diff(current, text, path)


def _diff(current: str, new: str, path: Path) -> str:
    return "".join(
        difflib.unified_diff(
            current.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"{path} (installed)",
            tofile=f"{path} (env_layers)",
        )
    )




def _remove_stale_temps(dest: Path, *, max_age_s: float = 86400.0) -> None:
    """Remove temporary files an interrupted install left: ours (by prefix), from this host with
    a process that is gone, or older than a day. The CE never reads them (they do not end in
    .toml), this only keeps the folder tidy."""
    host = socket.gethostname()
    now = time.time()
    for tmp in dest.glob(f"{_TMP_PREFIX}*.tmp"):
        rest = tmp.name[len(_TMP_PREFIX):]
        stale = False
        if rest.startswith(host + "-"):
            pid_text = rest[len(host) + 1:].split("-", 1)[0]
            stale = pid_text.isdigit() and not _alive(int(pid_text))
        try:
            stale = stale or now - tmp.stat().st_mtime > max_age_s
            if stale:
                tmp.unlink()
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _image_state(src: Source, environ: Mapping[str, str]) -> tuple[Path | None, bool | None]:
    try:
        path = Path(expand_vars(src.edf["image"], environ))
    except EdfError:
        return None, None
    return path, path.is_file()
