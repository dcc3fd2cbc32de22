"""Container runtimes: how one rank's engine command is wrapped (``CONTAINER_RUNTIME``).

- ``ce``: the CSCS Container Engine; srun starts the rank inside the EDF (``srun --environment``,
  ``slurm.ranks_step_argv``); the command itself is not wrapped.
- ``none``: the engine from the host's PATH; not wrapped.
- ``podman``: srun starts ranks.sh on the host, which runs the engine in ``podman run``
  (:mod:`envlayers.runtimes.podman`): the same Plan and engine command, only the wrapper differs.
- ``apptainer`` / ``singularity``: the same, in ``apptainer exec`` of a SIF file
  (:mod:`envlayers.runtimes.apptainer`).

Pure: :func:`wrapper` returns the words that go before the engine's argv, or None.
"""

from __future__ import annotations

from typing import Mapping


from ..errors import EnvLayersError

RUNTIMES = ("ce", "none", "podman", "apptainer", "singularity")
WRAPPED = ("podman", "apptainer", "singularity")  # srun starts ranks.sh on the host; a wrapper starts the engine
DEFAULT_RUNTIME = "ce"


def runtime_name(env: Mapping[str, str]) -> str:
    """``CONTAINER_RUNTIME`` (absent or empty: ce), checked."""
    value = (env.get("CONTAINER_RUNTIME") or DEFAULT_RUNTIME).strip()
    if value not in RUNTIMES:
        raise EnvLayersError(f"unknown container runtime {value!r} (valid: {', '.join(RUNTIMES)})",
                             where="CONTAINER_RUNTIME",
                             hint="ce runs the registered EDF; none runs the engine from the host's PATH; "
                                  "podman runs it in a pinned image (docs/podman.md); apptainer (or singularity) "
                                  "in a SIF file (docs/sites.md)")
    return value
