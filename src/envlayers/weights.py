"""The model's weights, checked on the login node before anything is submitted.

A model named by its Hugging Face hub id (``org/name``) must already be in the cache the job reads:
a download inside the allocation keeps every GPU of it idle (and billed) for as long as it takes.
:func:`check` finds that cache the way the server will, looks for a snapshot with at least one weight
file in the hub layout, and returns ``(warnings, blockers)`` for the dry run and the submission:

    $HF_HOME/hub/models--<org>--<name>/snapshots/<revision>/*.safetensors | *.bin | *.index.json
    ($HF_HUB_CACHE replaces $HF_HOME/hub when it is set)

Which ``HF_HOME`` the server sees: with the Container Engine (``CONTAINER_RUNTIME=ce``) the EDF's
``[env]`` wins over the job's environment, so the role's ``edf.env`` value counts when it sets one;
otherwise the merged layers' value (the job exports it; podman hands it to the container by name).
A value the login node cannot expand, or none at all, is a warning: nothing can be checked here.
``CHECK_WEIGHTS=0`` turns the check off, for weights that reach the nodes another way.

Reads the file system (a few ``stat`` calls), nothing else.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Mapping

from .errors import EnvLayersError
from .layers import Env

KEY = "CHECK_WEIGHTS"
_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
# org/name as the hub spells repository ids; anything else (an absolute path, ./x, a bare name) is not checked
_HUB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*\Z")
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.index.json")


def enabled(text: Mapping[str, str], where: str = KEY) -> bool:
    """``CHECK_WEIGHTS``: absent or empty -> on; 1/true/yes/on -> on; 0/false/no/off -> off; else an error."""
    raw = (text.get(KEY) or "").strip().lower()
    if not raw or raw in _ON:
        return True
    if raw in _OFF:
        return False
    raise EnvLayersError(f"{KEY}={text.get(KEY)!r} is neither on nor off", where=where,
                         hint="0 skips the weights check before submission (weights that come another way); "
                              "1 or absent checks them")


def hub_id(model: str | None, cwd: Path | None = None) -> str | None:
    """``model`` when it is a hub id (``org/name``) and not a folder that exists here; else None."""
    model = (model or "").strip()
    if not _HUB_ID_RE.match(model) or model.startswith("."):
        return None
    if (Path(cwd or ".") / model).is_dir():  # the engines load a local folder of that name first
        return None
    return model


def repo_folder(hub: Path, model: str) -> Path:
    """The hub layout's folder of one model repository: ``models--<org>--<name>``."""
    return hub / ("models--" + model.replace("/", "--"))


def snapshot_with_weights(hub: Path, model: str) -> Path | None:
    """The first snapshot of ``model`` under the hub cache ``hub`` that holds a weight file (a link
    that dangles, as an interrupted download leaves one, does not count); None when there is none.
    Raises OSError when a folder of it cannot be read."""
    snapshots = repo_folder(hub, model) / "snapshots"
    try:
        revisions = sorted(p for p in snapshots.iterdir() if p.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return None
    for rev in revisions:
        for pattern in WEIGHT_PATTERNS:
            if any(f.is_file() for f in rev.glob(pattern)):
                return rev
    return None


def _cache_setting(env: Env, text: Mapping[str, str], root: Path) -> tuple[str | None, str | None, str]:
    """(key, value, where) of the setting that names the server's hub cache: HF_HUB_CACHE before HF_HOME,
    the EDF's before the layers' (Container Engine only). (None, None, why) when nothing sets it."""
    from .runtimes import runtime_name

    edf_env: Mapping[str, str] = {}
    src = None
    role = text.get("CONTAINER_ROLE")
    if runtime_name(text) == "ce" and role:
        from .edf.schema import source

        try:
            src = source(role, root)
        except EnvLayersError:
            src = None  # an unknown role is reported where the EDF is chosen
        edf_env = (src.edf.get("env") or {}) if src else {}
    for key in ("HF_HUB_CACHE", "HF_HOME"):
        if edf_env.get(key):
            line = src.lines.get(("edf", "env", key))
            return key, edf_env[key], f"{src.file}:{line}" if line else f"{src.file}: edf.env.{key}"
        b = env.bindings.get(key)
        if b is not None and text.get(key):
            return key, None, str(b.origin)
    return None, None, "not set in the layers" + (" nor in the EDF" if src else "")


def check(root: Path, env: Env, text: Mapping[str, str], environ: Mapping[str, str],
          cwd: Path | None = None) -> tuple[list[str], list[str]]:
    """(warnings, blockers) about the weights of ``INFERENCE_MODEL`` in the cache the job will read."""
    b = env.bindings.get(KEY)
    if not enabled(text, str(b.origin) if b else KEY):
        return [], []
    model_b = env.bindings.get("INFERENCE_MODEL")
    model = hub_id(text.get("INFERENCE_MODEL"), cwd)
    if model is None or model_b is None:
        return [], []  # a local path, or a reference: the engine reports a missing folder itself
    key, edf_value, where = _cache_setting(env, text, root)
    if key is None:
        return [f"HF_HOME is {where}: the weights of {model} cannot be checked before submission (the job reads "
                f"its environment's HF_HOME, else ~/.cache/huggingface); set HF_HOME in a layer, or {KEY}=0 "
                "when the weights come another way"], []
    value = _expanded(env, key, edf_value, environ)
    if value is None:
        return [f"{key} ({where}) reads a variable this shell does not set: the weights of {model} cannot be "
                f"checked before submission; export it here, or {KEY}=0 when the weights come another way"], []
    path = Path(value).expanduser()
    hub = path if key == "HF_HUB_CACHE" else path / "hub"
    try:
        if snapshot_with_weights(hub, model) is not None:
            return [], []
    except OSError as err:  # a shared cache this user cannot read: the check cannot say, the job may
        return [f"INFERENCE_MODEL ({model_b.origin}): cannot look for the weights of {model} in {key}={path} "
                f"({where}): {err.strerror or err}; fix the permissions, or set {KEY}=0 when the job reads them "
                "another way"], []
    download = f"{key}={shlex.quote(str(path))} hf download {shlex.quote(model)}"
    return [], [f"INFERENCE_MODEL ({model_b.origin}): the weights of {model} are not in the cache the job reads, "
                f"{key}={path} ({where}): no weight file (*.safetensors, *.bin, *.index.json) under "
                f"{repo_folder(hub, model)}/snapshots/; a download inside the job would keep every allocated GPU "
                f"idle. Download them first: `{download}` (older clients: `{key}={shlex.quote(str(path))} "
                f"huggingface-cli download {shlex.quote(model)}`), or set {KEY}=0 when they come another way"]


def _expanded(env: Env, key: str, edf_value: str | None, environ: Mapping[str, str]) -> str | None:
    if edf_value is not None:
        from .edf.images import expand_vars

        try:
            return expand_vars(edf_value, environ)
        except EnvLayersError:
            return None
    from .layers import expand

    return expand(env.bindings[key].value, environ)
