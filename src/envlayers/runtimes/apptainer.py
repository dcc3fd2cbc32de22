"""``CONTAINER_RUNTIME=apptainer`` (or ``singularity``): the rank's engine command inside ``apptainer exec``
of a SIF file on shared storage.

The login node decides the SIF file and the GPU flag (:func:`settings`), and the job script hands them to
the launcher (``ENVLAYERS_IMAGE``, ``ENVLAYERS_GPU_DEVICES``). In the job, ranks.sh runs
:func:`prelude` (the SIF must be readable on the node; each passed variable exported under Apptainer's
``APPTAINERENV_`` prefix, ``SINGULARITYENV_`` for ``singularity``) and then :func:`run_argv` + the engine's argv, unchanged:

    apptainer exec --cleanenv --nv --bind REAL:PATH:ro ... SIF <engine argv>

- ``exec`` runs the given command, never the image's runscript or entrypoint, so an image whose entrypoint
  already starts the server (vLLM's official one) does not start it twice.
- ``--cleanenv``: the host's environment stays out (a login shell's PYTHONPATH or a module's
  LD_LIBRARY_PATH would change the engine); what the engine needs is handed in by name through
  ``APPTAINERENV_<NAME>``, which Apptainer sets in the container even under ``--cleanenv``. The API key
  goes the same way, so it is never on a command line.
- ``--nv`` (NVIDIA) or ``--rocm`` (AMD) by ``GPU_VENDOR``; ``CONTAINER_GPU_DEVICES=none`` gives neither.
- Apptainer shares the node's network: the engine binds ``SERVER_HOST`` as it would without a container,
  so every shape the engine's own rendezvous serves runs, on any number of nodes.

The SIF comes from ``CONTAINER_IMAGE`` when that is a ``.sif`` path, else from the pinned image (the
role's, or ``CONTAINER_IMAGE``) as ``CONTAINER_IMAGE_DIR/<name>.sif``; pulling it is the operator's step
(:func:`pull_command`, ``env_layers images``). Pure: no process, no file.
"""

from __future__ import annotations

from .. import shell
from dataclasses import dataclass
from typing import Iterable, Mapping

from ..errors import EnvLayersError
from ..joblines import ERROR, STAGE
from ..rundir import rank_exit_name

COMMANDS = ("apptainer", "singularity")  # CONTAINER_RUNTIME's words for this runtime: the program it runs
# Apptainer sets NAME in the container from APPTAINERENV_NAME on the host (internal/pkg/util/env/env.go), also
# under --cleanenv; SINGULARITYENV_ is the legacy prefix it still reads, and SingularityCE's own
ENV_PREFIXES = {"apptainer": "APPTAINERENV_", "singularity": "SINGULARITYENV_"}
GPU_FLAGS = {"nvidia": "--nv", "amd": "--rocm"}
DEVICES_KEY = "CONTAINER_GPU_DEVICES"


@dataclass(frozen=True)
class Settings:
    """What the login node decided: the program, the SIF file, the GPU flag ("" for none)."""

    program: str
    sif: str
    gpu_flag: str
    image: str = ""  # the pinned image the SIF is pulled from ("" when CONTAINER_IMAGE names the SIF)


def sif_name(image: str) -> str:
    """The SIF file name of a pinned image: ``vllm/vllm-openai:v0.28.0`` -> ``vllm_vllm-openai_v0.28.0.sif``."""
    from .podman import archive_name

    return archive_name(image)[:-len(".tar")] + ".sif"


def pull_command(s: Settings) -> str:
    """The operator's step that makes the SIF from the pinned image (run where the registry is reachable)."""
    return f"{s.program} pull {shell.word(s.sif)} docker://{s.image}"


def settings(env: Mapping[str, str], program: str, role_image: str | None = None,
             where=lambda key: key) -> Settings:
    """The SIF and the GPU flag from the keys; ``where(key)`` names a key's line (file:line) in errors."""
    from .. import keys
    from .images import shared_image

    sif, image = shared_image(env, role_image, program, "a SIF file", sif_name, where)
    devices = (env.get(DEVICES_KEY) or "").strip()
    if devices == "none":
        flag = ""
    elif devices:
        raise EnvLayersError(f"{DEVICES_KEY}={devices!r}: {program} takes no device list", where=where(DEVICES_KEY),
                             hint="GPU_VENDOR picks --nv or --rocm; CONTAINER_GPU_DEVICES=none gives neither")
    else:
        vendor = keys.value(env, "GPU_VENDOR")
        if vendor is None:
            raise EnvLayersError(f"GPU_VENDOR is not set; {program} needs it for --nv or --rocm",
                                 where=where("CONTAINER_RUNTIME"), hint="the site file says GPU_VENDOR=amd or nvidia")
        flag = GPU_FLAGS[vendor]
    return Settings(program, sif, flag, image)


def run_argv(s: Settings, env: Mapping[str, str]) -> list[str]:
    """``apptainer exec ... SIF``; the engine's argv follows it."""
    from .podman import volumes

    argv = [s.program, "exec", "--cleanenv"]
    if s.gpu_flag:
        argv.append(s.gpu_flag)
    for v in volumes(env):
        argv += ["--bind", v]
    return argv + [s.sif]


def prelude(s: Settings, names: Iterable[str], rank: int) -> str:
    """Shell for ranks.sh, before the wrapped command: stop the rank in one line when the node cannot read
    the SIF, then hand each variable in by name (``APPTAINERENV_NAME="$NAME"``: the value never appears
    on a command line; an unset one stays unset)."""
    q = shell.word
    fail = f'echo 2 > "$run_dir/{rank_exit_name(rank)}"; exit 2'
    msg = q(ERROR.line(f"rank {rank}: cannot read {s.sif} on this node; "
            + (f"`{pull_command(s)}` makes it" if s.image else "`env_layers images` says how to make it")))
    lines = [f"[ -r {q(s.sif)} ] || {{ echo {msg}; {fail}; }}"]
    prefix = ENV_PREFIXES[s.program]
    lines += [f'[ -z "${{{n}+x}}" ] || export {prefix}{n}="${n}"' for n in sorted(set(names))]
    return "; ".join(lines)


# -- in the job: what the launcher adds to each rank ---------------------------------------------

def from_job(keys: Mapping[str, str]) -> Settings:
    """The login node's decision, as the job script exported it (ENVLAYERS_IMAGE: the SIF)."""
    from .podman import JOB_DEVICES, JOB_IMAGE

    program = (keys.get("CONTAINER_RUNTIME") or "").strip()
    sif = keys.get(JOB_IMAGE) or ""
    if program not in COMMANDS or not sif:
        raise EnvLayersError(f"the job script set no ENVLAYERS_IMAGE for CONTAINER_RUNTIME={program}",
                             hint="submit with `env_layers serve` (cluster/serve-only.sbatch), which decides the SIF")
    return Settings(program, sif, keys.get(JOB_DEVICES) or "")


def rank_wrappers(keys: Mapping[str, str], plan, commands) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """Per rank (prelude, ``apptainer exec ... SIF``), and the lines the launcher prints about them."""
    from .podman import passed_names

    s = from_job(keys)
    out, lines = [], []
    for rank, cmd in enumerate(commands):
        words = run_argv(s, keys)
        out.append((prelude(s, passed_names(keys, cmd.env, cmd.key_env), rank), words))
        lines.append(STAGE.line(f"rank {rank} runs in {s.program}: {shell.words(words)} <the command above>"))
    return out, lines
