"""``CONTAINER_RUNTIME=podman``: the rank's engine command inside ``podman run``, and the image it needs.

The login node decides the image and the GPU devices (:func:`settings`: the image pinned, ``latest``
refused) and the job script hands them to the launcher (``ENVLAYERS_IMAGE``,
``ENVLAYERS_GPU_DEVICES``). In the job, ranks.sh loads the image from its archive on shared storage
when the node does not have it (:func:`load_line`: ``podman load -i``), then runs
:func:`run_argv` + the engine's argv, unchanged:

    podman run --rm --replace --name envlayers-<job>-<rank> --ipc=host --entrypoint=
      --publish <SERVER_HOST>:<port>:<port> --device <gpu> ... -v <weights>:<weights>:ro
      --env NAME ... IMAGE <engine argv>

A weights path that goes through a symbolic link is bound from its real path (runtimes/binds.py).
``--entrypoint=`` clears the image's entrypoint: the official vLLM image's is ``vllm serve``, which would
otherwise run in front of the launcher's own ``vllm serve MODEL ...`` (podman and docker both read an empty
--entrypoint as none).

On one node the engine binds 0.0.0.0 inside the container (what the publish needs, whatever SERVER_HOST
says); the node publishes the port where SERVER_HOST says, as the engine would bind it without a
container: every interface when it is absent, ``127.0.0.1`` for an endpoint reached on the node itself or
through ``env_layers tunnel``. A plan across nodes runs each node's container on the node's network
(``--network=host``, no publish): the ranks meet at the first node's address (NCCL, the engine's
rendezvous) as they would without a container, and the engine binds SERVER_HOST itself. Each rank's
container has its own name on its own node; release stops each on its node (:func:`stop_argv`).
Values reach the container by name (``--env NAME``: podman reads them from its own environment), so
the API key is never on podman's command line. Pure: no process, no file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from ..errors import EnvLayersError
from ..joblines import ERROR, STAGE
from ..rundir import rank_exit_name
from .. import shell

NVIDIA_DEVICES = ("nvidia.com/gpu=all",)  # podman's CDI name for every NVIDIA GPU of the node
AMD_DEVICES = ("/dev/kfd", "/dev/dri")  # the ROCm devices, as AMD's container docs pass them
IMAGE_KEY, DEVICES_KEY, IMAGE_DIR_KEY, SHM_KEY = ("CONTAINER_IMAGE", "CONTAINER_GPU_DEVICES", "CONTAINER_IMAGE_DIR",
                                                  "CONTAINER_SHM_SIZE")
_NOT_FILE = re.compile(r"[^A-Za-z0-9._-]+")
_DEVICE_RE = re.compile(r"[A-Za-z0-9._/=:-]+\Z")
_SHM_RE = re.compile(r"[0-9]+[bkmgBKMG]?\Z")


@dataclass(frozen=True)
class Settings:
    """What the login node decided: the pinned image and the GPU devices (empty: none)."""

    image: str
    devices: tuple[str, ...]


def container_name(job_id: str, rank: int) -> str:
    """The stable name of a rank's container: release and `podman stop` find it by this."""
    return f"envlayers-{job_id}-{rank}"


def archive_name(image: str) -> str:
    """The image's archive file name in CONTAINER_IMAGE_DIR (what `env_layers images save` writes)."""
    return _NOT_FILE.sub("_", image).strip("_") + ".tar"


def settings(env: Mapping[str, str], role_image: str | None = None, role_gpu: str | None = None,
             where=lambda key: key) -> Settings:
    """The image (``CONTAINER_IMAGE``, else the role's remote image) and the GPU devices
    (``CONTAINER_GPU_DEVICES``: comma-separated ``--device`` values or ``none``; else by the role's
    GPU vendor: ``rocm`` -> /dev/kfd and /dev/dri, otherwise NVIDIA's CDI name). ``where(key)``
    names a key's assignment (file:line) in errors."""
    from .images import unpinned

    image = (env.get(IMAGE_KEY) or role_image or "").strip()
    if not image:
        raise EnvLayersError(f"{IMAGE_KEY} is not set; podman needs the image to run", where=where("CONTAINER_RUNTIME"),
                             hint="a pinned reference, e.g. docker.io/vllm/vllm-openai:v0.11.0 or "
                                  "IMAGE@sha256:<digest>, or set CONTAINER_ROLE to use its image")
    why = unpinned(image)
    if why:
        raise EnvLayersError(f"image {image!r} {why}", where=where(IMAGE_KEY if env.get(IMAGE_KEY) else "CONTAINER_ROLE"),
                             hint="pin a release tag or a digest (IMAGE:TAG or IMAGE@sha256:<digest>): every node "
                                  "must run the same bytes")
    raw = env.get(DEVICES_KEY)
    if raw is None:
        devices = AMD_DEVICES if (role_gpu or "").startswith("rocm") else NVIDIA_DEVICES
    elif raw.strip() == "none":
        devices = ()
    else:
        devices = tuple(d.strip() for d in raw.split(",") if d.strip())
        bad = [d for d in devices if not _DEVICE_RE.match(d)]
        if bad or not devices:
            raise EnvLayersError(f"{DEVICES_KEY}={raw!r} is not a list of devices", where=where(DEVICES_KEY),
                                 hint="comma-separated podman --device values (nvidia.com/gpu=all, /dev/kfd,/dev/dri) "
                                      "or none")
    shm = env.get(SHM_KEY)
    if shm and not _SHM_RE.match(shm.strip()):
        raise EnvLayersError(f"{SHM_KEY}={shm!r} is not a size", where=where(SHM_KEY), hint="e.g. 64g (podman --shm-size)")
    return Settings(image, devices)


def mounts(env: Mapping[str, str]) -> tuple[str, ...]:
    """Host paths mounted read-only at the same path: the weights (HF_HOME; INFERENCE_MODEL when it
    is a path) and CONTAINER_MOUNTS (colon-separated absolute paths)."""
    out: list[str] = []
    for value in (env.get("HF_HOME"), env.get("INFERENCE_MODEL"), *(env.get("CONTAINER_MOUNTS") or "").split(":")):
        value = (value or "").strip()
        if value.startswith(("/", "${")) and value not in out:  # a reference: the job expands it
            out.append(value)
    return tuple(out)


def volumes(env: Mapping[str, str]) -> list[str]:
    """The ``-v`` values of :func:`mounts`: ``PATH:PATH:ro``, or ``REAL:PATH:ro`` when a symbolic link
    lies on PATH (a relocated cache), so the container sees the real folder where the variable says."""
    from .binds import real

    return [f"{real(m) or m}:{m}:ro" for m in mounts(env)]


def publish_host(env: Mapping[str, str]) -> str:
    """Where the node publishes the container's port: ``SERVER_HOST`` (absent: every interface), an IPv6
    address in brackets as podman's ``--publish`` wants it."""
    host = env.get("SERVER_HOST")
    host = "0.0.0.0" if host is None or not host.strip() else host.strip()
    return f"[{host}]" if ":" in host else host


def run_argv(s: Settings, job_id: str, rank: int, port: int, env_names: Iterable[str], env: Mapping[str, str],
             nodes: int = 1) -> list[str]:
    """``podman run ...`` up to and including the image; the engine's argv follows it. ``nodes``: the plan's
    (more than one: the node's network instead of a published port)."""
    argv = ["podman", "run", "--rm", "--replace", "--name", container_name(job_id, rank)]
    shm = (env.get(SHM_KEY) or "").strip()
    argv.append(f"--shm-size={shm}" if shm else "--ipc=host")
    argv.append("--entrypoint=")
    argv += ["--network=host"] if nodes > 1 else ["--publish", f"{publish_host(env)}:{port}:{port}"]
    for d in s.devices:
        argv += ["--device", d]
    for v in volumes(env):
        argv += ["-v", v]
    for name in sorted(set(env_names)):
        argv += ["--env", name]
    return argv + [s.image]


def load_line(s: Settings, image_dir: str | None, rank: int) -> str:
    """Shell for ranks.sh: load the image from its archive when the node lacks it, else stop the rank
    with an error naming both."""
    q = shell.word
    archive = f"{image_dir.rstrip('/')}/{archive_name(s.image)}" if image_dir else None
    fail = (f'echo 2 > "$run_dir/{rank_exit_name(rank)}"; exit 2')
    if archive is None:
        return (f"podman image exists {q(s.image)} || {{ echo {q(ERROR.line(f'rank {rank}: image {s.image} is not on this node and CONTAINER_IMAGE_DIR names no archive; run `env_layers images load` or set CONTAINER_IMAGE_DIR'))}; {fail}; }}")
    return (f"podman image exists {q(s.image)} || {{ echo {q(STAGE.line(f'rank {rank}: loading {s.image} from {archive}'))}; "
            f"podman load -i {q(archive)}; }} || {{ echo {q(ERROR.line(f'rank {rank}: cannot load {s.image} from {archive}; `env_layers images save` writes it'))}; {fail}; }}")


# -- in the job: what the launcher adds to each rank ---------------------------------------------

JOB_IMAGE, JOB_DEVICES = "ENVLAYERS_IMAGE", "ENVLAYERS_GPU_DEVICES"  # exported by the job script
# never handed to the container: the host's own paths and the key (the engine gets the key its own way)
_NOT_PASSED = frozenset({"PATH", "HOME", "HOSTNAME", "LD_LIBRARY_PATH", "PYTHONPATH", "TMPDIR", "SERVER_API_KEY"})


def from_job(keys: Mapping[str, str]) -> Settings:
    """The login node's decision, as the job script exported it."""
    image = keys.get(JOB_IMAGE) or ""
    if not image:
        raise EnvLayersError("the job script set no ENVLAYERS_IMAGE for CONTAINER_RUNTIME=podman",
                             hint="submit with `env_layers serve` (cluster/serve-only.sbatch), which decides the image")
    return Settings(image, tuple(d for d in (keys.get(JOB_DEVICES) or "").split(",") if d))


def passed_names(keys: Iterable[str], command_env: Iterable[str], key_env: str | None) -> list[str]:
    """The variables handed to the container by name: the launch keys, the command's own variables and
    the engine's key variable (vLLM's VLLM_API_KEY), never the host's paths or SERVER_API_KEY."""
    names = {k for k in keys if not k.startswith("ENVLAYERS_")} | set(command_env)
    if key_env:
        names.add(key_env)
    return sorted(n for n in names if n not in _NOT_PASSED)


def rank_wrappers(keys: Mapping[str, str], plan, job_id: str, commands) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """Per rank (load line, ``podman run ... IMAGE``), and the lines the launcher prints about them."""
    s = from_job(keys)
    ports = {r.rank: r.port for r in plan.ranks}
    out, lines = [], []
    for rank, cmd in enumerate(commands):
        port = ports.get(rank) or plan.api_port
        words = run_argv(s, job_id, rank, port, passed_names(keys, cmd.env, cmd.key_env), keys, plan.nodes)
        out.append((load_line(s, keys.get(IMAGE_DIR_KEY) or None, rank), words))
        lines.append(STAGE.line(f"rank {rank} runs in podman: {shell.words(words)} <the command above>"))
    return out, lines


# -- release: the argv that stops a rank's container by its stable name (access/release.py runs it) ------


def stop_argv(job_id: str, node: str, name: str, grace_s: int = 10, program: str = "podman") -> list[str]:
    """Stop one container on its node, as a step of the running job (for podman a missing one is not an
    error; docker's stop has no such switch)."""
    from .. import slurm

    if program == "docker":
        return slurm.overlap_step_argv(job_id, node, ["docker", "stop", "-t", str(grace_s), name])
    return slurm.overlap_step_argv(job_id, node, ["podman", "stop", "--ignore", "-t", str(grace_s), name])
