"""Container runtimes: how one rank's engine command is wrapped (``CONTAINER_RUNTIME``).

- ``ce``: the CSCS Container Engine; srun starts the rank inside the EDF (``srun --environment``,
  ``slurm.ranks_step_argv``); the command itself is not wrapped.
- ``none``: the engine from the host's PATH; not wrapped.
- ``podman``: srun starts ranks.sh on the host, which runs the engine in ``podman run``
  (:mod:`envlayers.runtimes.podman`): the same Plan and engine command, only the wrapper differs.
- ``docker``: the same, in ``docker run`` on each node's own daemon (:mod:`envlayers.runtimes.docker`).
- ``apptainer`` / ``singularity``: the same, in ``apptainer exec`` of a SIF file
  (:mod:`envlayers.runtimes.apptainer`).
- ``charliecloud``: the same, in ``ch-run`` of an image directory (:mod:`envlayers.runtimes.charliecloud`).
- ``pyxis``: like ``ce``, the ranks' srun step runs in the container (``--container-image=...``,
  :mod:`envlayers.runtimes.pyxis`); the command itself is not wrapped.

Pure: :func:`rank_wrappers` gives, per rank, the words that go before the engine's argv (None for a runtime
that wraps nothing), and :func:`image_step` where a job's image is and the command that puts it there.
"""

from __future__ import annotations

from typing import Mapping


from .. import keys as keytable
from ..errors import EnvLayersError

RUNTIMES = keytable.allowed("CONTAINER_RUNTIME")  # the keys table declares them
WRAPPED = ("podman", "docker", "apptainer", "singularity", "charliecloud")  # srun starts ranks.sh; a wrapper the engine
PROGRAMS = {"podman": "podman", "docker": "docker", "apptainer": "apptainer", "singularity": "singularity",
            "charliecloud": "ch-run"}
DEFAULT_RUNTIME = keytable.BY_NAME["CONTAINER_RUNTIME"].default


def runtime_name(env: Mapping[str, str]) -> str:
    """``CONTAINER_RUNTIME`` as the keys table says: absent -> ce, empty -> an error, else one of its words."""
    value = keytable.value(env, "CONTAINER_RUNTIME").strip()
    if value not in RUNTIMES:
        origin = getattr(env, "origins", {}).get("CONTAINER_RUNTIME")  # keys.Located: the line that set it
        raise EnvLayersError(f"unknown container runtime {value!r} (valid: {', '.join(RUNTIMES)})",
                             where=f"{origin}: CONTAINER_RUNTIME" if origin else "CONTAINER_RUNTIME",
                             hint=keytable.BY_NAME["CONTAINER_RUNTIME"].hint)
    return value


def rank_wrappers(runtime: str, keys: Mapping[str, str], plan, job_id: str, commands):
    """In the job: per rank (a shell line run first, the words before the engine's argv), the lines the
    launcher prints about them, and the containers release stops by name (podman's only); None for a
    runtime that wraps nothing (``ce``, ``none``)."""
    if runtime == "podman":
        from .podman import container_name, rank_wrappers as podman_wrappers

        wrappers, lines = podman_wrappers(keys, plan, job_id, commands)
        return wrappers, lines, [container_name(job_id, rank) for rank in range(len(wrappers))]
    if runtime == "docker":
        from . import docker
        from .podman import container_name

        wrappers, lines = docker.rank_wrappers(keys, plan, job_id, commands)
        return wrappers, lines, [container_name(job_id, rank) for rank in range(len(wrappers))]
    if runtime in ("apptainer", "singularity"):
        from . import apptainer

        return (*apptainer.rank_wrappers(keys, plan, commands), [])
    if runtime == "charliecloud":
        from . import charliecloud

        return (*charliecloud.rank_wrappers(keys, plan, commands), [])
    return None


def image_step(runtime: str, env: Mapping[str, str], role_image: str) -> tuple[str | None, str | None]:
    """For a wrapping runtime or pyxis: where the job looks for ``role_image`` (a path; None for a node's own
    image store) and the operator's command that puts it there (None when the job needs no step). ``env``:
    the site's keys (CONTAINER_IMAGE_DIR, GPU_VENDOR), references expanded. Raises EnvLayersError as the dry
    run would (no image folder where one is needed)."""
    folder = (env.get("CONTAINER_IMAGE_DIR") or "").strip()
    keys = {k: v for k, v in env.items() if k != "CONTAINER_IMAGE"}  # the role's image, not a job's override
    if runtime in ("podman", "docker"):
        from .podman import archive_name

        if not folder:
            return None, f"{runtime} pull {role_image} on every node"
        return f"{folder.rstrip('/')}/{archive_name(role_image)}", f"env_layers images save {role_image} --to {folder}"
    if runtime in ("apptainer", "singularity"):
        from . import apptainer

        s = apptainer.settings({**keys, "CONTAINER_GPU_DEVICES": "none"}, runtime, role_image)
        return s.sif, apptainer.pull_command(s)
    if runtime == "charliecloud":
        from . import charliecloud

        s = charliecloud.settings(keys, role_image)
        return s.image, f"podman pull {role_image} && {charliecloud.convert_command(s)}"
    if runtime == "pyxis":
        from . import pyxis

        s = pyxis.settings(keys, role_image)
        return (s.image, pyxis.import_command(s)) if s.image != role_image else (None, None)
    return None, None
