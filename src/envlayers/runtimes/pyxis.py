"""``CONTAINER_RUNTIME=pyxis``: the ranks' srun step itself runs in the container (Slurm's Pyxis plugin with
enroot), so the rank's command is not wrapped: as with the Container Engine, ranks.sh runs inside.

    srun ... --container-image=IMAGE --container-mounts=RUN_DIR:RUN_DIR,REAL:PATH:ro,...
         --container-env=NAME,... --no-container-entrypoint bash RUN_DIR/ranks.sh

- ``--container-image``: an enroot SquashFS file on shared storage (``CONTAINER_IMAGE`` as a ``.sqsh`` path,
  or the pinned image as ``CONTAINER_IMAGE_DIR/<name>.sqsh``, made once with :func:`import_command`), else
  the pinned reference itself, which every node then imports at every job start.
- ``--container-mounts``: the run directory (ranks.sh, its logs, the key file) read-write, the weights and
  ``CONTAINER_MOUNTS`` read-only at the same path.
- ``--container-env``: the launch keys and the engine's variables by name, so the job's values win over
  any the image's ENV sets; the values themselves (the API key among them) come from the job's
  environment, never a command line.
- ``--no-container-entrypoint``: the image's entrypoint (vLLM's official image: ``vllm serve``) is not run
  in front of ranks.sh.
- GPUs: enroot's hooks give the container the GPUs Slurm gave the step (NVIDIA's, through
  libnvidia-container); the network is the node's.

Pyxis cannot be installed where the suite runs: every option rendered here is checked against Pyxis's own
option table (:mod:`envlayers.runtimes.definitions`). Pure: no process, no file.
"""

from __future__ import annotations

from .. import shell
from dataclasses import dataclass
from typing import Iterable, Mapping

from ..errors import EnvLayersError

PLUGSTACK = ("/etc/slurm/plugstack.conf", "/etc/slurm/plugstack.conf.d")  # where a site enables Pyxis


@dataclass(frozen=True)
class Settings:
    """The image pyxis starts: a SquashFS path or a pinned reference, and the pinned image it comes from."""

    image: str
    source: str = ""


def sqsh_name(image: str) -> str:
    from .podman import archive_name

    return archive_name(image)[:-len(".tar")] + ".sqsh"


def import_command(s: Settings) -> str:
    """The operator's step that makes the SquashFS file from the pinned image."""
    return f"enroot import -o {shell.word(s.image)} docker://{s.source}"


def settings(env: Mapping[str, str], role_image: str | None = None, where=lambda key: key) -> Settings:
    """The image from the keys; without CONTAINER_IMAGE_DIR the pinned reference, which enroot imports."""
    from .images import shared_image

    return Settings(*shared_image(env, role_image, "pyxis", "an enroot SquashFS file", sqsh_name, where,
                                  folder_required=False))


def step_args(s: Settings, env: Mapping[str, str], run_dir: str, names: Iterable[str]) -> list[str]:
    """The ``--container-*`` options of the ranks' srun step."""
    from .binds import real
    from .podman import mounts

    binds = [f"{run_dir}:{run_dir}"] + [f"{real(m) or m}:{m}:ro" for m in mounts(env)]
    out = [f"--container-image={s.image}", f"--container-mounts={','.join(binds)}"]
    wanted = sorted(set(names))
    if wanted:
        out.append(f"--container-env={','.join(wanted)}")
    return out + ["--no-container-entrypoint"]


def passed(keys: Mapping[str, str], commands) -> list[str]:
    """The names whose job values must win over the image's: the launch keys and each command's own."""
    from .podman import passed_names

    out: set[str] = set()
    for cmd in commands:
        out.update(passed_names(keys, cmd.env, cmd.key_env))
    return sorted(out)


def plugin_enabled(read=None) -> bool:
    """Whether this host's Slurm loads Pyxis (a plugstack line naming spank_pyxis.so)."""
    import os

    def lines(path: str) -> list[str]:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                return fh.read().splitlines()
        except OSError:
            return []

    texts = []
    for path in PLUGSTACK:
        if os.path.isdir(path):
            texts += [line for f in sorted(os.listdir(path)) for line in lines(os.path.join(path, f))]
        else:
            texts += lines(path)
    return any("pyxis" in line and not line.lstrip().startswith("#") for line in texts)
