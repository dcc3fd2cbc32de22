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

Their fit: :func:`estimate` sizes the weights in a snapshot (the safetensors index's
``metadata.total_size``, else the safetensors headers' tensor shapes and dtypes, else the files' sizes;
config.json's dtype as a cross-check), and :func:`fit` holds that against the GPU memory one instance of
the plan has (``GPU_MEM_GB`` per GPU): weights alone larger than it are a blocker, weights that fit
without :data:`HEADROOM` for the KV cache and activations a warning, each naming the node count that fits.

Reads the file system (a few ``stat`` calls, the index, config.json and the safetensors headers: a few
kilobytes per file, never the tensors), nothing else.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, NamedTuple

from . import keys
from .errors import EnvLayersError
from .layers import Env
from . import shell

if TYPE_CHECKING:
    from .topology import Plan

KEY = "CHECK_WEIGHTS"
# org/name as the hub spells repository ids; anything else (an absolute path, ./x, a bare name) is not checked
_HUB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*\Z")
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.index.json")


def enabled(text: Mapping[str, str]) -> bool:
    """``CHECK_WEIGHTS``: absent or empty -> on, else a boolean (``envlayers.keys``' one rule)."""
    return keys.value(text, KEY)


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


def _cache_setting(env: Env, text: Mapping[str, str], root: Path,
                   role_source=None) -> tuple[str | None, str | None, str]:
    """(key, value, where) of the setting that names the server's hub cache: HF_HUB_CACHE before HF_HOME,
    the EDF's before the layers' (Container Engine only). (None, None, why) when nothing sets it.
    ``role_source``: CONTAINER_ROLE's validated source when the caller has read it, else it is read here."""
    from .runtimes import runtime_name

    edf_env: Mapping[str, str] = {}
    src = None
    role = text.get("CONTAINER_ROLE")
    if runtime_name(text) == "ce" and role:
        from .edf.schema import source

        try:
            src = source(role, root) if role_source is None else role_source
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


class Located(NamedTuple):
    """What the login node found of the weights: the warnings and blockers of :func:`check`, and the
    snapshot that holds them (``None`` when nothing was found or nothing was looked for)."""

    warnings: list
    blockers: list
    snapshot: "Path | None" = None
    model: "str | None" = None
    where: str = ""  # INFERENCE_MODEL's file:line


def check(root: Path, env: Env, text: Mapping[str, str], environ: Mapping[str, str],
          cwd: Path | None = None) -> tuple[list[str], list[str]]:
    """(warnings, blockers) about the weights of ``INFERENCE_MODEL`` in the cache the job will read."""
    found = locate(root, env, text, environ, cwd)
    return found.warnings, found.blockers


def locate(root: Path, env: Env, text: Mapping[str, str], environ: Mapping[str, str],
           cwd: Path | None = None, *, role_source=None) -> Located:
    """:func:`check`'s findings, with the snapshot the job's cache holds. ``role_source``: the
    ``edf.RoleSource`` of CONTAINER_ROLE when the caller has read it (the dry run has), else read here."""
    if not enabled(text):
        return Located([], [])
    model_b = env.bindings.get("INFERENCE_MODEL")
    model = hub_id(text.get("INFERENCE_MODEL"), cwd)
    if model is None or model_b is None:
        return Located([], [])  # a local path, or a reference: the engine reports a missing folder itself
    key, edf_value, where = _cache_setting(env, text, root, role_source)
    if key is None:
        return Located([f"HF_HOME is {where}: the weights of {model} cannot be checked before submission (the job "
                        f"reads its environment's HF_HOME, else ~/.cache/huggingface); set HF_HOME in a layer, or "
                        f"{KEY}=0 when the weights come another way"], [])
    value = _expanded(env, key, edf_value, environ)
    if value is None:
        unset = _unset_names(env, key, edf_value, environ)
        named = " and ".join(f"${{{n}}}" for n in unset) or "a variable"
        export = f"export {' '.join(unset)}" if unset else "export it"
        return Located([f"{key} ({where}) reads {named}, which this shell does not set: the weights of {model} "
                        f"cannot be checked before submission; {export} here, or {KEY}=0 when the weights come "
                        "another way"], [])
    path = Path(value).expanduser()
    hub = path if key == "HF_HUB_CACHE" else path / "hub"
    try:
        snapshot = snapshot_with_weights(hub, model)
        if snapshot is not None:
            return Located([], [], snapshot, model, str(model_b.origin))
    except OSError as err:  # a shared cache this user cannot read: the check cannot say, the job may
        return Located([f"INFERENCE_MODEL ({model_b.origin}): cannot look for the weights of {model} in "
                        f"{key}={path} ({where}): {err.strerror or err}; fix the permissions, or set {KEY}=0 when "
                        "the job reads them another way"], [])
    download = f"{key}={shell.word(str(path))} hf download {shell.word(model)}"
    return Located([], [
        f"INFERENCE_MODEL ({model_b.origin}): the weights of {model} are not in the cache the job reads, "
        f"{key}={path} ({where}): no weight file (*.safetensors, *.bin, *.index.json) under "
        f"{repo_folder(hub, model)}/snapshots/; a download inside the job would keep every allocated GPU "
        f"idle. Download them first: `{download}` (older clients: `{key}={shell.word(str(path))} "
        f"huggingface-cli download {shell.word(model)}`), or set {KEY}=0 when they come another way"])


def _unset_names(env: Env, key: str, edf_value: str | None, environ: Mapping[str, str]) -> list[str]:
    """The variables the login shell leaves unset that :func:`_expanded` could not do without."""
    if edf_value is not None:
        from .edf.images import referenced_vars

        names = [n for n, has_default in referenced_vars(edf_value) if not has_default and n not in environ]
    else:
        from .layers import deferred_in

        names = [d.name for d in deferred_in(env.bindings[key].value) if d.op is None and d.name not in environ]
    return list(dict.fromkeys(names))


def _expanded(env: Env, key: str, edf_value: str | None, environ: Mapping[str, str]) -> str | None:
    if edf_value is not None:
        from .edf.images import expand_vars

        try:
            return expand_vars(edf_value, environ)
        except EnvLayersError:
            return None
    from .layers import expand

    return expand(env.bindings[key].value, environ)


# --------------------------------------------------------------------------- the weights' size and their fit

MEM_KEY = "GPU_MEM_GB"
GIB = 1 << 30
HEADROOM = 1.3
"""GPU memory the weights need, as a multiple of their size: the KV cache, activations and graphs need
the rest. The rule of thumb is 1.2-1.4x; 1.3 is its middle: under vLLM's default GPU_MEMORY_UTILIZATION
of 0.90 it leaves about a seventh of the engine's share of memory for the KV cache (at 1.2 a few long
requests fill it; 1.4 would turn away shapes that serve well)."""
_MAX_HEADER = 100 << 20  # a safetensors header is kilobytes to a few megabytes; anything larger is not one
# bytes per element of each safetensors dtype; a dtype not listed is sized by its data_offsets
DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
               "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1}
# config.json's dtype names -> bytes per parameter the engine loads them at
CONFIG_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


class Estimate(NamedTuple):
    """The weights' size in bytes and how it was found (``how``: words for a message)."""

    size: int
    how: str


def safetensors_header(path: Path) -> dict | None:
    """The JSON header of a safetensors file (8-byte little-endian length, then that much JSON); None when the
    file is not one (too short, a length past the bound, JSON that is not an object)."""
    import json

    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                return None
            n = int.from_bytes(raw, "little")
            if not 0 < n <= _MAX_HEADER:
                return None
            data = f.read(n)
    except OSError:
        return None
    if len(data) < n:
        return None
    try:
        header = json.loads(data)
    except ValueError:
        return None
    return header if isinstance(header, dict) else None


def _tensor_bytes(header: dict) -> dict[str, int] | None:
    """Bytes per dtype of the tensors a safetensors header lists; None when an entry is malformed."""
    out: dict[str, int] = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(t, dict):
            return None
        dtype, shape, offsets = t.get("dtype"), t.get("shape"), t.get("data_offsets")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            return None
        if dtype in DTYPE_BYTES:
            n = DTYPE_BYTES[dtype]
            for d in shape:
                n *= d
        elif isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets):
            n = offsets[1] - offsets[0]
        else:
            return None
        out[dtype] = out.get(dtype, 0) + n
    return out


def _config_dtype(snapshot: Path) -> str | None:
    import json

    try:
        config = json.loads((snapshot / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    dtype = config.get("torch_dtype") or config.get("dtype")  # transformers wrote torch_dtype, newer ones dtype
    return dtype if isinstance(dtype, str) else None


def _index_total(snapshot: Path) -> tuple[int, Path | None] | None:
    """metadata.total_size of the safetensors index, and the first shard it names (None: no usable index)."""
    import json

    indexes = sorted(snapshot.glob("*.safetensors.index.json"),
                     key=lambda p: (p.name != "model.safetensors.index.json", p.name))
    for index in indexes:
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
            total = data["metadata"]["total_size"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(total, int) and total > 0:
            weight_map = data.get("weight_map")
            shards = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
            return total, (snapshot / shards[0]) if shards else None
    return None


def estimate(snapshot: Path) -> Estimate | None:
    """The bytes the weights in ``snapshot`` take once loaded, or None when nothing there says.

    The safetensors index's ``metadata.total_size`` first, then the sum over the safetensors headers'
    tensors (shape x dtype), then the weight files' sizes (safetensors, else ``*.bin``). config.json's
    dtype cross-checks: 32-bit float weights of a model whose config says a 16-bit dtype are loaded at
    16 bits (the engines' ``--dtype auto``), so they count half."""
    config = _config_dtype(snapshot)
    width = CONFIG_DTYPE_BYTES.get((config or "").lower())
    shown = f"; config.json: {config}" if config else ""
    indexed = _index_total(snapshot)
    if indexed is not None:
        total, shard = indexed
        by_dtype = _tensor_bytes(safetensors_header(shard) or {}) if shard is not None else None
        if width == 2 and by_dtype and max(by_dtype, key=by_dtype.get) == "F32":
            return Estimate(total // 2, f"the safetensors index, F32 on disk loaded as {config}")
        return Estimate(total, f"the safetensors index{shown}")
    files = sorted(p for p in snapshot.glob("*.safetensors") if p.is_file())
    sizes: dict[str, int] = {}
    for f in files:
        header = safetensors_header(f)
        by_dtype = _tensor_bytes(header) if header is not None else None
        if by_dtype is None:
            sizes = {}
            break
        for dtype, n in by_dtype.items():
            sizes[dtype] = sizes.get(dtype, 0) + n
    if files and sizes:
        if width == 2 and "F32" in sizes:
            sizes["F32"] //= 2
            return Estimate(sum(sizes.values()), f"the safetensors headers, F32 loaded as {config}")
        return Estimate(sum(sizes.values()), f"the safetensors headers{shown}")
    for pattern in ("*.safetensors", "*.bin"):
        found = [p for p in snapshot.glob(pattern) if p.is_file()]
        if found:
            return Estimate(sum(p.stat().st_size for p in found), f"the sizes of the {pattern} files{shown}")
    return None


def gpu_mem_gib(env: Env, text: Mapping[str, str]) -> float | None:
    """``GPU_MEM_GB``: GiB of memory per GPU; absent or empty -> None (no fit check); else a positive number."""
    return keys.value(text, MEM_KEY)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def fit(found: Located, plan: Plan, env: Env, text: Mapping[str, str]) -> tuple[list[str], list[str], list[str]]:
    """(lines, warnings, blockers) of the weights against the GPU memory one instance of ``plan`` has.

    ``lines``: one ``weights: ...`` line for the plan and the dry run (the estimate and the verdict), or
    nothing when there is nothing to hold the weights against (no snapshot: :func:`locate` said why once;
    ``GPU_MEM_GB`` absent or empty)."""
    mem = gpu_mem_gib(env, text)
    if found.snapshot is None or mem is None:
        return [], [], []
    est = estimate(found.snapshot)
    if est is None:
        return [], [f"INFERENCE_MODEL ({found.where}): nothing in {found.snapshot} says how large the weights of "
                     f"{found.model} are (no safetensors index, header or weight file size): their fit to the GPUs' "
                     "memory is not checked"], []
    mem_b = mem * GIB
    b = env.bindings.get(MEM_KEY)
    mem_where = f"{MEM_KEY}={text.get(MEM_KEY, '').strip()} ({b.origin})" if b else MEM_KEY
    have = plan.world * mem_b
    need_gpus = int(-(-(est.size * HEADROOM) // mem_b))  # rounded up
    need_nodes = -(-need_gpus // plan.gpus_per_node)
    what = (f"the weights of {found.model} take {est.size:,} bytes ({_gib(est.size)}, from {est.how})")
    memory = (f"the {_gib(have)} of GPU memory one instance has (tp x pp = {plan.tp} x {plan.pp} GPU(s) x "
              f"{mem_where})")
    if est.size * HEADROOM <= have:
        line = (f"weights: {_gib(est.size)} ({est.how}) in {_gib(have)} of GPU memory per instance: fits with the "
                f"{HEADROOM}x headroom for the KV cache and activations")
        if plan.shape in ("pipeline", "ray") and need_nodes < plan.nodes:  # one instance on more nodes than it needs
            b_nodes = env.bindings.get("INFERENCE_NODES")
            said = f"INFERENCE_NODES={plan.nodes} ({b_nodes.origin})" if b_nodes else f"{plan.nodes} nodes"
            return [line], [f"INFERENCE_MODEL ({found.where}): {what} fit {need_nodes} node(s) of "
                            f"{plan.gpus_per_node} GPU(s) with the {HEADROOM}x headroom, and the plan spans {said}: "
                            f"{plan.nodes - need_nodes} node(s) more, billed, and every token crosses the nodes; "
                            f"unless the KV cache needs them, plan {need_nodes} (docs/topology.md)"], []
        return [line], [], []
    fix = _fix(plan, need_gpus, need_nodes)
    headroom = (f"with the {HEADROOM}x headroom for the KV cache and activations they need {need_gpus} GPU(s): "
                f"{need_nodes} node(s) of {plan.gpus_per_node}")
    if est.size <= have:
        return ([f"weights: {_gib(est.size)} ({est.how}) in {_gib(have)} of GPU memory per instance: fits, but "
                 f"without the {HEADROOM}x headroom"],
                [f"INFERENCE_MODEL ({found.where}): {what} fit {memory}, but not with room for the KV cache and "
                 f"activations: the server may not start, or serve few requests at once; {headroom}; {fix}"], [])
    return ([f"weights: {_gib(est.size)} ({est.how}) exceed the {_gib(have)} of GPU memory per instance"], [],
            [f"INFERENCE_MODEL ({found.where}): {what}, more than {memory}; the server would fail loading them after "
             f"the job waited in the queue; {headroom}; {fix}"])


def _fix(plan: Plan, gpus: int, nodes: int) -> str:
    if plan.shape in ("single", "pipeline", "ray"):
        if nodes == 1:
            return f"set TENSOR_PARALLEL_SIZE={plan.gpus_per_node} to use every GPU of the node"
        return (f"set INFERENCE_NODES={nodes} (in SERVE_ENV_FILE, pipeline parallelism follows: docs/topology.md)")
    if plan.shape == "replicas":
        return (f"a replica has one node: set INFERENCE_MODE= (empty) and INFERENCE_NODES={nodes} for one instance "
                f"across {nodes} nodes" if nodes > 1 else
                f"set TENSOR_PARALLEL_SIZE={plan.gpus_per_node} to use every GPU of the node")
    return (f"give each instance at least {gpus} GPU(s) (TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE), with fewer "
            "instances (NUMBER_OF_INSTANCES) or more nodes")
