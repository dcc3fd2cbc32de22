"""Malformed catalog files: experiments/setups.yaml, containers/edfs/*.yaml and a diagnose rules file.

All three are read by one reader (envlayers.yamlpos), so each hostile input is tried on each file through
the command that reads it. Every case must end in one short error naming the file (and the line where
there is one), exit 2, quickly, without a traceback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from malformed_tools import REPO, assert_clean_error, run_cli
from timing import LATE_S  # how late a busy machine may run an event

# nested aliases: 330 bytes of YAML that expand to 9**7 strings when a value is printed in full
ALIAS_BOMB = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    "experiments: *g\nmodels: *g\n"
)
ALIAS_ONLY = "experiments: &x {}\nmodels: *x\n"
DEEP = "experiments: " + "[" * 20000 + "]" * 20000 + "\nmodels: {}\n"
NOT_UTF8 = b"experiments:\n  e:\n    description: caf\xe9\nmodels: {}\n"
LONG_KEY = "experiments:\n  e:\n    " + "k" * 200_000 + ": x\nmodels: {}\n"

EDF = "containers/edfs/vllm-mi300.yaml"
SETUPS = "experiments/setups.yaml"
RULES = "rules.yaml"


def _command(which: str, root: Path) -> list[str]:
    """The command that reads file `which` of the copy at `root`."""
    if which == SETUPS:
        return ["--root", str(root), "render", "experiment:glm53"]
    if which == EDF:
        return ["--root", str(root), "edf", "show", "vllm-mi300"]
    log = root / "server-0.log"
    log.write_text("nothing to see\n")
    return ["diagnose", "--rules", str(root / RULES), str(log)]


def _shown(which: str, root: Path) -> str:
    """How the error names the file."""
    return str(root / RULES) if which == RULES else which


FILES = [pytest.param(SETUPS, id="setups"), pytest.param(EDF, id="edf-source"), pytest.param(RULES, id="rules")]


@pytest.mark.parametrize("which", FILES)
@pytest.mark.parametrize("text, line, needle", [
    pytest.param(ALIAS_BOMB, 1, "anchor &a is not allowed", id="alias-bomb"),
    pytest.param(ALIAS_ONLY, 1, "anchor &x is not allowed", id="anchor-and-alias"),
    pytest.param("experiments: {}\nmodels: *nowhere\n", 2, "alias *nowhere is not allowed", id="bare-alias"),
    pytest.param(DEEP, 1, "nested more than 64 levels deep", id="deep-nesting"),
    pytest.param(NOT_UTF8, 3, "not UTF-8 (byte 0xe9", id="not-utf8"),
])
def test_hostile_yaml_is_refused_with_file_and_line(repo_copy, which, text, line, needle):
    path = repo_copy / which
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    t0 = time.monotonic()
    proc = run_cli(*_command(which, repo_copy), timeout_s=3 * LATE_S)
    assert time.monotonic() - t0 < LATE_S  # an expanded "billion laughs" would take far longer
    assert_clean_error(proc, f"{_shown(which, repo_copy)}:{line}: {needle}")
    assert proc.stdout == ""


@pytest.mark.parametrize("which", FILES)
def test_an_error_quoting_a_huge_value_stays_short(repo_copy, which):
    (repo_copy / which).write_text(LONG_KEY)
    proc = run_cli(*_command(which, repo_copy))
    assert_clean_error(proc, f"{_shown(which, repo_copy)}:")
    assert "k" * 1000 not in proc.stderr


@pytest.mark.parametrize("which", [pytest.param(EDF, id="edf-source"), pytest.param(RULES, id="rules")])
@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_catalog_file_that_is_not_a_regular_file(repo_copy, which, kind):
    path = repo_copy / which
    path.unlink(missing_ok=True)
    if kind == "directory":
        path.mkdir()
        needle = "is a directory, not a YAML file"
    else:
        os.mkfifo(path)  # reading it would block for ever
        needle = "is a FIFO, not a regular file"
    proc = run_cli(*_command(which, repo_copy), timeout_s=20)
    assert_clean_error(proc, f"{_shown(which, repo_copy)}: {needle}")


def _run_without_read_override(args: list[str]) -> subprocess.CompletedProcess:
    """run_cli, but as root without the capabilities that let root read any file."""
    env = {k: v for k, v in os.environ.items() if k != "ENVLAYERS_DEBUG"}
    prefix = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("root without setpriv: a mode-000 file stays readable")
        prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]
    return subprocess.run([*prefix, sys.executable, "-m", "envlayers", *args], env=env, capture_output=True,
                          text=True, timeout=30)


@pytest.mark.parametrize("which", FILES)
def test_an_unreadable_catalog_file(repo_copy, which):
    path = repo_copy / which
    if which == RULES:
        shutil.copy(REPO / "src" / "envlayers" / "data" / "known-issues.yaml", path)
    args = _command(which, repo_copy)
    path.chmod(0)
    try:
        proc = _run_without_read_override(args)
    finally:
        path.chmod(0o644)
    assert_clean_error(proc, f"{_shown(which, repo_copy)}: cannot read: Permission denied")


@pytest.mark.parametrize("args", [
    pytest.param(["list"], id="list"), pytest.param(["render", "experiment:qwen38"], id="render"),
    pytest.param(["serve", "--model", "qwen38", "--dry-run"], id="serve-dry-run"),
])
def test_a_description_nested_50000_deep_fails_at_once_naming_its_line(repo_copy, args):
    """100 KB of `description: [[[...]]]`: refused by the depth bound before a parser runs (the parser is
    never given it: tests/test_yamlpos.py), so every command that reads the catalog ends with one line."""
    setups = repo_copy / SETUPS
    text = setups.read_text()
    old = "    description: serve-only endpoint, one server (or one multi-node server) per job\n"
    assert old in text
    setups.write_text(text.replace(old, "    description: " + "[" * 50_000 + "]" * 50_000 + "\n"))
    line = text[:text.index(old)].count("\n") + 1
    proc = run_cli("--root", str(repo_copy), *args, env={"SERVE_ENV_FILE": "", "SERVE_BASE_ENV": ""})
    assert_clean_error(proc, f"{SETUPS}:{line}: nested more than 64 levels deep; hint: flatten the document")
