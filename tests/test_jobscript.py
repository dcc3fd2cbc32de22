"""The serve-only job decided on the login node: golden job scripts and the checks before submission.

Regenerate the golden job scripts after an intended change:
    ENVLAYERS_REGEN_GOLDEN=1 python -m pytest tests/test_jobscript.py -k golden
"""

from __future__ import annotations

import difflib
import sys
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from envlayers.cli import cli
from envlayers.errors import EnvLayersError, TopologyError
from envlayers.jobscript import prepare, ready_timeout_s

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "jobs"
REGEN = os.environ.get("ENVLAYERS_REGEN_GOLDEN") == "1"
PY = "/usr/bin/python3"


@pytest.fixture
def edf_dir(tmp_path):
    d = tmp_path / "edf"
    d.mkdir()
    return {"EDF_PATH": str(d), "HOME": str(tmp_path)}


@pytest.mark.parametrize("model, experiment", [
    ("qwen38", "experiment"), ("glm53", "experiment"), ("kimi27sglang", "experiment"), ("oss120b", "experiment"),
    ("qwen38mi200", "experiment"), ("qwen38", "replicas"),
])
def test_golden_job_script(model, experiment, edf_dir):
    job = prepare(REPO, model, experiment, python=PY, environ=edf_dir)
    path = GOLDEN / f"{experiment}.{model}.sh"
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(job.script)
    assert path.is_file(), "missing golden; regenerate with ENVLAYERS_REGEN_GOLDEN=1"
    want = path.read_text()
    assert job.script == want, "".join(difflib.unified_diff(want.splitlines(True), job.script.splitlines(True),
                                                             "golden", "rendered now"))


def test_job_script_is_valid_bash(edf_dir):
    job = prepare(REPO, "glm53", python=PY, environ=edf_dir)
    proc = subprocess.run(["bash", "-n"], input=job.script, capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0, proc.stderr


def test_settings_table_of_the_seed(edf_dir):
    job = prepare(REPO, "glm53", python=PY, environ=edf_dir)
    lines = job.script.splitlines()
    for want in ("#SBATCH --partition=mi300", "#SBATCH --mem=0", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --ntasks-per-node=1", "#SBATCH --nodes=4", "ulimit -c 0"):
        assert want in lines
    assert not any(line.startswith("#SBATCH") and (" -A" in line or "--account" in line) for line in lines)
    assert job.sbatch_args == ["--nodes=4", "--time=04:00:00", "--partition=mi300", "--mem=0", "--gpus-per-node=4",
                               "--ntasks-per-node=1", "--exclusive"]


def test_pipeline_uses_the_fabric_edf_and_single_the_intranode_variant(edf_dir):
    assert prepare(REPO, "glm53", python=PY, environ=edf_dir).edf == "hpcagent-bench-sglang-mi300-latest"
    assert prepare(REPO, "qwen38", python=PY, environ=edf_dir).edf == "hpcagent-bench-sglang-mi300-latest-intranode"
    assert prepare(REPO, "qwen38", "replicas", python=PY, environ=edf_dir).edf.endswith("-intranode")


def test_missing_edf_blocks_a_real_submission(edf_dir):
    job = prepare(REPO, "qwen38", python=PY, environ=edf_dir)
    assert job.blockers and "is not installed" in job.blockers[0]


def test_serve_env_file_is_sourced_last(tmp_path, edf_dir):
    mine = tmp_path / "mine.env"
    mine.write_text("SERVER_PORT=9123\nAGENT_READY_TIMEOUT_SECONDS=60\n")
    job = prepare(REPO, "qwen38", env_file=mine, python=PY, environ=edf_dir)
    assert job.ready_timeout_s == 60 and "--port 9123" in job.rank_lines[0]
    assert "export SERVER_PORT='9123'\n" in job.script and "SERVER_PORT='8000'" not in job.script


def test_base_env_replaces_the_render(tmp_path, edf_dir):
    base = tmp_path / "base.env"
    base.write_text((REPO / "experiments/renders/.env.experiment.oss120b").read_text())
    job = prepare(REPO, "qwen38", base_env=base, python=PY, environ=edf_dir)
    assert "vllm serve openai/gpt-oss-120b" in job.rank_lines[0]


@pytest.mark.parametrize("env, want", [
    ({}, 7200), ({"VLLM_READY_TIMEOUT_SECONDS": "100"}, 100),
    ({"AGENT_READY_TIMEOUT_SECONDS": "50", "VLLM_READY_TIMEOUT_SECONDS": "100"}, 50),
    ({"AGENT_READY_TIMEOUT_SECONDS": "", "VLLM_READY_TIMEOUT_SECONDS": "100"}, 100),
    ({"AGENT_READY_TIMEOUT_SECONDS": "1"}, 1),
], ids=["default", "vllm-key", "agent-key-wins", "empty-agent-key-falls-through", "one-second-is-positive"])
def test_readiness_budget_precedence(env, want):
    assert ready_timeout_s(env) == want


def test_a_server_host_that_is_no_address_names_its_layer_line(tmp_path, edf_dir):
    mine = tmp_path / "mine.env"
    mine.write_text("CONTAINER_RUNTIME=none\nSERVER_HOST=nid_01\n")
    with pytest.raises(EnvLayersError) as err:
        prepare(REPO, "qwen38", env_file=mine, python=PY, environ=edf_dir)
    assert str(err.value).startswith(f"{mine}:2: SERVER_HOST: 'nid_01' is not an IP address or a host name")


def test_api_key_in_a_layer_is_refused(tmp_path, edf_dir):
    mine = tmp_path / "mine.env"
    mine.write_text("SERVER_API_KEY=s3cret\n")
    with pytest.raises(EnvLayersError) as err:
        prepare(REPO, "qwen38", env_file=mine, python=PY, environ=edf_dir)
    assert str(err.value).startswith(f"{mine}:1: SERVER_API_KEY in a layer would be written into the render")
    assert "s3cret" not in str(err.value)


def test_api_key_file_keeps_the_key_out_of_the_script(tmp_path, edf_dir):
    key = tmp_path / "key"
    key.write_text("s3cret-k3y\n")
    key.chmod(0o600)
    mine = tmp_path / "mine.env"
    mine.write_text(f"SERVER_API_KEY_FILE={key}\n")
    job = prepare(REPO, "qwen38", env_file=mine, python=PY, environ=edf_dir)
    assert "s3cret" not in job.script and "s3cret" not in job.dry_run_text()
    assert '--api-key' in job.rank_lines[0]


def test_wasted_gpus_are_refused_before_submission(tmp_path, edf_dir):
    mine = tmp_path / "mine.env"
    mine.write_text("INFERENCE_NODES=4\nNUMBER_OF_INSTANCES=1\nPIPELINE_PARALLEL_SIZE=1\nTENSOR_PARALLEL_SIZE=4\n"
                    "INFERENCE_MODE=pipeline\n")
    with pytest.raises(TopologyError) as err:
        prepare(REPO, "glm53", env_file=mine, python=PY, environ=edf_dir)
    assert "4 x 1 uses 4 GPU(s)" in str(err.value) and "12 GPU(s) would sit idle" in str(err.value)


def test_bad_time_is_refused(edf_dir):
    with pytest.raises(EnvLayersError) as err:
        prepare(REPO, "qwen38", time="4 hours", python=PY, environ=edf_dir)
    assert str(err.value).startswith("SERVE_TIME: time limit '4 hours' is not a Slurm time")


@pytest.mark.parametrize("value", [
    pytest.param("0", id="zero-minutes"),
    pytest.param("00:00:00", id="zero-hms"),
    pytest.param("0-0", id="zero-days-hours"),
    pytest.param("0:00", id="zero-mm-ss"),
])
def test_a_zero_time_limit_is_refused_as_no_limit(edf_dir, value):
    with pytest.raises(EnvLayersError) as err:
        prepare(REPO, "qwen38", time=value, python=PY, environ=edf_dir)
    text = str(err.value)
    assert text.startswith(f"SERVE_TIME: time limit {value!r} is 0, which Slurm reads as no limit at all; hint: ")
    assert "\n" not in text and "SERVE_TIME=08:00:00" in text


@pytest.mark.parametrize("value, refused", [
    pytest.param("99999999999", True, id="eleven-digit-minutes"),
    pytest.param("366-00:00:00", True, id="a-year-and-a-day"),
    pytest.param("525601", True, id="a-year-of-minutes-and-one"),
    pytest.param("365-00:00:00", False, id="a-year"),
    pytest.param("1", False, id="one-minute"),
])
def test_an_absurd_time_limit_is_refused_where_slurm_cannot_be_asked(edf_dir, value, refused):
    if not refused:
        job = prepare(REPO, "qwen38", time=value, python=PY, environ=edf_dir)
        assert f"--time={value}" in job.sbatch_args
        return
    with pytest.raises(EnvLayersError) as err:
        prepare(REPO, "qwen38", time=value, python=PY, environ=edf_dir)
    assert str(err.value).startswith(f"SERVE_TIME: time limit {value!r} is ")
    assert "more than the 365 days any endpoint job may ask for" in str(err.value)


def test_the_dry_run_refuses_a_zero_time_with_one_line_and_exit_2(edf_dir):
    res = CliRunner().invoke(cli, ["serve", "--model", "qwen38", "--dry-run"], env={**edf_dir, "SERVE_TIME": "0"})
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("env_layers: error: SERVE_TIME: time limit '0' is 0"), res.output


PARTITIONS = (
    "PartitionName=mi300 AllowGroups=ALL Default=YES QoS=N/A DefaultTime=NONE MaxNodes=UNLIMITED "
    "MaxTime=1-00:00:00 MinNodes=0 Nodes=n[1-3] State=UP TotalCPUs=24\n"
    "PartitionName=mi200 AllowGroups=ALL Default=NO QoS=N/A DefaultTime=NONE MaxNodes=UNLIMITED "
    "MaxTime=2-12:00:00 MinNodes=0 Nodes=n[1-3] State=UP TotalCPUs=24\n"
    "PartitionName=debug AllowGroups=ALL Default=NO MaxTime=UNLIMITED Nodes=n1 State=UP\n"
)


class Scontrol:
    """``scontrol show partition -o [NAME]`` as Slurm answers it (the runner slurm.py takes)."""

    def __init__(self, text: str = PARTITIONS, rc: int = 0, err: str = ""):
        self.text, self.rc, self.err, self.calls = text, rc, err, []

    def __call__(self, argv, **kw):
        self.calls.append(list(argv))
        if self.rc:
            return subprocess.CompletedProcess(argv, self.rc, "", self.err)
        assert argv[:4] == ["scontrol", "show", "partition", "-o"]
        lines = self.text.splitlines(keepends=True)
        if len(argv) > 4:
            lines = [ln for ln in lines if ln.startswith(f"PartitionName={argv[4]} ")]
            if not lines:
                return subprocess.CompletedProcess(argv, 1, "", f"Partition {argv[4]} not found\n")
        return subprocess.CompletedProcess(argv, 0, "".join(lines), "")


def _job(edf_dir, time: str, partition: str | None):
    from envlayers.jobscript import JobSubmission

    job = prepare(REPO, "qwen38", time=time, python=PY, environ=edf_dir)
    args = [a for a in job.sbatch_args if not a.startswith("--partition=")]
    if partition:
        args.append(f"--partition={partition}")
    return JobSubmission(job.target, args, job.script, job.plan, job.rank_lines, job.topology, job.edf,
                         job.ready_timeout_s)


@pytest.mark.parametrize("time, partition, environ, refused", [
    pytest.param("2-00:00:00", "mi300", {}, "partition mi300's MaxTime, 1-00:00:00", id="over-mi300"),
    pytest.param("1-00:00:00", "mi300", {}, None, id="at-mi300s-maxtime"),
    pytest.param("2-00:00:00", None, {}, "partition mi300's MaxTime, 1-00:00:00", id="default-partition"),
    pytest.param("2-00:00:00", None, {"SBATCH_PARTITION": "mi200"}, None, id="sbatch-partition-of-the-shell"),
    pytest.param("3-00:00:00", "mi300,mi200", {}, "the longest MaxTime of partitions mi200, mi300 (mi200), "
                 "2-12:00:00", id="a-list-over-the-longest"),
    pytest.param("2-00:00:00", "mi300,mi200", {}, None, id="a-list-within-the-longest"),
    pytest.param("300-00:00:00", "debug", {}, None, id="unlimited"),
    pytest.param("300-00:00:00", "nosuch", {}, None, id="unknown-partition-left-to-sbatch"),
])
def test_a_time_limit_past_the_partitions_maxtime_is_refused_before_submission(edf_dir, time, partition, environ,
                                                                               refused):
    from envlayers.jobscript import check_partition_time

    job = _job(edf_dir, time, partition)
    if refused is None:
        check_partition_time(job, environ, run=Scontrol())
        return
    with pytest.raises(EnvLayersError) as err:
        check_partition_time(job, environ, run=Scontrol())
    text = str(err.value)
    assert text.startswith(f"SERVE_TIME: time limit {time} is longer than {refused}; ")
    assert "hint: ask for at most SERVE_TIME=" in text and "sinfo -o '%P %l'" in text


@pytest.mark.parametrize("runner", [
    pytest.param(Scontrol(rc=1, err="slurm_load_partitions: Unable to contact slurm controller (connect failure)\n"),
                 id="controller-down"),
    pytest.param("missing", id="no-scontrol-on-path"),
])
def test_the_partition_check_stands_aside_when_slurm_cannot_be_asked(edf_dir, runner, monkeypatch):
    from envlayers import slurm
    from envlayers.jobscript import check_partition_time

    job = _job(edf_dir, "300-00:00:00", "mi300")
    if runner == "missing":
        monkeypatch.setenv("PATH", "/nonexistent")
        runner = slurm.run
    assert check_partition_time(job, {}, run=runner) is None  # nothing refused: sbatch has the last word


def test_unknown_runtime_is_refused(tmp_path, edf_dir):
    mine = tmp_path / "mine.env"
    mine.write_text("CONTAINER_RUNTIME=rkt\n")
    with pytest.raises(EnvLayersError) as err:
        prepare(REPO, "qwen38", env_file=mine, python=PY, environ=edf_dir)
    assert str(err.value).startswith(f"{mine}:1: CONTAINER_RUNTIME: unknown container runtime 'rkt' (valid: ce, none, "
                                     "podman, docker, apptainer, singularity, charliecloud, pyxis)")


def test_dry_run_through_the_sbatch_wrapper_prints_script_and_ranks(edf_dir):
    env = {**os.environ, **edf_dir, "SUBMIT": "0", "MODEL": "glm53", "SERVE_TIME": "08:00:00"}
    proc = subprocess.run([str(REPO / "cluster/serve-only.sbatch")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert ("sbatch --parsable --nodes=4 --time=08:00:00 --partition=mi300 --mem=0 --gpus-per-node=4 "
            "--ntasks-per-node=1 --exclusive <<'ENVLAYERS_JOB'\n#!/bin/bash\n") in out
    assert sum(1 for line in out.splitlines() if line.startswith("#   rank ")) == 4
    assert "--node-rank 3" in out and '--dist-init-addr "${ENVLAYERS_MASTER_ADDR}:29500"' in out


def test_dry_run_json(edf_dir, monkeypatch):
    import json

    for k, v in edf_dir.items():
        monkeypatch.setenv(k, v)
    result = CliRunner().invoke(cli, ["--root", str(REPO), "serve", "--dry-run", "--json", "--model", "oss120b"])
    data = json.loads(result.output)
    assert data["sbatch"][:4] == ["sbatch", "--parsable", "--nodes=1", "--time=04:00:00"]
    assert "--mem=0" in data["sbatch"] and "--partition=mi300" in data["sbatch"]
    assert data["edf"] == "hpcagent-bench-vllm-mi300-latest-intranode" and len(data["ranks"]) == 1


def test_real_submission_refused_when_the_edf_is_missing(edf_dir, monkeypatch):
    for k, v in edf_dir.items():
        monkeypatch.setenv(k, v)
    result = CliRunner().invoke(cli, ["--root", str(REPO), "serve", "--model", "qwen38"])
    assert result.exit_code == 2
    assert "is not installed" in result.output and "install-edfs" in result.output


# -- nothing a user typed runs as code ---------------------------------------------------------------

def _env_part(script: str) -> str:
    """The job script up to the end of its environment (`set +a`): what runs before the launcher."""
    head, sep, _ = script.partition("\nset +a\n")
    assert sep, "the job script has no `set +a`"
    return head + sep


def _run_env_part(script: str, tail: str, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "job-env.sh"
    path.write_text(_env_part(script) + tail)
    base = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1"}
    return subprocess.run(["bash", str(path)], env={**base, **env}, capture_output=True, text=True, timeout=30,
                          cwd=tmp_path)


@pytest.mark.parametrize("snippet, x", [
    pytest.param("{{ x }}", "a", id="bare-variable"),
    pytest.param("{{ x ~ '' }}", "a", id="bare-expression"),
    pytest.param("{{ x|sh ~ '' }}", "a", id="expression-on-a-quoted-value"),
    pytest.param("{{ 'text' }}", "a", id="constant"),
    pytest.param("{{ x|upper }}", "a", id="unknown-filter"),
    pytest.param("{{ y|sh }}", "a", id="value-not-given"),
    pytest.param("{{ x|sh(x) }}", "a", id="argument-to-a-plain-filter"),
    pytest.param("{{ x|heredoc }}", "a", id="heredoc-without-delimiter"),
    pytest.param("{{ x|heredoc(x) }}", "a", id="heredoc-holding-its-delimiter"),
    pytest.param("# {{ x|comment }}", "a\necho pwned", id="newline-in-comment"),
    pytest.param("# {{ x|comment }}", "a\recho", id="carriage-return-in-comment"),
    pytest.param("X={{ x|sh }}", "a\0b", id="nul-in-word"),
    pytest.param("{{ x|words }}", "echo pwned", id="text-as-words"),
    pytest.param("{{ x|code }}", "echo pwned", id="plain-text-as-code"),
    pytest.param("{{ x|num }}", "4", id="text-as-number"),
    pytest.param("{{ x|num }}", True, id="bool-as-number"),
    pytest.param("export {{ x|ident }}=1", "A;touch pwned", id="text-as-variable-name"),
    pytest.param("{{ x|sh }", "a", id="malformed-place"),
])
def test_the_template_refuses_text_outside_a_filter_or_unfit_for_it(snippet, x):
    from envlayers.jobscript import ScriptTextError
    from envlayers.scripttext import render_text

    with pytest.raises(ScriptTextError):
        render_text(snippet, x=x)


def test_a_value_that_looks_like_a_place_stays_text():
    from envlayers.scripttext import Code, render_text

    values = {"x": "{{ y|code }} $(touch pwned)", "y": Code("echo pwned"), "d": Code("EOF")}
    assert render_text("A={{ x|sh }}", **values) == "A='{{ y|code }} $(touch pwned)'"
    assert render_text("{{ x|heredoc(d) }}{{ d|code }}", **values) == "{{ y|code }} $(touch pwned)EOF"
    assert render_text("set -- {{ w|words }}", w=["a b", "$x", ""]) == "set -- 'a b' '$x' ''"


@pytest.mark.parametrize("name", ["serve-only.sh.j2", "ranks.sh.j2", "tunnel.sh.j2"])
def test_every_place_of_a_script_template_names_a_filter(name):
    import re

    from envlayers import scripttext

    text = (Path(scripttext.__file__).parent / "templates" / name).read_text()
    places = re.findall(r"\{\{(.*?)\}\}", text)
    assert places and all(re.fullmatch(r" [a-z_.]+\|(sh|dq|words|comment|num|ident|code|heredoc\(delimiter\)) ", p)
                          for p in places), places


def test_partition_with_a_newline_is_refused_with_file_line(tmp_path, edf_dir):
    mine = tmp_path / "mine.env"
    mine.write_text("A=1\nSLURM_PARTITION='mi300\necho pwned'\n")
    with pytest.raises(EnvLayersError) as err:
        prepare(REPO, "qwen38", env_file=mine, python=PY, environ=edf_dir)
    assert str(err.value).startswith(f"{mine}:2: SLURM_PARTITION: 'mi300\\necho pwned' is not a partition name")


def test_env_file_path_with_a_newline_never_reaches_the_script(tmp_path, edf_dir):
    bad = tmp_path / "x\ntouch pwned\n.env"
    bad.write_text("SERVER_PORT=9000\n")
    with pytest.raises(EnvLayersError, match="control character"):
        prepare(REPO, "qwen38", env_file=bad, python=PY, environ=edf_dir)


def test_python_path_and_keys_are_quoted(edf_dir):
    job = prepare(REPO, "qwen38", python="/opt/my python/bin/python3", environ=edf_dir)
    assert "exec '/opt/my python/bin/python3' -m envlayers launch" in job.script


def test_dry_run_comments_show_control_characters_escaped(tmp_path, edf_dir):
    mine = tmp_path / "mine.env"
    mine.write_text("TOOL_CALL_PARSER='a\necho pwned'\n")
    text = prepare(REPO, "oss120b", env_file=mine, python=PY, environ=edf_dir).dry_run_text()
    rank = [line for line in text.splitlines() if line.startswith("#   rank 0:")]
    assert rank and "a\\necho pwned" in rank[0]
    assert "\necho pwned" not in text.split("ENVLAYERS_JOB\n", 2)[-1]  # nothing after the script uncommented


# -- references the job's environment must provide ---------------------------------------------------

def test_dry_run_warns_about_each_reference_unset_here(tmp_path, edf_dir):
    mine = tmp_path / "mine.env"
    mine.write_text("HF_HOME=$MY_SCRATCH/hf\nA=${NOT_READ-$ALSO_NOT}\nB=$SLURM_JOB_ID\n")
    job = prepare(REPO, "qwen38", env_file=mine, python=PY, environ={**edf_dir, "PWD": "/x", "NOT_READ": ""})
    assert [w for w in job.warnings if "references" in w] == [
        f"HF_HOME ({mine}:1) references $MY_SCRATCH, which is not set here; the job stops before srun unless it "
        "is set there (export it before submitting, assign it in a layer, or write ${MY_SCRATCH-default})"]
    assert "# warning: HF_HOME" in job.dry_run_text()


@pytest.mark.parametrize("env, code, want", [
    pytest.param({}, 1, "ENVLAYERS-ERROR: HF_HOME ({mine}:1) references $MY_SCRATCH, which is not set in the "
                 "job; fix: export MY_SCRATCH", id="unset-ends-with-envlayers-error"),
    pytest.param({"MY_SCRATCH": "/s"}, 0, "HF_HOME=/s/hf", id="set-expands"),
    pytest.param({"MY_SCRATCH": ""}, 0, "HF_HOME=/hf", id="empty-is-set"),
])
def test_unbound_reference_is_an_envlayers_error_before_srun(tmp_path, edf_dir, env, code, want):
    mine = tmp_path / "mine.env"
    mine.write_text("HF_HOME=$MY_SCRATCH/hf\n")
    job = prepare(REPO, "qwen38", env_file=mine, python=PY, environ=edf_dir)
    proc = _run_env_part(job.script, 'echo "HF_HOME=$HF_HOME"\n', {"PWD": str(tmp_path), **env}, tmp_path)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert want.format(mine=mine) in proc.stdout
    assert "unbound variable" not in proc.stderr


def test_a_reference_inside_a_default_is_checked_only_when_read(tmp_path, edf_dir):
    job = prepare(REPO, "qwen38", python=PY, environ=edf_dir)  # RUN_ROOT="${SCRATCH:-${PWD}/runs}/..."
    tail = 'echo "RUN_ROOT=$RUN_ROOT"\n'
    assert _run_env_part(job.script, tail, {"SCRATCH": "/s"}, tmp_path).stdout.endswith(
        "RUN_ROOT=/s/inference-server\n")
    path = tmp_path / "no-pwd.sh"  # bash sets PWD itself; unset it to see the check fire
    path.write_text("unset PWD\n" + _env_part(job.script).replace("#!/bin/bash\n", "", 1))
    proc = subprocess.run(["bash", str(path)], env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "1",
                                                    "SLURM_JOB_NODELIST": "n1"}, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 1 and "ENVLAYERS-ERROR: RUN_ROOT (experiments/serve-only.env:" in proc.stdout


# -- the API key file --------------------------------------------------------------------------------

@pytest.mark.parametrize("content, mode, message", [
    pytest.param(None, 0o600, "the key file does not exist", id="missing"),
    pytest.param("", 0o600, "the key file is empty", id="empty"),
    pytest.param(" \n\t\n", 0o600, "the key file is empty", id="only-whitespace"),
    pytest.param("abc'def\\ghij\n", 0o600, "the key holds characters outside the safe set", id="quote-and-backslash"),
    pytest.param("short", 0o600, "the key is 5 characters long", id="too-short"),
])
def test_unusable_key_file_is_refused_before_submission(tmp_path, edf_dir, content, mode, message):
    key = tmp_path / "key"
    if content is not None:
        key.write_text(content)
        key.chmod(mode)
    mine = tmp_path / "mine.env"
    mine.write_text(f"A=1\nSERVER_API_KEY_FILE={key}\n")
    with pytest.raises(EnvLayersError) as err:
        prepare(REPO, "qwen38", env_file=mine, python=PY, environ=edf_dir)
    assert str(err.value).startswith(f"{mine}:2: SERVER_API_KEY_FILE {key}: {message}")
    assert "abc" not in str(err.value)


def test_key_file_readable_by_others_is_a_warning(tmp_path, edf_dir):
    key = tmp_path / "key"
    key.write_text("  k3y-0123456789abcdef  \n")
    key.chmod(0o644)
    mine = tmp_path / "mine.env"
    mine.write_text(f"SERVER_API_KEY_FILE={key}\n")
    job = prepare(REPO, "qwen38", env_file=mine, python=PY, environ=edf_dir)
    assert f"# warning: SERVER_API_KEY_FILE {key} is readable or writable by others (mode 0644); run `chmod 600 " \
           in job.dry_run_text()
    key.chmod(0o600)
    assert not [w for w in prepare(REPO, "qwen38", env_file=mine, python=PY, environ=edf_dir).warnings
                if "SERVER_API_KEY_FILE" in w]


def test_read_key_strips_surrounding_whitespace(tmp_path):
    from envlayers.apikey import read_key

    key = tmp_path / "key"
    key.write_text("\n  A-z0.9_~+/=k3y  \n")
    assert read_key(key) == "A-z0.9_~+/=k3y"


# -- the readiness budget ----------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["0", "-5", "00", "abc", "1.5", "\u00b2"],
                         ids=["zero", "negative", "zero-padded", "word", "fraction", "unicode-digit"])
def test_readiness_budget_must_be_a_positive_number(value):
    with pytest.raises(EnvLayersError) as err:
        ready_timeout_s({"AGENT_READY_TIMEOUT_SECONDS": value})
    assert str(err.value).startswith("AGENT_READY_TIMEOUT_SECONDS: must be a positive number of seconds")


def test_job_submission_plan_is_the_topology_plan(edf_dir):
    from envlayers.jobscript import JobSubmission
    from envlayers.topology import Plan

    job = prepare(REPO, "qwen38", python=PY, environ=edf_dir)
    assert type(job) is JobSubmission and isinstance(job.plan, Plan)


def test_job_submissions_of_the_same_target_are_equal(edf_dir):
    job, again = (prepare(REPO, "qwen38", python=PY, environ=edf_dir) for _ in range(2))
    assert job == again and job is not again and job != prepare(REPO, "oss120b", python=PY, environ=edf_dir)
    assert repr(job).startswith("JobSubmission(target='experiment:qwen38', sbatch_args=['--nodes=1'")
    with pytest.raises(AttributeError):  # frozen: what the dry run showed is what is submitted
        job.script = ""


@pytest.mark.parametrize("time, said", [
    pytest.param("4:00", "time limit SERVE_TIME=4:00 is 4 min (Slurm reads MM:SS as minutes and seconds: 4 h is "
                 "04:00:00), less than the 2 h the readiness budget gives the server to start (7200s)",
                 id="hours-meant-as-minutes-seconds"),
    pytest.param("1", "time limit SERVE_TIME=1 is 1 min, less than the 2 h", id="bare-minutes"),
    pytest.param("01:30:00", "time limit SERVE_TIME=01:30:00 is 1 h 30 min, less than the 2 h", id="hh-mm-ss"),
])
def test_a_time_limit_shorter_than_the_readiness_budget_is_said_in_words(edf_dir, time, said):
    job = prepare(REPO, "qwen38", python=PY, environ=edf_dir, time=time)
    (warning,) = [w for w in job.warnings if w.startswith("time limit")]
    assert warning.startswith(said) and "may end before it serves: ask for more, e.g. SERVE_TIME=08:00:00" in warning
    assert f"--time={time}" in job.sbatch_args  # a warning: the operator may mean it


@pytest.mark.parametrize("time", ["02:00:00", "08:00:00", "1-00:00:00", "120"])
def test_a_time_limit_that_covers_the_readiness_budget_says_nothing(edf_dir, time):
    job = prepare(REPO, "qwen38", python=PY, environ=edf_dir, time=time)
    assert not [w for w in job.warnings if w.startswith("time limit")]


def test_a_value_longer_than_linux_takes_for_one_environment_string_is_refused_naming_its_line(tmp_path, edf_dir):
    # before: it passed every check, then the job died with "Argument list too long ... free space there"
    mine = tmp_path / "mine.env"
    mine.write_text("MAX_MODEL_LEN=4096\nSERVER_EXTRA_ARGS='--x " + "a" * (128 * 1024) + "'\n")
    with pytest.raises(EnvLayersError) as err:
        prepare(REPO, "qwen38", env_file=mine, python=PY, environ=edf_dir)
    assert str(err.value).startswith(f"{mine}:2: SERVER_EXTRA_ARGS is 131095 bytes as an environment string, more "
                                     "than the 131072 Linux allows for one")
    assert str(err.value).endswith("; hint: keep long values in a file and name the file in the layer")


def test_a_long_extra_args_just_under_the_limit_is_checked_whole(tmp_path, edf_dir):
    # 12,000 flags (about 120 KB): every one is looked at, the owned one at the end too
    mine = tmp_path / "mine.env"
    flags = "".join(f"--x{i} a " for i in range(12000))
    mine.write_text(f"SERVER_EXTRA_ARGS='{flags}--port 9'\n")
    job = prepare(REPO, "qwen38", env_file=mine, python=PY, environ=edf_dir)
    assert [b for b in job.blockers if "--port is decided by SERVER_PORT" in b]
    assert len([w for w in job.warnings if "argument parser has no --x" in w]) == 12000


@pytest.mark.parametrize("line, said", [
    pytest.param("TENSOR_PARALEL_SIZE=2", "did you mean TENSOR_PARALLEL_SIZE?", id="typo"),
    pytest.param("MEM_FRACTION_STATC=0.8", "did you mean MEM_FRACTION_STATIC?", id="typo-sglang"),
    pytest.param("server_port=9000", "did you mean SERVER_PORT?", id="lower-case"),
    pytest.param("JUDGE_NODES=0", "docs/keys.md lists the launch keys", id="read-by-nothing"),
])
def test_a_key_nothing_reads_is_a_warning_naming_its_line_and_the_nearest_launch_key(tmp_path, edf_dir, line, said):
    mine = tmp_path / "mine.env"
    mine.write_text(line + "\n")
    job = prepare(REPO, "qwen38", env_file=mine, python=PY, environ=edf_dir)
    (warning,) = [w for w in job.warnings if w.startswith(f"{mine}:1: ")]
    assert warning == (f"{mine}:1: {line.split('=')[0]} is no launch key and nothing envlayers passes on knowingly: "
                       f"it is exported to the job, where nothing envlayers knows of reads it; {said}")


@pytest.mark.parametrize("line", ["VLLM_USE_V1=1", "NCCL_DEBUG=INFO", "HF_HUB_OFFLINE=1", "FI_CXI_RDZV_THRESHOLD=0",
                                  "TRITON_CACHE_DIR=/x", "TMPDIR=/x", "MIOPEN_USER_DB_PATH=/x"])
def test_what_the_engine_and_its_libraries_read_is_passed_on_without_a_word(tmp_path, edf_dir, line):
    mine = tmp_path / "mine.env"
    mine.write_text(line + "\n")
    job = prepare(REPO, "qwen38", env_file=mine, python=PY, environ=edf_dir)
    assert not [w for w in job.warnings if w.startswith(f"{mine}:1: ")]


def test_an_installed_edf_edited_since_its_render_and_a_missing_image_are_refused(tmp_path):
    from envlayers.edf import fetch_command
    from envlayers.edfinstall import install

    edf = tmp_path / "edf"
    environ = {"HOME": str(tmp_path), "EDF_PATH": str(edf), "SCRATCH": str(tmp_path / "s"), "CHECK_WEIGHTS": "0"}
    install(REPO, edf, environ=environ)
    image = tmp_path / "s" / "ce-images" / "sglang-rocm_v0.5.20-rocm724-mi30x-20260919.sqsh"
    job = prepare(REPO, "qwen38", python=PY, environ=environ)
    assert [b for b in job.blockers if "image" in b] == [
        f"the image of EDF hpcagent-bench-sglang-mi300-latest-intranode, {image}, is missing; every rank would fail "
        f"at its first srun: `{fetch_command('sglang-mi300', REPO)}` imports it"]
    image.parent.mkdir(parents=True)
    image.write_bytes(b"hsqs")
    assert prepare(REPO, "qwen38", python=PY, environ=environ).blockers == []
    toml = edf / "hpcagent-bench-sglang-mi300-latest-intranode.toml"
    toml.write_text(toml.read_text().replace("v0.5.20-rocm724-mi30x-20260919", "v0.5.19-rocm724"))
    (blocker,) = prepare(REPO, "qwen38", python=PY, environ=environ).blockers
    assert blocker.startswith(f"EDF hpcagent-bench-sglang-mi300-latest-intranode installed in {edf} is not what the "
                              "catalog renders (installed: 'image = ")
    assert "v0.5.19-rocm724" in blocker and "run `env_layers install-edfs`" in blocker


def test_a_serve_base_env_job_is_labelled_with_its_file_not_the_default_target(tmp_path, edf_dir):
    base = tmp_path / "mine-base.env"
    base.write_text("INFERENCE_ENGINE=vllm\nINFERENCE_MODEL=org/model\nVLLM_SERVED_MODEL=x\nCONTAINER_RUNTIME=none\n"
                    "SERVER_API_KEY_FILE=generate\n")
    job = prepare(REPO, "qwen38", base_env=base, python=PY, environ=edf_dir)
    assert job.target == "base-env:mine-base.env"
    assert "export ENVLAYERS_TARGET=base-env:mine-base.env\n" in job.script
    assert "qwen38" not in job.script


def test_an_edf_bind_whose_source_is_not_there_is_refused_with_the_mkdir(tmp_path):
    # a cache relocated by a symbolic link whose target is gone: install-edfs binds the link's target
    from envlayers.edfinstall import install

    scratch = tmp_path / "s"
    (scratch / "ce-images").mkdir(parents=True)
    (scratch / "ce-images" / "sglang-rocm_v0.5.20-rocm724-mi30x-20260919.sqsh").write_bytes(b"hsqs")
    (scratch / ".cache").mkdir()
    (scratch / ".cache" / "envlayers").symlink_to(tmp_path / "elsewhere" / "caches")  # not there
    edf = tmp_path / "edf"
    environ = {"HOME": str(tmp_path), "EDF_PATH": str(edf), "SCRATCH": str(scratch), "CHECK_WEIGHTS": "0"}
    install(REPO, edf, environ=environ)
    said = [b for b in prepare(REPO, "qwen38", python=PY, environ=environ).blockers if "binds" in b]
    assert said and all("which does not exist" in b and f"mkdir -p {tmp_path / 'elsewhere'}" in b for b in said), said
    for line in said:  # the printed command, as the operator would run it
        subprocess.run(["bash", "-c", line.rsplit(": ", 1)[1]], check=True, timeout=10)
    assert prepare(REPO, "qwen38", python=PY, environ=environ).blockers == []
