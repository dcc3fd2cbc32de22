"""``CONTAINER_RUNTIME=charliecloud``: the rank's engine command inside ``ch-run`` of an image directory
(or SquashFS file) on shared storage, unprivileged.

The login node decides the image (:func:`settings`) and checks what ``ch-run`` needs of it (:func:`missing`):
every bind destination and the four files ch-run binds from the host must exist in a directory image,
since a read-only image cannot grow a mount point at run time. In the job, ranks.sh runs :func:`prelude`
(the image must be there on the node) and then :func:`run_argv` + the engine's argv, unchanged:

    ch-run --unset-env=LD_LIBRARY_PATH --unset-env=PYTHONPATH ... --set-env -b REAL:PATH ... IMAGE -- <engine argv>

- ``ch-run`` runs the given command, never the image's entrypoint, so the official vLLM image's
  ``vllm serve`` does not run in front of the launcher's.
- The environment: ch-run passes the job's on (the launch keys, the engine's variables and the API key
  reach the engine by name, never on a command line); the host's library and Python paths are unset
  first, then ``--set-env`` sets the image's own (``/ch/environment``, which ``ch-convert`` writes from
  the image's ENV: its PATH, its PYTHONPATH).
- GPUs: ch-run keeps the node's /dev, so AMD's /dev/kfd and /dev/dri are there; NVIDIA's user-space
  libraries go into the image once, with ``ch-fromhost --nvidia IMAGE`` (Charliecloud's documented step).
- Network: the node's; every shape the engine's own rendezvous serves runs, on any number of nodes.

The image: ``CONTAINER_IMAGE`` when it is a path (a directory, or a ``.sqfs``/``.squashfs`` file), else the
pinned image (the role's, or ``CONTAINER_IMAGE``) as ``CONTAINER_IMAGE_DIR/<name>``, made once with
``ch-convert`` (:func:`convert_command`). Pure: no process, no file (:func:`missing` only looks).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from ..errors import EnvLayersError
from ..joblines import ERROR, STAGE
from ..rundir import rank_exit_name
from .. import shell

PROGRAM = "ch-run"
SQUASH_SUFFIXES = (".sqfs", ".squash", ".squashfs")
# host paths that would steer the engine's libraries or Python in the image: unset before the image's own
UNSET = ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE")
# ch-run binds these from the host over the image's: they must exist in it
HOST_FILES = ("/etc/passwd", "/etc/group", "/etc/hosts", "/etc/resolv.conf")


@dataclass(frozen=True)
class Settings:
    """What the login node decided: the image (a directory or a SquashFS file) and the pinned image it is
    made from ("" when CONTAINER_IMAGE names it)."""

    image: str
    source: str = ""


def image_name(image: str) -> str:
    """The directory name of a pinned image: ``vllm/vllm-openai:v0.28.0`` -> ``vllm_vllm-openai_v0.28.0``."""
    from .podman import archive_name

    return archive_name(image)[:-len(".tar")]


def convert_command(s: Settings) -> str:
    """The operator's step that makes the image directory from the pinned image (pulled with podman or docker)."""
    return f"ch-convert -i podman {s.source} {shell.word(s.image)}"


def settings(env: Mapping[str, str], role_image: str | None = None, where=lambda key: key) -> Settings:
    """The image from the keys; ``where(key)`` names a key's line (file:line) in errors."""
    from .images import shared_image

    return Settings(*shared_image(env, role_image, "ch-run", "an image directory", image_name, where))


def binds(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(host path, image path) of each bind: the weights and CONTAINER_MOUNTS, a link bound from its real folder."""
    from .binds import real
    from .podman import mounts

    return [(real(m) or m, m) for m in mounts(env)]


def missing(s: Settings, env: Mapping[str, str]) -> list[str]:
    """What a directory image lacks that ch-run needs: a bind destination, a file it binds from the host.
    Empty for a SquashFS file (its inside cannot be read here) and for an image that is not there."""
    if s.image.endswith(SQUASH_SUFFIXES) or not os.path.isdir(s.image):
        return []
    wanted = [dst for _, dst in binds(env)] + list(HOST_FILES)
    return [p for p in wanted if not os.path.lexists(os.path.join(s.image, p.lstrip("/")))]


def run_argv(s: Settings, env: Mapping[str, str]) -> list[str]:
    """``ch-run ... IMAGE --``; the engine's argv follows it."""
    argv = [PROGRAM, *(f"--unset-env={name}" for name in UNSET), "--set-env"]
    for src, dst in binds(env):
        argv.append(f"--bind={src}:{dst}")
    return argv + [s.image, "--"]


def prelude(s: Settings, rank: int) -> str:
    """Shell for ranks.sh: stop the rank in one line when the node cannot see the image; USER set for ch-run."""
    q = shell.word
    fail = f'echo 2 > "$run_dir/{rank_exit_name(rank)}"; exit 2'
    how = f"`{convert_command(s)}` makes it" if s.source else "CONTAINER_IMAGE names it"
    msg = q(ERROR.line(f"rank {rank}: the image {s.image} is not on this node; {how}"))
    # ch-run stops with "$USER not set" without it; a batch environment may lack it
    return f'[ -e {q(s.image)} ] || {{ echo {msg}; {fail}; }}; export USER="${{USER:-$(id -un)}}"'


# -- in the job: what the launcher adds to each rank ---------------------------------------------

def from_job(keys: Mapping[str, str]) -> Settings:
    """The login node's decision, as the job script exported it (ENVLAYERS_IMAGE: the image's path)."""
    from .podman import JOB_IMAGE

    image = keys.get(JOB_IMAGE) or ""
    if not image:
        raise EnvLayersError("the job script set no ENVLAYERS_IMAGE for CONTAINER_RUNTIME=charliecloud",
                             hint="submit with `env_layers serve` (cluster/serve-only.sbatch), which decides the image")
    return Settings(image)


def rank_wrappers(keys: Mapping[str, str], plan, commands) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """Per rank (prelude, ``ch-run ... IMAGE --``), and the lines the launcher prints about them."""
    s = from_job(keys)
    out, lines = [], []
    for rank, _ in enumerate(commands):
        words = run_argv(s, keys)
        out.append((prelude(s, rank), words))
        lines.append(STAGE.line(f"rank {rank} runs in charliecloud: {shell.words(words)} <the command above>"))
    return out, lines
