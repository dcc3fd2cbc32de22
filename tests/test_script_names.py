"""The job's scripts (templates/*.j2) write run-directory files under the names rundir.py gives them:
the templates spell none of their own, and what real bash writes is what rundir's readers find."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from envlayers import engines, jobscript, rundir, scripttext
from envlayers.launch import ranks

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = Path(scripttext.__file__).parent / "templates"
OTHER = {"serve_env": "ENV.txt", "job_sh": "JOB.txt", "run_folder": "old.", "core_limit": "CORES.txt",
         "server_log": rundir.RankFile("LOG.", ".txt"), "rank_exit": rundir.RankFile("EXIT.", ".code"),
         "rank_signal": rundir.RankFile("SIG.", ".txt")}


def _spellings() -> list[str]:
    names = [rundir.SERVE_ENV, rundir.JOB_SH, rundir.CORE_LIMIT, rundir.ENDPOINT, rundir.LAUNCH, rundir.LAUNCH_END,
             rundir.CHAIN, rundir.ACCOUNTING, rundir.API_KEY, rundir.TUNNEL]
    names += [rundir.SERVER_LOG.prefix, rundir.RANK_EXIT.prefix, rundir.RANK_EXIT.suffix, rundir.RANK_SIGNAL.suffix]
    return [re.escape(n) for n in names] + [re.escape(rundir.RUN_FOLDER) + r"[$\[<]"]


def test_the_script_names_cover_every_name_the_templates_take():
    used = set()
    for path in TEMPLATES.glob("*.j2"):
        used |= set(re.findall(r"\bfiles\.([a-z_]+)", path.read_text()))
    assert used == set(rundir.SCRIPT_NAMES) == set(OTHER)


@pytest.mark.parametrize("name", sorted(p.name for p in TEMPLATES.glob("*.j2")))
def test_no_template_spells_a_run_directory_files_name(name):
    text = (TEMPLATES / name).read_text()
    found = [m.group(0) for m in re.finditer("|".join(_spellings()), text)]
    assert found == [], f"{name} spells {found}: pass the name from rundir.SCRIPT_NAMES (files.<name>)"


def test_the_spelling_check_sees_a_spelled_name():  # the test above can fail
    pattern = re.compile("|".join(_spellings()))
    assert pattern.search('log="$run_dir/server-${rank}.log"')
    assert pattern.search('mkdir -- "$RUN_DIR/run-$N"')
    assert not pattern.search('launch --run-dir "$RUN_DIR"')


def _run_rank(run_dir: Path) -> None:
    cmd = engines.RankCommand(argv=("bash", "-c", "echo serving; exit 7"))
    (run_dir / rundir.RANKS_SH).write_text(ranks.rank_script([cmd], run_dir))
    proc = subprocess.run(["bash", str(run_dir / rundir.RANKS_SH)], capture_output=True, text=True, timeout=20,
                          env={"SLURM_PROCID": "0", "PATH": os.environ["PATH"]}, cwd=run_dir)
    assert proc.returncode == 7, proc.stderr


def test_ranks_sh_writes_the_files_rundir_reads(tmp_path):
    _run_rank(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [rundir.RANKS_SH, rundir.server_log_name(0), rundir.rank_exit_name(0), rundir.CORE_LIMIT])
    files = rundir.JobFiles("7", None, tmp_path)
    assert files.rank_exits() == {0: 7} and list(files.server_logs()) == [0]
    assert "serving" in files.server_log(0).read_text()


def test_ranks_sh_takes_its_names_from_rundir(tmp_path, monkeypatch):
    monkeypatch.setattr(ranks, "SCRIPT_NAMES", OTHER)
    _run_rank(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [rundir.RANKS_SH, "LOG.0.txt", "EXIT.0.code", "CORES.txt"])
    assert (tmp_path / "EXIT.0.code").read_text() == "7\n"


def _job_script(tmp_path: Path) -> str:
    mine = tmp_path / "mine.env"
    mine.write_text("CONTAINER_RUNTIME=none\n")
    return jobscript.prepare(REPO, "qwen38", env_file=mine, python="python3",
                             environ={"EDF_PATH": str(tmp_path), "HOME": str(tmp_path)}).script


def _run_folder_block(script: str) -> str:
    """The job script's lines from the run folder's checks to the copies of serve.env and job.sh."""
    start = script.index("envlayers_unwritable() {\n")
    end = script.index('echo "ENVLAYERS-STAGE: run_dir=$RUN_DIR"\n')
    return "set -euo pipefail\nENVLAYERS_SERVE_ENV='X=1'\n" + script[start:end]


@pytest.mark.parametrize("names", [pytest.param(None, id="rundir"), pytest.param(OTHER, id="other-names")])
def test_the_job_script_writes_and_files_away_under_the_names_it_is_given(tmp_path, monkeypatch, names):
    if names is not None:
        monkeypatch.setattr(jobscript, "SCRIPT_NAMES", names)
    given = names or rundir.SCRIPT_NAMES
    run_dir = tmp_path / "7"
    run_dir.mkdir()
    (run_dir / "earlier.txt").write_text("old\n")
    script = _run_folder_block(_job_script(tmp_path))
    job = tmp_path / "job"
    job.write_text(script)
    proc = subprocess.run(["bash", str(job)], capture_output=True, text=True, timeout=10,
                          env={"PATH": os.environ["PATH"], "RUN_DIR": str(run_dir), "SLURM_JOB_ID": "7"})
    assert proc.returncode == 0, proc.stderr
    folder = given["run_folder"] + "0"
    assert sorted(p.name for p in run_dir.iterdir()) == sorted([folder, given["serve_env"], given["job_sh"]])
    assert (run_dir / given["serve_env"]).read_text() == "# site: mi300a\nX=1" and (run_dir / folder / "earlier.txt").is_file()
    if names is None:  # what the job script files away is what status reads as an earlier run
        assert rundir.earlier_run_dirs(run_dir) == {0: run_dir / folder}


@pytest.mark.parametrize("value", [
    pytest.param('$(touch CANARY) `touch CANARY` ${HOME} \\ " it\'s', id="expansions-and-quotes"),
    pytest.param("plain-name.txt", id="plain"),
])
def test_a_value_inside_double_quotes_stays_text(tmp_path, value):
    text = scripttext.render_text('printf "%s" "{{ v|dq }}"', v=value)
    proc = subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=10, cwd=tmp_path)
    assert proc.stdout == value and not (tmp_path / "CANARY").exists()


def test_a_nul_byte_cannot_go_inside_double_quotes():
    with pytest.raises(scripttext.ScriptTextError, match="NUL"):
        scripttext.render_text('"{{ v|dq }}"', v="a\0b")
