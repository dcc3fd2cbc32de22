"""The option tables of the runtimes checked, not run, here: Apptainer's ``exec`` flags and Pyxis's srun
options, as their own source declares them (src/envlayers/data/apptainer-options.json and
pyxis-options.json, written by scripts/gen-runtime-options.py from a checkout of each project).

:func:`apptainer_problems` and :func:`pyxis_problems` read a rendered command line against them: an option
the project does not have, a value missing or given to a switch. Pure: the tables are package data.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Sequence


@lru_cache(maxsize=None)
def table(name: str) -> dict:
    """``apptainer`` or ``pyxis``: the table as generated (``source``: repository, commit, tag)."""
    return json.loads(resources.files("envlayers.data").joinpath(f"{name}-options.json").read_text(encoding="utf-8"))


def env_prefix(program: str = "apptainer") -> str:
    """The prefix under which a host variable passes into the container: ``APPTAINERENV_`` (Apptainer's own),
    ``SINGULARITYENV_`` for a ``singularity`` program (the legacy prefix Apptainer also reads, and
    SingularityCE's own)."""
    key = "LegacySingularityEnvPrefix" if program == "singularity" else "ApptainerEnvPrefix"
    return table("apptainer")["env_prefixes"][key]["value"]


def apptainer_problems(argv: Sequence[str]) -> list[str]:
    """What in ``apptainer exec [OPTIONS] IMAGE CMD...`` Apptainer's exec would not take; ``[]`` when fine.
    The options end at the first word that is neither an option nor an option's value (the image)."""
    words = list(argv)
    if len(words) < 2 or words[0] not in ("apptainer", "singularity") or words[1] != "exec":
        return [f"not an `apptainer exec` command: {' '.join(words[:2])}"]
    options = table("apptainer")["options"]
    by_short = {o["short"]: name for name, o in options.items() if o.get("short")}
    out = []
    i = 2
    while i < len(words) and words[i].startswith("-"):
        word = words[i]
        name, eq, value = word.partition("=")
        name = by_short.get(name, name)
        spec = options.get(name)
        if spec is None:
            out.append(f"{word}: apptainer exec has no such option")
        elif spec["takes_value"] and not eq:
            if i + 1 >= len(words):
                out.append(f"{word}: needs a value")
            i += 1
        elif not spec["takes_value"] and eq and value.lower() not in ("true", "false"):
            out.append(f"{word}: {name} is a switch and takes no value")
        i += 1
    if i >= len(words):
        out.append("no image after the options")
    return out


def pyxis_problems(argv: Sequence[str]) -> list[str]:
    """What among the ``--container-*`` options of an ``srun`` command Pyxis would not take; ``[]`` when fine."""
    options = table("pyxis")["options"]
    out = []
    words = list(argv)
    for i, word in enumerate(words):
        name, eq, _ = word.partition("=")
        if not (name.startswith("--container-") or name.startswith("--no-container-")):
            continue
        spec = options.get(name)
        if spec is None:
            out.append(f"{word}: pyxis has no such option")
        elif spec["takes_value"] and not eq and (i + 1 >= len(words) or words[i + 1].startswith("-")):
            out.append(f"{word}: needs a value ({spec['arg']})")
        elif not spec["takes_value"] and eq:
            out.append(f"{word}: {name} takes no value")
    return out
