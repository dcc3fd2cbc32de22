"""``CONTAINER_RUNTIME=docker``: the rank's engine command inside ``docker run`` on each node's own Docker
daemon. What podman does (:mod:`envlayers.runtimes.podman`: the pinned image loaded from shared storage,
values by name, the key never on a command line, one named container per rank, release stopping each on
its node), with Docker's spelling:

    docker run --rm --name envlayers-<job>-<rank> --network=host --ipc=host --entrypoint=
      --gpus all | --device /dev/kfd --device /dev/dri  -v <weights>:<weights>:ro --env NAME ... IMAGE <engine argv>

- ``--network=host`` on every shape: Docker publishes a port through its bridge and iptables, which HPC
  nodes often run without (``dockerd --bridge=none --iptables=false``); on the node's network the engine
  binds ``SERVER_HOST`` itself and the ranks meet at the first node's address, as without a container.
- ``--entrypoint=``: the image's entrypoint (vLLM's ``vllm serve``) is cleared; the launcher's command runs.
- GPUs: ``--gpus all`` on NVIDIA (the NVIDIA container toolkit's Docker integration), /dev/kfd and
  /dev/dri on AMD (AMD's ROCm container documentation), by ``GPU_VENDOR``; ``CONTAINER_GPU_DEVICES``
  (comma-separated ``--device`` values, or ``none``) overrides.
- No ``--replace`` in Docker: ranks.sh removes a container of the same name a killed run left first.

Pure, but for nothing: no process, no file.
"""

from __future__ import annotations

from .. import shell
from dataclasses import dataclass
from typing import Iterable, Mapping

from ..errors import EnvLayersError
from ..joblines import ERROR, STAGE
from ..rundir import rank_exit_name

AMD_DEVICES = ("/dev/kfd", "/dev/dri")


@dataclass(frozen=True)
class Settings:
    """What the login node decided: the pinned image, and the GPUs as ``--gpus all`` or ``--device`` values."""

    image: str
    devices: tuple[str, ...]  # ("gpus=all",) for --gpus all, else --device values; () for none


def settings(env: Mapping[str, str], role_image: str | None, vendor: str | None, where=lambda key: key) -> Settings:
    """The pinned image (podman's rules) and the GPUs: ``CONTAINER_GPU_DEVICES`` when set, else by vendor."""
    from .podman import DEVICES_KEY, settings as podman_settings

    s = podman_settings(env, role_image, None, where)
    if env.get(DEVICES_KEY) is not None:  # the site's own list (or none), read by podman's rules
        return Settings(s.image, s.devices)
    if vendor is None:
        raise EnvLayersError("GPU_VENDOR is not set; docker needs it for --gpus all or the ROCm devices",
                             where=where("CONTAINER_RUNTIME"), hint="the site file says GPU_VENDOR=amd or nvidia")
    return Settings(s.image, ("gpus=all",) if vendor == "nvidia" else AMD_DEVICES)


def run_argv(s: Settings, job_id: str, rank: int, env_names: Iterable[str], env: Mapping[str, str]) -> list[str]:
    """``docker run ...`` up to and including the image; the engine's argv follows it."""
    from .podman import SHM_KEY, container_name, volumes

    argv = ["docker", "run", "--rm", "--name", container_name(job_id, rank), "--network=host"]
    shm = (env.get(SHM_KEY) or "").strip()
    argv.append(f"--shm-size={shm}" if shm else "--ipc=host")
    argv.append("--entrypoint=")
    for d in s.devices:
        argv += ["--gpus", "all"] if d == "gpus=all" else ["--device", d]
    for v in volumes(env):
        argv += ["-v", v]
    for name in sorted(set(env_names)):
        argv += ["--env", name]
    return argv + [s.image]


def load_line(s: Settings, image_dir: str | None, job_id: str, rank: int) -> str:
    """Shell for ranks.sh: clear a container of this rank's name a killed run left, then load the image from
    its archive when the node's daemon lacks it, else stop the rank with an error naming both."""
    from .podman import archive_name, container_name

    q = shell.word
    fail = f'echo 2 > "$run_dir/{rank_exit_name(rank)}"; exit 2'
    clear = f"docker rm -f {q(container_name(job_id, rank))} >/dev/null 2>&1; "
    have = f"docker image inspect {q(s.image)} >/dev/null 2>&1"
    if not image_dir:
        return clear + (f"{have} || {{ echo {q(ERROR.line(f'rank {rank}: image {s.image} is not on this node and CONTAINER_IMAGE_DIR names no archive; run `env_layers images load` or set CONTAINER_IMAGE_DIR'))}; {fail}; }}")
    archive = f"{image_dir.rstrip('/')}/{archive_name(s.image)}"
    return clear + (f"{have} || {{ echo {q(STAGE.line(f'rank {rank}: loading {s.image} from {archive}'))}; "
                    f"docker load -i {q(archive)} >/dev/null; }} || {{ echo {q(ERROR.line(f'rank {rank}: cannot load {s.image} from {archive}; `env_layers images save` writes it'))}; {fail}; }}")


def rank_wrappers(keys: Mapping[str, str], plan, job_id: str, commands) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """Per rank (load line, ``docker run ... IMAGE``), and the lines the launcher prints about them."""
    from .podman import IMAGE_DIR_KEY, JOB_DEVICES, JOB_IMAGE, passed_names

    image = keys.get(JOB_IMAGE) or ""
    if not image:
        raise EnvLayersError("the job script set no ENVLAYERS_IMAGE for CONTAINER_RUNTIME=docker",
                             hint="submit with `env_layers serve` (cluster/serve-only.sbatch), which decides the image")
    s = Settings(image, tuple(d for d in (keys.get(JOB_DEVICES) or "").split(",") if d))
    out, lines = [], []
    for rank, cmd in enumerate(commands):
        words = run_argv(s, job_id, rank, passed_names(keys, cmd.env, cmd.key_env), keys)
        out.append((load_line(s, keys.get(IMAGE_DIR_KEY) or None, job_id, rank), words))
        lines.append(STAGE.line(f"rank {rank} runs in docker: {shell.words(words)} <the command above>"))
    return out, lines
