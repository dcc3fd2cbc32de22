"""The option tables of the runtimes checked, not run, here: Apptainer's ``exec`` flags and Pyxis's srun
options, as their own source declares them (src/envlayers/data/apptainer-options.json and
pyxis-options.json, written by scripts/gen-runtime-options.py from a checkout of each project; each names
the repository, commit and tag it was read from).

:func:`apptainer_problems` and :func:`pyxis_problems` read a rendered command line against them the way
the runtime's own parser would: an option the project does not have, a value missing, a value given to a
switch, a value its parser would refuse. Pure, stdlib only: the tables are package data.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources

PROGRAMS = ("apptainer", "singularity")


@lru_cache(maxsize=None)
def table(name: str) -> dict:
    """``apptainer`` or ``pyxis``: the table as generated (``source``: repository, commit, tag)."""
    return json.loads(resources.files("envlayers.data").joinpath(f"{name}-options.json").read_text(encoding="utf-8"))


def env_prefix(program: str = "apptainer") -> str:
    """The prefix under which a host variable passes into the container: ``APPTAINERENV_`` (Apptainer's own,
    ``ApptainerEnvPrefix``), ``SINGULARITYENV_`` for a ``singularity`` program (the legacy prefix Apptainer
    also reads, and SingularityCE's own)."""
    key = "legacy_env_prefix" if program == "singularity" else "env_prefix"
    return table("apptainer")[key]["value"]


def _value_problem(word: str, name: str, spec: dict, value: str) -> str | None:
    """What pflag would say about ``value`` for an option of ``spec``'s kind; None when it takes it."""
    kind = spec["kind"]
    if kind in ("int", "uint32") and not re.fullmatch(r"[0-9]+" if kind == "uint32" else r"[-+]?[0-9]+", value):
        return f"{word}: {name} takes a whole number, not {value!r}"
    if kind == "stringToString" and value and any("=" not in item for item in value.split(",")):
        return f"{word}: {name} takes NAME=VALUE[,NAME=VALUE...], not {value!r}"
    return None


def apptainer_problems(argv: list[str]) -> list[str]:
    """What in ``apptainer exec [OPTIONS] IMAGE CMD...`` Apptainer's exec would not take; ``[]`` when fine.

    The options end at the first word that is neither an option nor an option's value (the image), or after
    ``--``. Long options as ``--opt value`` or ``--opt=value``; short ones as ``-B value``, ``-Bvalue`` or
    ``-B=value``, switches grouped (``-ec``). A switch given ``=VALUE`` is refused unless VALUE is one of the
    spellings pflag reads as a boolean (the table's ``bool_values``); a deprecated option is reported with
    Apptainer's own advice."""
    words = list(argv)
    if len(words) < 2 or words[0] not in PROGRAMS or words[1] != "exec":
        return [f"not an `apptainer exec` command: {' '.join(words[:2])}"]
    data = table("apptainer")
    options = data["options"]
    bool_values = set(data["bool_values"]["values"])
    by_short = {o["short"]: name for name, o in options.items() if o.get("short")}
    out: list[str] = []
    taken: list[str] = []  # the last option that took the next word as its value, and that word

    def one(word: str, name: str, eq: bool, value: str, i: int) -> int:
        """Check option ``name`` (from ``word``); return how many following words it consumed."""
        spec = options.get(name)
        if spec is None:
            out.append(f"{word}: apptainer exec has no such option")
            return 0
        if spec.get("deprecated"):
            out.append(f"{word}: {name} is deprecated ({spec['deprecated']})")
        if not spec["takes_value"]:
            if eq and value not in bool_values:
                out.append(f"{word}: {name} is a switch and takes no value")
            return 0
        used = 0
        if not eq:
            if i + 1 >= len(words):
                out.append(f"{word}: needs a value, and no image follows")
                return 0
            value, used = words[i + 1], 1
            taken[:] = [word, value]
            if value.partition("=")[0] in options or value in by_short:
                out.append(f"{word}: needs a value; Apptainer would take the option {value} as it")
        problem = _value_problem(word, name, spec, value)
        if problem:
            out.append(problem)
        return used

    i = 2
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        word = words[i]
        taken.clear()
        if word == "--":
            i += 1
            break
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            i += 1 + one(word, name, bool(eq), value, i)
            continue
        # -abc: shorthands, each a switch until one takes a value (the rest of the word, or the next word)
        rest, used = word[1:], 0
        while rest:
            short, rest = "-" + rest[0], rest[1:]
            name = by_short.get(short)
            if name is None:
                out.append(f"{word}: apptainer exec has no option {short}")
                break
            if rest.startswith("="):
                one(word, name, True, rest[1:], i)
                break
            if options[name]["takes_value"] and rest:
                one(word, name, True, rest, i)
                break
            used = one(word, name, False, "", i)
        i += 1 + used
    if i >= len(words) and not (out and out[-1].endswith("no image follows")):
        hint = f" ({taken[1]} is the value of {taken[0]}: a value missing before it?)" if taken else ""
        out.append(f"no image after the options{hint}")
    return out


def pyxis_problems(argv: list[str]) -> list[str]:
    """What among the ``--container-*`` / ``--no-container-*`` options of an ``srun`` command Pyxis would not
    take; ``[]`` when fine: an option its table does not have, a value missing (the next word an option) or
    given to a switch, and both sides of one switch (``--container-entrypoint`` with
    ``--no-container-entrypoint``), which Pyxis refuses."""
    options = table("pyxis")["options"]
    out: list[str] = []
    words = list(argv)
    seen: dict[str, tuple[str, int]] = {}  # callback -> (the option that set it, its val)
    for i, word in enumerate(words):
        name, eq, _ = word.partition("=")
        if not (name.startswith("--container-") or name.startswith("--no-container-")):
            continue
        spec = options.get(name)
        if spec is None:
            out.append(f"{word}: pyxis has no such option")
            continue
        if spec["takes_value"] and not eq and (i + 1 >= len(words) or words[i + 1].startswith("-")):
            out.append(f"{word}: needs a value ({spec['arg']})")
        elif not spec["takes_value"] and eq:
            out.append(f"{word}: {name} takes no value")
        if not spec["takes_value"]:
            other = seen.setdefault(spec["callback"], (name, spec["val"]))
            if other[1] != spec["val"]:
                out.append(f"{word}: pyxis refuses both {other[0]} and {name}")
    return out
