"""`env_layers render` and the dry run import only what they use (docs/layers.md, "Start-up"): a command's
module is imported when that command runs, so a render never pays for the job script (its module and Jinja2),
the launcher, the engines' command lines, tomli-w, pathlib or json, and a dry run never for the run directory,
the router or the launcher. click, PyYAML, dataclasses and typing are used plainly and are not checked here.
A real process, so nothing this test run imported hides an import.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
NOT_FOR_A_RENDER = ("jinja2", "tomli_w", "envlayers.jobscript", "envlayers.scripttext", "envlayers.launch",
                    "envlayers.engines", "envlayers.edf", "envlayers.topology",
                    # the standard library a render has no use for: pathlib brings urllib.parse and ipaddress
                    "pathlib", "urllib", "json", "importlib.util", "importlib.metadata")
# (the run-directory module is imported: the job script takes the names of the run directory's files from it)
NOT_FOR_A_DRY_RUN = ("tomli_w", "envlayers.launch", "envlayers.engines.router",
                     "envlayers.ops", "envlayers.access", "envlayers.job", "envlayers.httpclient", "importlib.metadata")
# The probe prints the names of the modules the command added to those the interpreter started with,
# importing nothing itself. It runs without the site module (-S), the site-packages on its path instead: a
# .pth start-up hook there may import pathlib or json before any command, which would hide a command's own.
PROBE = """
import sys
before = set(sys.modules)
from envlayers.cli import main
try:
    main({argv!r})
except SystemExit as end:
    assert not end.code, end.code
print("MODULES " + " ".join(sorted(set(sys.modules) - before)), file=sys.stderr)
"""


def modules_of(argv: list[str]) -> set[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *site.getsitepackages()])}
    proc = subprocess.run([sys.executable, "-S", "-c", PROBE.format(argv=argv)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip(), "the command printed nothing"
    return set(proc.stderr.strip().splitlines()[-1].split()[1:])


def imported(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_a_render_imports_neither_the_job_script_nor_the_launcher_nor_jinja2_nor_pathlib():
    modules = modules_of(["render", "experiment:glm53"])
    assert "envlayers.layers" in modules and "click" in modules  # the probe did render
    assert imported(modules, NOT_FOR_A_RENDER) == []


def test_the_json_format_imports_json():  # the check above would pass if json were never imported at all
    assert "json" in modules_of(["render", "experiment:glm53", "--format", "json"])


def test_a_dry_run_imports_neither_the_router_nor_the_launcher():
    modules = modules_of(["serve", "--model", "glm53", "--dry-run"])
    assert "envlayers.jobscript" in modules and "jinja2" in modules  # the probe did a dry run
    assert imported(modules, NOT_FOR_A_DRY_RUN) == []



def _cache_of(tmp_path, tmpdir: Path) -> str:
    code = ("import envlayers.scripttext as t; c = t._ENV.bytecode_cache; "
            "print(c.directory if c is not None else 'none')")
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=True).stdout.strip()


def test_the_template_cache_is_a_folder_of_the_users_own_and_none_where_others_could_swap_it(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    assert _cache_of(tmp_path, mine) == str(mine / f"_jinja2-cache-{os.getuid()}")
    assert (mine / f"_jinja2-cache-{os.getuid()}").stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"  # everyone can write it and no sticky bit: another user could swap the folder
    shared.mkdir()
    shared.chmod(0o777)
    assert _cache_of(tmp_path, shared) == "none"
    linked = tmp_path / "linked"
    linked.mkdir(mode=0o700)
    (linked / f"_jinja2-cache-{os.getuid()}").symlink_to(mine)
    assert _cache_of(tmp_path, linked) == "none"


def test_a_dry_run_from_the_template_cache_is_the_same_bytes(tmp_path):
    mine = tmp_path / "tmp"
    mine.mkdir(mode=0o700)
    env = {**os.environ, "TMPDIR": str(mine), "CHECK_WEIGHTS": "0", "HOME": str(tmp_path),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    root = Path(__file__).resolve().parents[1]
    run = lambda: subprocess.run([sys.executable, "-m", "envlayers", "--root", str(root), "serve", "--model", "glm53",  # noqa: E731
                                  "--dry-run"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    first, second = run(), run()  # the first compiles the template and keeps it, the second reads it back
    assert list((mine / f"_jinja2-cache-{os.getuid()}").iterdir()), "nothing was cached"
    assert first.returncode == second.returncode and first.stdout == second.stdout and first.stdout
