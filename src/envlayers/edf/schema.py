"""The container sources ``containers/edfs/<role>.yaml``: their schema, validated with file:line.

Sources are data, one YAML file per engine image (docs/containers.md)::

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

Each file is read with the shared reader (:mod:`envlayers.yamlpos`): every error names the file, the
line and the key path. :func:`load_catalog` gives every source, validated, by role.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EdfError
from ..runtimes.images import unpinned
from ..topology_checks import MODES

# the EDF variants are chosen per launch mode (a plan's edf_topology is one of these)
TOPOLOGIES = MODES

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

_TOP_KEYS = ("role", "name", "engine", "remote_image", "fabric_env", "edf")

_TOP_REQUIRED = ("role", "name", "engine", "remote_image")  # no edf: a role for the other runtimes only

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


_SQUASHFS_SUFFIXES = (".sqsh", ".squashfs", ".sqfs")

_PIN_HINT = "pin a release tag or a digest (IMAGE:TAG or IMAGE@sha256:<digest>); the EDF name may say -latest, the image may not"


@dataclass(frozen=True)
class RoleSource:
    """One validated source file: ``role``, ``name``, ``engine``, ``remote_image``, ``fabric_env``, ``edf``
    (CE keys; annotations flat, dotted keys; empty for a role that serves the other runtimes only), ``file`` (relative to the catalog root, e.g.
    containers/edfs/sglang-mi300.yaml) and ``lines`` (key path -> line in ``file``, for messages).

    Two sources are equal when they say the same, whatever lines they say it on.
    """

    role: str
    name: str
    engine: str
    remote_image: str
    fabric_env: dict[str, str]
    edf: dict[str, Any]
    file: str
    lines: dict = field(default_factory=dict, compare=False, repr=False)

    def edf_name(self, variant: str) -> str:
        self.require_edf()
        return self.name if variant == "fabric" else self.name + INTRANODE_SUFFIX

    def require_edf(self) -> None:
        """Refuse a role whose source has no ``edf:`` table where an EDF is needed."""
        if not self.edf:
            raise EdfError(f"role {self.role} has no edf: table: it names an image for podman, apptainer, "
                           "charliecloud and pyxis, not an EDF for the Container Engine", where=self.file,
                           hint="use one of those runtimes (CONTAINER_RUNTIME), or add an edf: table to the source "
                                "(docs/containers.md)")


def load_catalog(root: Path) -> dict[str, RoleSource]:
    """Every source under ``containers/edfs/``, validated, by role."""
    folder = Path(root) / SOURCE_DIR
    files = sorted(folder.glob("*.yaml")) if folder.is_dir() else []
    if not files:
        raise EdfError(
            f"no container definitions (*.yaml) in {folder}",
            where=str(SOURCE_DIR),
            hint="run inside a checkout, or pass --root DIR",
        )
    catalog: dict[str, RoleSource] = {}
    names: dict[str, str] = {}
    images: dict[str, RoleSource] = {}
    for path in files:
        src = _load_source(path, Path(root))
        for variant in VARIANTS if src.edf else ():  # a role without edf: names no EDF
            name = src.edf_name(variant)
            if name in names:
                raise EdfError(
                    f"name: EDF name {name!r} is also produced by {names[name]}",
                    where=f"{src.file}:{src.lines.get(('name',), 1)}",
                    hint="every role needs its own EDF name",
                )
            names[name] = src.file
        if not src.edf:
            catalog[src.role] = src
            continue
        other = images.get(src.edf["image"])
        if other is not None and other.remote_image != src.remote_image:
            raise EdfError(
                f"edf.image: {_clip(src.edf['image'])} is also the SquashFS of {other.role}, "
                f"which pins {_clip(other.remote_image)}, not {_clip(src.remote_image)}",
                where=f"{src.file}:{src.lines.get(('edf', 'image'), 1)}",
                hint="one SquashFS holds one image: give this role its own file name",
            )
        images.setdefault(src.edf["image"], src)
        catalog[src.role] = src
    return catalog


def source(role: str, root: Path) -> RoleSource:
    """The validated source of ``role``; an unknown role is an error with the near names."""
    catalog = load_catalog(root)
    if role not in catalog:
        import difflib

        close = difflib.get_close_matches(role, catalog, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise EdfError(
            f"unknown container role {_clip(role)}",
            where=str(SOURCE_DIR),
            hint=f"{hint}roles: {', '.join(sorted(catalog))}",
        )
    return catalog[role]


class _Checker:
    """Typed reads of the constructed source data; errors through the reader's one format."""

    def __init__(self, doc):
        self.doc = doc

    def fail(self, path: tuple, message: str, hint: str | None = None) -> None:
        self.doc.fail(path, message, hint)

    def string(self, path: tuple, value: Any, *, hint: str | None = None) -> str:
        if not isinstance(value, str):
            self.fail(path, f"must be a string, got {_kind(value)}", hint or f"quote it: {_yaml_quoted(path, value)}")
        return value

    def table(self, path: tuple, value: Any, what: str) -> dict:
        if not isinstance(value, dict):
            self.fail(path, f"must be a table of {what}, got {_kind(value)}")
        return value


def _load_source(path: Path, root: Path) -> RoleSource:
    from .. import yamlpos

    try:
        rel = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        rel = str(path)
    text = yamlpos.read_text(path, rel, EdfError)
    return _validated(yamlpos.parse(text, rel, EdfError), path, rel)


def _validated(doc, path: Path, rel: str) -> RoleSource:
    data = doc.data()
    check = _Checker(doc)
    if not isinstance(data, dict):
        check.fail((), f"must be a mapping of {', '.join(_TOP_KEYS)}, got {_kind(data)}")

    _no_unknown_keys(check, (), data, _TOP_KEYS, "keys of a container source are")
    for key in _TOP_REQUIRED:
        if key not in data:
            check.fail((), f"missing key {key!r}", hint=f"a container source needs: {', '.join(_TOP_REQUIRED)}")

    role = check.string(("role",), data["role"])
    if role != path.stem:
        check.fail(("role",), f"role {_clip(role)} does not match the file name {_clip(path.name)}",
                   hint=f"name the file {role[:80]}.yaml, or set role: {path.stem}")
    name = check.string(("name",), data["name"])
    for key, value in (("role", role), ("name", name)):
        if not _NAME_RE.match(value):
            check.fail((key,), f"{_clip(value)} is not a usable name", hint="letters, digits, '.', '_' and '-' only")
    if name.endswith(INTRANODE_SUFFIX):
        check.fail(("name",), f"must not end in {INTRANODE_SUFFIX!r}",
                   hint=f"the {INTRANODE_SUFFIX} variant is derived from the base name")
    engine = check.string(("engine",), data["engine"])
    remote = check.string(("remote_image",), data["remote_image"])
    if _is_local(remote):
        check.fail(("remote_image",), f"{_clip(remote)} is a path, not a registry reference",
                   hint="write [REGISTRY#]IMAGE:TAG, e.g. vllm/vllm-openai-rocm:v0.28.0")
    problem = unpinned(remote)
    if problem:
        check.fail(("remote_image",), f"{_clip(remote)} {problem}", hint=_PIN_HINT)

    fabric_env = _env_table(check, ("fabric_env",), data.get("fabric_env", {}))
    if "edf" not in data:  # the image for podman, apptainer, charliecloud, pyxis: nothing for the Container Engine
        if fabric_env:
            check.fail(("fabric_env",), "belongs to the pipeline EDF, and this source has no edf: table",
                       hint="add the edf: table, or remove fabric_env")
        return RoleSource(role=role, name=name, engine=engine, remote_image=remote, fabric_env={}, edf={},
                          file=rel, lines=doc.lines)
    edf = _check_edf(check, check.table(("edf",), data["edf"], "Container Engine keys"))
    for key in fabric_env:
        if key in edf.get("env", {}):
            check.fail(("fabric_env", key), "is also set in edf.env",
                       hint="a key belongs either to every variant (edf.env) or to the pipeline EDF only (fabric_env)")
    return RoleSource(role=role, name=name, engine=engine, remote_image=remote,
                  fabric_env=fabric_env, edf=edf, file=rel, lines=doc.lines)


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
                    check.fail(path + (i,), f"{_clip(mount)} is not SRC[:DST[:FLAGS]]")
        elif key == "env":
            out[key] = _env_table(check, path, value)
        elif key == "annotations":
            out[key] = _annotations(check, path, value)

    image = out["image"]
    if not _is_local(image):
        check.fail(("edf", "image"),
                   f"{_clip(image)} is a registry reference; the EDF names the local SquashFS that registry.sbatch pull writes",
                   hint="put the reference in remote_image and set edf.image to \"${SCRATCH}/ce-images/<file>.sqsh\"")
    if not image.endswith(_SQUASHFS_SUFFIXES):
        check.fail(("edf", "image"), f"{_clip(image)} is not a SquashFS file",
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
            import difflib

            close = difflib.get_close_matches(key, _ANNOTATIONS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            check.fail(kpath, "unknown annotation", hint=f"{hint}known: {', '.join(_ANNOTATIONS)}")
        if not isinstance(item, str):
            check.fail(kpath, f"annotation values must be strings, got {_kind(item)}",
                       hint=f"quote it: {_yaml_quoted(kpath, item)}")
        allowed = _ANNOTATIONS[key]
        if allowed is not None and item not in allowed:
            check.fail(kpath, f"{_clip(item)} is not one of {', '.join(allowed)}")

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
            check.fail(path, f"key {_clip(key)} is not a string", hint="quote it")
        if key not in known:
            import difflib

            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            check.fail(path + (key,), "unknown key", hint=f"{hint}{what}: {', '.join(known)}")


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
        return f"a string ({_clip(value)})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__} ({value})"


def _yaml_quoted(path: tuple, value: Any) -> str:
    key = path[-1] if path else "key"
    text = str(value).lower() if isinstance(value, bool) else ("" if value is None else str(value))
    return f'{key}: "{text}"'


def _clip(value: Any) -> str:
    from ..yamlpos import clip

    return clip(value)


def _is_local(image: str) -> bool:
    return image.startswith(("/", "./", "../", "$", "~"))
