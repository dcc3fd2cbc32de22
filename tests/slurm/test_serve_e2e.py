"""The serve-only launcher end to end on the real local Slurm cluster (cluster/slurm-lab).

The one stand-in is the engine (tests/standin): the real rendered command lines run unchanged
with CONTAINER_RUNTIME=none, and the stand-in prints the engines' startup lines and serves the
OpenAI API on the address and port the command line asks for.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from timing import LATE_S  # how late a busy machine may run an event
from labruns import BANNER, KEYLESS, REPO, SBATCH, Run, curl
from nettools import free_port

pytestmark = pytest.mark.slurm


def test_single_node_endpoint_answers_the_printed_curl_and_scancel_leaves_nothing(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, SERVE_TIME="00:10:00")
    dry = run.sbatch(submit=False).stdout
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    # the dry run printed the very script Slurm received
    submitted = netns_lab.run(["scontrol", "write", "batch_script", run.job_id, "-"]).stdout
    script = dry.split("<<'ENVLAYERS_JOB'\n", 1)[1].split("\nENVLAYERS_JOB\n", 1)[0] + "\n"
    assert submitted == script
    assert (run.run_dir / "job.sh").read_text() == script
    # the block, and a curl that works once the node name is replaced by its address (the host
    # cannot resolve lab node names)
    assert "base URL: http://n1:8000/v1\nserved name: hpcagent-bench-vllm (what clients pass as model)\n" in text
    assert f"stop: env_layers stop {run.job_id} " in text
    assert "ENVLAYERS-WARN: readiness budget 7200s exceeds the allocation; clamping to" in text
    printed = text.split("try (curl):\n", 1)[1].splitlines()[0].strip()
    pasted = printed.replace("http://n1:", f"http://{netns_lab.nodes['n1']}:")
    answer = json.loads(subprocess.run(["bash", "-c", pasted], capture_output=True, text=True, timeout=20).stdout)
    assert answer["model"] == "hpcagent-bench-vllm" and answer["choices"][0]["message"]["content"]
    ep = run.endpoint()  # the default: a per-job key, which the printed curl read from its file
    assert ep["addresses"] == [netns_lab.nodes["n1"]] and ep["api_key_required"] is True
    assert ep["api_key_file"] == str(run.run_dir / "api-key")
    assert f"API key: required (the key in {run.run_dir / 'api-key'};" in text
    assert curl(f"http://{ep['addresses'][0]}:8000/v1/models").stdout.endswith("\n401")  # no key, no answer
    assert (run.run_dir / "serve.env").read_text().startswith("# site: mi300a\nexport VLLM_SERVED_MODEL='hpcagent-bench-vllm'")
    assert "model id: Qwen/Qwen3.8-27B-FP8 (sglang, single)\nsite: mi300a\n" in text
    assert (run.run_dir / "core-limit.txt").read_text() == "rank=0 limit=0\n"
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
    run.assert_nothing_left()
    assert curl(f"http://{ep['addresses'][0]}:8000/v1/models", timeout_s=2).stdout.endswith("\n000")


def test_two_node_pipeline_only_rank0_listens(netns_lab, tmp_path):
    # glm53 scaled from 4 to 2 nodes
    run = Run(netns_lab, tmp_path, model="glm53", layer=KEYLESS + "INFERENCE_NODES=2\nPIPELINE_PARALLEL_SIZE=2\n")
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    assert "ENVLAYERS-TOPOLOGY: shape=pipeline nodes=2 gpus_per_node=4 tp=4 pp=2 world=8 api_rank=0" in text
    assert "--nnodes 2 --node-rank 1 --dist-init-addr n1:29500" in text
    assert "--attention-backend" not in text  # glm53 assigns it empty
    n1, n2 = netns_lab.nodes["n1"], netns_lab.nodes["n2"]
    assert curl(f"http://{n1}:8000/v1/models").stdout.endswith("\n200")
    assert curl(f"http://{n2}:8000/v1/models", timeout_s=2).stdout.endswith("\n000")
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
    run.assert_nothing_left()  # the worker rank has no port to probe: its pid must be gone


def test_data_parallel_on_two_nodes_answers_curl_and_the_openai_client_on_node_zero_only(netns_lab, tmp_path):
    # oss20bdp: 8 vLLM data-parallel instances of tp=1 on 2 nodes, one endpoint on node 0 (docs/topology.md)
    run = Run(netns_lab, tmp_path, model="oss20bdp",
              layer=KEYLESS + "SERVER_EXTRA_ARGS='--api-server-count 2 --enforce-eager'\n")
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    assert ("ENVLAYERS-TOPOLOGY: shape=data-parallel nodes=2 gpus_per_node=4 tp=1 pp=1 world=1 instances=8 "
            "instances_per_node=4 api_rank=0 port=8000") in text
    rank1 = next(line for line in text.splitlines() if line.startswith("ENVLAYERS-STAGE: rank 1 on n2: "))
    assert ("--headless --data-parallel-size 8 --data-parallel-start-rank 4 --data-parallel-size-local 4 "
            "--data-parallel-address n1 --data-parallel-rpc-port 13345") in rank1
    assert "--api-server-count" not in rank1 and rank1.endswith("--enforce-eager")
    assert "VLLM_ALLREDUCE_USE_SYMM_MEM=0" in rank1
    assert "base URL: http://n1:8000/v1\n" in text and "http://n2:8000" not in text
    n1, n2 = netns_lab.nodes["n1"], netns_lab.nodes["n2"]
    reply = curl(f"http://{n1}:8000/v1/chat/completions", {"model": "hpcagent-bench-vllm",
                                                          "messages": [{"role": "user", "content": "hi"}]})
    assert reply.stdout.endswith("\n200"), reply.stdout
    # the official client, on the base URL the block printed (lab node names do not resolve here)
    import openai  # the test extra

    base = re.search(r"^base URL: (\S+)$", text, re.M).group(1)
    served = re.search(r"^served name: (\S+)", text, re.M).group(1)
    client = openai.OpenAI(base_url=base.replace("http://n1:", f"http://{n1}:"), api_key="EMPTY", max_retries=0,
                           timeout=20)
    assert [m.id for m in client.models.list()] == [served] == ["hpcagent-bench-vllm"]
    answer = client.chat.completions.create(model=served, max_tokens=32,
                                            messages=[{"role": "user", "content": "Say hi."}])
    assert answer.model == served and answer.choices[0].message.content
    assert curl(f"http://{n2}:8000/v1/models", timeout_s=2).stdout.endswith("\n000")  # headless: no server
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
    run.assert_nothing_left()


def test_a_rendezvous_port_in_use_on_the_head_node_moves_to_the_next_free_one(netns_lab, tmp_path):
    from labtools import lab_command

    status = lab_command("status", env={"ENVLAYERS_LAB_DIR": str(netns_lab.lab_dir)}).stdout
    ns = next(re.search(r"netns=(\S+)", line).group(1) for line in status.splitlines()
              if line.startswith("node: name=n1 "))
    holder = subprocess.Popen(["ip", "netns", "exec", ns, "python3", "-c",
                               "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 29500)); s.listen(); "
                               "print('held', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        run = Run(netns_lab, tmp_path, model="glm53", layer="INFERENCE_NODES=2\nPIPELINE_PARALLEL_SIZE=2\n")
        run.submit()
        text = run.wait_for("^" + re.escape(BANNER), timeout_s=60)
        assert ("ENVLAYERS-TOPOLOGY: rdzv_port=29501 (RDZV_PORT=29500 is in use on the head node; the first free "
                "port above it)") in text
        assert "ENVLAYERS-TOPOLOGY: rendezvous=rank0 rdzv_port=29501" in text
        assert "--nnodes 2 --node-rank 1 --dist-init-addr n1:29501" in text
        netns_lab.cancel(run.job_id)
        assert run.state() == "CANCELLED"
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_a_loopback_server_goes_live_on_node_0s_loopback_and_no_other_address(netns_lab, tmp_path):
    from labtools import lab_command

    status = lab_command("status", env={"ENVLAYERS_LAB_DIR": str(netns_lab.lab_dir)}).stdout
    ns = next(re.search(r"netns=(\S+)", line).group(1) for line in status.splitlines()
              if line.startswith("node: name=n1 "))
    # port 8100: the podman test's CNI portmap rule (127.0.0.1:8000 -> its container) stays in n1's namespace
    # after that container is gone, and would take this test's probes (docs/podman.md, "Known limits")
    run = Run(netns_lab, tmp_path, model="oss120b", layer="SERVER_HOST=127.0.0.1\nSERVER_PORT=8100\n")
    assert "would refuse" not in run.sbatch(submit=False).stdout
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    assert "base URL: http://127.0.0.1:8100/v1" in text
    assert (f"reach: on n1 only (SERVER_HOST binds loopback); from elsewhere open a tunnel: env_layers tunnel "
            f"{run.job_id} (docs/access.md)") in text
    assert run.endpoint()["node_local"] is True
    key = (run.run_dir / "api-key").read_text().strip()
    on_node = subprocess.run(["ip", "netns", "exec", ns, "curl", "-s", "-m", "5", "-H", f"Authorization: Bearer {key}",
                              "http://127.0.0.1:8100/v1/models"], capture_output=True, text=True, timeout=30)
    assert json.loads(on_node.stdout)["data"][0]["id"] == "hpcagent-bench-vllm", on_node.stdout + on_node.stderr
    outside = subprocess.run(["curl", "-s", "-m", "3", "-o", "/dev/null", "-w", "%{http_code}",
                              f"http://{netns_lab.nodes['n1']}:8100/v1/models"], capture_output=True, text=True,
                             timeout=10)
    assert outside.stdout == "000"  # nothing answers on the node's fabric address
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"


def test_loopback_replicas_on_two_nodes_are_refused_before_submission(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, model="oss120b", layer="SERVER_HOST=127.0.0.1\nINFERENCE_NODES=2\n",
              EXPERIMENT="replicas")
    proc = subprocess.run([str(SBATCH)], cwd=run.dir, env=dict(run.env, SUBMIT="1"), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and "the server binds loopback only (SERVER_HOST=127.0.0.1)" in proc.stderr, proc.stderr
    assert netns_lab.run(["squeue", "-h", "-o", "%i"]).stdout.strip() == ""


def test_replicas_on_two_nodes_list_two_endpoints_that_both_answer(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, EXPERIMENT="replicas", layer=KEYLESS)
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    assert "base URL: http://n1:8000/v1\nbase URL: http://n2:8000/v1\n" in text
    assert run.endpoint()["addresses"] == [netns_lab.nodes["n1"], netns_lab.nodes["n2"]]
    for addr in run.endpoint()["addresses"]:
        reply = curl(f"http://{addr}:8000/v1/chat/completions", {"model": "hpcagent-bench-vllm",
                                                 "messages": [{"role": "user", "content": "hi"}]})
        assert reply.stdout.endswith("\n200"), reply.stdout
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"


def test_a_rank_that_crashes_during_load_ends_the_job_within_10s(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, model="glm53", layer="INFERENCE_NODES=2\nPIPELINE_PARALLEL_SIZE=2\n",
              STANDIN_LOAD_SECONDS="3", STANDIN_CRASH_AT="weights", STANDIN_EXIT_CODE="3", STANDIN_RANKS="1")
    run.submit()
    assert run.state(timeout_s=40) == "FAILED"
    text = run.out.read_text()
    assert "ENVLAYERS-ERROR: rank 1 on n2 exited with code 3 before the endpoint was live" in text
    assert "injected crash at phase 'weights'" in text  # the tail of the crashed rank's log
    crashed_at = (run.run_dir / "rank-1.exit").stat().st_mtime
    ended_at = time.mktime(time.strptime(netns_lab.job_info(run.job_id)["EndTime"], "%Y-%m-%dT%H:%M:%S"))
    assert ended_at - crashed_at < 10
    run.assert_nothing_left()


def test_readiness_timeout_ends_the_job_with_an_error_not_at_walltime(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, layer="AGENT_READY_TIMEOUT_SECONDS=3\n", STANDIN_HANG_AT="weights",
              SERVE_TIME="00:05:00")
    run.submit()
    assert run.state(timeout_s=40) == "FAILED"
    text = run.out.read_text()
    assert ("ENVLAYERS-ERROR: endpoint not live after 3s (readiness budget): 0 of 1 answered; last probe of "
            "rank 0: no answer: [Errno 111] Connection refused") in text
    assert "Load weight begin" in text  # where it hung, from the rank-0 log tail


def test_api_key_from_a_file_is_enforced_and_never_logged(netns_lab, tmp_path):
    key = "k3y-" + os.urandom(6).hex()
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    run = Run(netns_lab, tmp_path, layer=f"SERVER_API_KEY_FILE={key_file}\n")
    dry = run.sbatch(submit=False).stdout
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    assert f"API key: required (the key in {key_file};" in text
    # the printed curl works as pasted (it reads the key file) once the node name is the address
    printed = text.split("try (curl):\n", 1)[1].splitlines()[0].strip().replace("http://n1:", f"http://{netns_lab.nodes['n1']}:")
    answer = subprocess.run(["bash", "-c", printed], capture_output=True, text=True, timeout=20)
    assert json.loads(answer.stdout)["choices"][0]["message"]["content"], answer.stdout
    url = f"http://{netns_lab.nodes['n1']}:8000/v1/models"
    assert curl(url).stdout.endswith("\n401")
    authorized = subprocess.run(["curl", "-s", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}", "-H",
                                 f"Authorization: Bearer {key}", url], capture_output=True, text=True, timeout=10)
    assert authorized.stdout == "200"
    netns_lab.cancel(run.job_id)
    run.state()
    logs = [dry, run.out.read_text(), *(p.read_text(errors="replace") for p in run.run_dir.iterdir() if p.is_file())]
    assert not any(key in text for text in logs)
    # SGLang dumps its arguments, the key among them; the job masks it on the way to the log
    assert "api_key='***'" in (run.run_dir / "server-0.log").read_text()
    assert "ENVLAYERS-WARN: SGLang takes the API key only on its command line" in run.out.read_text()


def test_vllm_reads_the_key_from_its_environment_never_from_its_command_line(netns_lab, tmp_path):
    key = "k3y-" + os.urandom(6).hex()
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    run = Run(netns_lab, tmp_path, model="oss120b", layer=f"SERVER_API_KEY_FILE={key_file}\n")
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    url = f"http://{netns_lab.nodes['n1']}:8000/v1/models"
    assert curl(url).stdout.endswith("\n401")
    record = json.loads((tmp_path / "engines.jsonl").read_text().splitlines()[0])
    assert key not in " ".join(record["orig_argv"]) and "--api-key" not in record["argv"]
    assert "VLLM_API_KEY=*** vllm serve" in text.replace("'", "")
    assert "SGLang takes the API key" not in text
    netns_lab.cancel(run.job_id)
    run.state()
    assert not any(key in p.read_text(errors="replace") for p in run.run_dir.iterdir() if p.is_file())


def test_an_empty_key_file_ends_the_job_with_an_error_naming_it(netns_lab, tmp_path):
    key_file = tmp_path / "api-key"
    key_file.write_text("")
    key_file.chmod(0o600)
    # emptied after the login node's checks, while the job waits (held), as a file changed between
    # submission and start would be
    key_file.write_text("a-usable-key-1234\n")
    run = Run(netns_lab, tmp_path, layer=f"SERVER_API_KEY_FILE={key_file}\n", SBATCH_HOLD="1")
    run.submit()
    key_file.write_text("")
    netns_lab.run(["scontrol", "release", run.job_id])
    assert run.state(timeout_s=40) == "FAILED"
    text = run.out.read_text()
    assert f"ENVLAYERS-ERROR: SERVER_API_KEY_FILE {key_file}: the key file is empty" in text
    assert "unbound variable" not in text and "starting 1 rank(s)" not in text
    end = json.loads((run.run_dir / "launch-end.json").read_text())
    assert end["code"] == 1 and end["reason"].startswith(f"SERVER_API_KEY_FILE {key_file}: the key file is empty")


def test_a_rank_slurm_never_places_fails_within_the_rank_start_budget(netns_lab, tmp_path):
    # an srun that starts only rank 0, as when Slurm cannot place the rest of the step
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "srun").write_text('#!/bin/bash\nSLURM_PROCID=0 exec bash "${@: -1}"\n')
    (shim / "srun").chmod(0o755)
    run = Run(netns_lab, tmp_path, model="glm53",
              layer="INFERENCE_NODES=2\nPIPELINE_PARALLEL_SIZE=2\nENVLAYERS_RANK_START_TIMEOUT=3\n",
              STANDIN_LOAD_SECONDS="60")
    run.env["PATH"] = f"{shim}:{run.env['PATH']}"
    run.submit()
    assert run.state(timeout_s=40) == "FAILED"
    text = run.out.read_text()
    assert "ENVLAYERS-ERROR: only 1 of 2 ranks started within 3s (missing: 1)" in text
    # what Slurm says, before the error: the missing rank's node, the job's steps (the shim started none),
    # and each node's state as scontrol shows it
    diag = [line for line in text.splitlines() if line.startswith("ENVLAYERS-DIAG: ")]
    assert diag[0] == "ENVLAYERS-DIAG: ranks missing: rank 1 (planned on n2)", text
    assert f"ENVLAYERS-DIAG: steps of job {run.job_id}: Slurm lists no server step" in text
    assert re.search(r"^ENVLAYERS-DIAG: node n1: (ALLOCATED|MIXED)$", text, re.M), diag
    assert re.search(r"^ENVLAYERS-DIAG: node n2: (ALLOCATED|MIXED)$", text, re.M), diag
    assert text.index("ENVLAYERS-DIAG: ") < text.index("ENVLAYERS-ERROR: only 1 of 2")
    assert "ENVLAYERS-STAGE: endpoint live" not in text
    run.assert_nothing_left()


def test_a_rank_that_dies_after_the_endpoint_is_live_ends_the_job(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, STANDIN_CRASH_AFTER_READY_SECONDS="2", STANDIN_EXIT_CODE="9")
    run.submit()
    run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    assert run.state(timeout_s=40) == "FAILED"
    assert "ENVLAYERS-ERROR: rank 0 on n1 exited with code 9 after the endpoint was live" in run.out.read_text()


def test_a_vllm_engine_core_that_dies_ends_the_job_on_the_servers_report_not_its_exit(netns_lab, tmp_path):
    # the stand-in says what vLLM's API server says when its engine core dies, then lingers 300 s before exiting
    # (the real 0.32 CPU build lingers about 4 s): the job must end on the line, long before the exit
    run = Run(netns_lab, tmp_path, model="oss120b", STANDIN_CORE_DIES_AFTER_READY_SECONDS="2",
              STANDIN_CORE_DEATH_EXIT_SECONDS="300", STANDIN_VLLM_LOG="0.32-cpu")
    run.submit()
    run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    said_at = time.monotonic()
    assert run.state(timeout_s=2 + 2 * LATE_S) == "FAILED"
    assert time.monotonic() - said_at < 2 + 2 * LATE_S
    text = run.out.read_text()
    assert re.search(r"^ENVLAYERS-ERROR: rank 0 on n1 lost its engine core after the endpoint was live \(its log: "
                     r"\(APIServer pid=\d+\) WARNING .*\[shutdown\] MPClient: engine core exited unexpectedly; "
                     r"starting cleanup\)$", text, re.M), text
    # the server was stopped by the launcher (its own exit would have come 60 s after the line, with code 1)
    exit_file = run.run_dir / "rank-0.exit"
    assert not exit_file.exists() or exit_file.read_text().strip() != "1", exit_file.read_text()
    assert json.loads((run.run_dir / "launch-end.json").read_text())["reason"].startswith("rank 0 on n1 lost its "
                                                                                         "engine core")
    run.assert_nothing_left()


def test_submitting_the_wrapper_itself_with_sbatch_fails_fast_with_a_hint(netns_lab, tmp_path):
    # no GPUs asked for: the allocation cannot hold the plan (tests/slurm/test_wrapper_sbatch_e2e.py has the rest)
    job_id = netns_lab.submit(SBATCH.read_text(), "--nodes=1", "--output=slurm-%j.out", cwd=tmp_path,
                              env={**os.environ, **netns_lab.env, "PYTHONPATH": str(REPO / "src"), "MODEL": "qwen38"})
    assert netns_lab.wait_job(job_id, timeout_s=30) == "FAILED"
    out = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert "does not fit experiment:qwen38 (0 GPU(s) per node, not 4)" in out
    assert "run it without sbatch, and it submits that job itself: MODEL=qwen38 cluster/serve-only.sbatch" in out


def test_a_rank_killed_by_sigkill_is_blamed_not_the_rank_srun_stopped(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, model="glm53", layer="INFERENCE_NODES=2\nPIPELINE_PARALLEL_SIZE=2\n",
              STANDIN_LOAD_SECONDS="3", STANDIN_CRASH_AT="weights", STANDIN_CRASH_SIGNAL="KILL", STANDIN_RANKS="1")
    run.submit()
    assert run.state(timeout_s=40) == "FAILED"
    assert "ENVLAYERS-ERROR: rank 1 on n2 exited with code 137 before the endpoint was live" in run.out.read_text()


def test_a_hostile_value_reaches_the_engine_byte_exact_and_runs_nothing(netns_lab, tmp_path):
    # free-text values only: a parser name is checked against the engine's own choices before submission
    hostile = "${HOME}-$(touch CANARY)-`touch CANARY`-${SERVER_API_KEY:-x}-\\-\"q\""
    run = Run(netns_lab, tmp_path, layer=f"INFERENCE_MODEL='{hostile}'\nSERVER_EXTRA_ARGS='--chat-template \"$(id -u)\"'\n")
    run.submit()
    run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    netns_lab.cancel(run.job_id)
    run.state()
    argv = json.loads((tmp_path / "engines.jsonl").read_text().splitlines()[0])["argv"]
    assert argv[argv.index("--model-path") + 1] == hostile
    assert argv[argv.index("--chat-template") + 1] == "$(id -u)"
    assert not list(tmp_path.rglob("CANARY")) and not list(Path.home().glob("CANARY"))


def test_launch_keys_come_from_the_layers_not_the_submitting_shell(netns_lab, tmp_path):
    # and a value the render writes with nested quotes, which the job must take as it is
    # keyless: an ambient SERVER_API_KEY must not give the server a key either
    run = Run(netns_lab, tmp_path, layer=KEYLESS + "QUOTED=\"it's\"\nNESTED=${ENVLAYERS_UNSET_NAME-$QUOTED}\n",
              SGLANG_ATTENTION_BACKEND="triton", MAX_MODEL_LEN="4096", SERVER_API_KEY="ambient-s3cret")
    dry_rank0 = [line for line in run.sbatch(submit=False).stdout.splitlines() if line.startswith("#   rank 0: ")]
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    ran = [line for line in text.splitlines() if line.startswith("ENVLAYERS-STAGE: rank 0 on n1: ")]
    assert ran[0].removeprefix("ENVLAYERS-STAGE: rank 0 on n1: ") == dry_rank0[0].removeprefix("#   rank 0: ")
    assert "--attention-backend aiter" in ran[0] and "--context-length" not in ran[0]
    assert "API key: none" in text
    netns_lab.cancel(run.job_id)
    run.state()
    assert not any("ambient-s3cret" in p.read_text(errors="replace") for p in run.run_dir.iterdir() if p.is_file())


def test_pipeline_derives_nccl_socket_ifname_from_the_fabric_interfaces(netns_lab, tmp_path):
    # lab nodes carry their address on eth0: name that the fabric prefix
    run = Run(netns_lab, tmp_path, model="glm53",
              layer="INFERENCE_NODES=2\nPIPELINE_PARALLEL_SIZE=2\nENVLAYERS_HSN_IFACE=eth\n")
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    assert f"ENVLAYERS-TOPOLOGY: iface eth0 {netns_lab.nodes['n1']}" in text
    assert "ENVLAYERS-TOPOLOGY: nccl_socket_ifname==eth0 (derived)" in text
    netns_lab.cancel(run.job_id)
    run.state()
    records = [json.loads(line) for line in (tmp_path / "engines.jsonl").read_text().splitlines()]
    assert {r["env"].get("NCCL_SOCKET_IFNAME") for r in records} == {"=eth0"}


def test_a_fabric_prefix_that_matches_nothing_fails_before_srun(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, model="glm53",
              layer="INFERENCE_NODES=2\nPIPELINE_PARALLEL_SIZE=2\nENVLAYERS_HSN_IFACE=hsn\n")
    run.submit()
    assert run.state(timeout_s=40) == "FAILED"
    text = run.out.read_text()
    assert "ENVLAYERS-ERROR: no routable fabric IPv4 address on the head node: no interface hsn<N>" in text
    assert "starting 2 rank(s)" not in text
    diag = subprocess.run([sys.executable, "-m", "envlayers", "diagnose", run.job_id], cwd=tmp_path, env=run.env, capture_output=True,
                          text=True, timeout=60)
    assert diag.returncode == 1 and "no-fabric-address" in diag.stdout


RESTARTED = r"^ENVLAYERS-STAGE: restart 1 of job \d+ \(requeued by Slurm\)[^\n]*\n[\s\S]*^" + re.escape(BANNER)


def assert_second_run_is_clean(run: Run, text: str) -> None:
    after = text[re.search(r"^ENVLAYERS-STAGE: restart 1 of job", text, re.M).start():]
    assert f"the previous run's files are in {run.run_dir}/run-0" in after
    assert "ENVLAYERS-ERROR" not in after
    assert run.endpoint()["restart"] == 1
    assert json.loads((run.run_dir / "launch.json").read_text())["restart"] == 1
    assert json.loads((run.run_dir / "run-0" / "launch.json").read_text())["restart"] == 0
    assert not list(run.run_dir.glob("rank-*.exit"))  # the first run's exits stay in run-0
    assert (run.run_dir / "run-0" / "server-0.log").exists()


def _slurm_time(text: str | None) -> float | None:
    """A time scontrol printed (SLURM_TIME_FORMAT=standard, local time) as epoch seconds; None otherwise."""
    try:
        return time.mktime(time.strptime(text or "", "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def start_requeued_now(lab, job_id: str, timeout_s: float = 150) -> None:
    """Slurm holds a requeued job back (BeginTime about two minutes on, the life of the job credential
    the requeue revoked): let it start a few seconds on instead. Not at once: a relaunch within the
    second of the revocation carries a credential slurmd still counts as revoked, and Slurm kills the
    job ("Killing non-startable batch job: Job credential revoked"). The update is repeated while the
    job stays PENDING: issued while the requeue is still completing, Slurm can drop it. A held job
    is released, as an operator would. Fails with Slurm's view of the job and its nodes when it never
    restarts."""
    deadline = time.monotonic() + timeout_s
    asked_at = poked_at = None
    info: dict = {}
    while time.monotonic() < deadline:
        info = lab.job_info(job_id) or {}
        restarted = info.get("Restarts", "0") != "0"
        if restarted and info.get("JobState") not in ("PENDING", "COMPLETING", "REQUEUED", None):
            return
        if info.get("JobState") in ("FAILED", "CANCELLED", "COMPLETED", "NODE_FAIL", "BOOT_FAIL"):
            break
        if restarted and info.get("JobState") == "PENDING":
            if "held" in info.get("Reason", "").lower() or info.get("Priority") == "0":
                lab.run(["scontrol", "release", job_id], check=False)
            eligible = _slurm_time(info.get("EligibleTime"))
            if eligible is None or eligible > time.time() + 5:  # Slurm's own hold: bring it in, a few s on
                if asked_at is None or time.monotonic() - asked_at > 10:
                    lab.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now+3"], check=False)
                    asked_at = time.monotonic()
            elif eligible <= time.time() and (poked_at is None or time.monotonic() - poked_at > 5):
                # eligible, and still pending: an update makes the controller schedule now, rather than at its
                # next periodic pass (a minute on a busy controller, where an earlier update could land just
                # before it and push the start past it again)
                lab.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=False)
                poked_at = time.monotonic()
        time.sleep(0.2)
    nodes = lab.run(["sinfo", "-N", "-h", "-o", "%N %T %E"], check=False).stdout
    raise AssertionError(f"requeued job {job_id} did not start again: "
                         f"JobState={info.get('JobState')} Reason={info.get('Reason')} "
                         f"Restarts={info.get('Restarts')} Priority={info.get('Priority')}; nodes:\n{nodes}")


def test_a_requeued_job_starts_clean_and_says_it_is_a_restart(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, SERVE_TIME="00:10:00")
    run.submit()
    run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    netns_lab.run(["scontrol", "requeue", run.job_id])
    start_requeued_now(netns_lab, run.job_id)
    text = run.wait_for(RESTARTED, timeout_s=180)
    assert_second_run_is_clean(run, text)
    first_end = json.loads((run.run_dir / "run-0" / "launch-end.json").read_text())
    assert first_end["restart"] == 0 and first_end["reason"] == "live then signal 15"
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
    end = json.loads((run.run_dir / "launch-end.json").read_text())
    assert end["restart"] == 1 and end["reason"] == "live then signal 15" and end["code"] == 143


def test_a_job_whose_node_goes_down_is_requeued_and_starts_clean(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, SERVE_TIME="00:10:00")
    run.submit()
    run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    node = run.endpoint()["nodes"][0]
    # drained first: the lab's ReturnToService=2 would hand a node that is merely DOWN (its slurmd still
    # registers) straight back to the requeued job
    netns_lab.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=envlayers-test"])
    netns_lab.run(["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=envlayers-test"])
    try:
        start_requeued_now(netns_lab, run.job_id)
        text = run.wait_for(RESTARTED, timeout_s=180)
    finally:
        netns_lab.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
    assert_second_run_is_clean(run, text)
    assert run.endpoint()["nodes"][0] != node
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"


def test_node_names_that_do_not_resolve_are_reached_at_their_slurm_address(tmp_path):
    """A second lab in --no-netns mode: every node at 127.0.0.1 under a name (n1) nothing resolves."""
    import socket

    from labtools import LabUnavailable, lab_command, lab_from_status, unavailable

    lab_dir = tmp_path / "lab"
    env = {"ENVLAYERS_LAB_DIR": str(lab_dir)}
    up = lab_command("--no-netns", "up", "1", env=env)
    try:
        if up.returncode != 0:
            unavailable(f"a second --no-netns lab did not start:\n{up.stdout[-2000:]}")
        try:
            lab = lab_from_status(lab_dir, started_here=True)
        except LabUnavailable as exc:
            unavailable(str(exc))
        with pytest.raises(OSError):
            socket.gethostbyname("n1")
        port = free_port()  # all nodes share the host's ports here: take a free one
        run = Run(lab, tmp_path / "job", layer=KEYLESS + f"SERVER_PORT={port}\n") if (tmp_path / "job").mkdir() is None else None
        run.submit()
        text = run.wait_for("^" + re.escape(BANNER), timeout_s=90)
        assert f"base URL: http://127.0.0.1:{port}/v1\n" in text
        ep = run.endpoint()
        assert ep["base_url"] == f"http://127.0.0.1:{port}/v1" and ep["addresses"] == ["127.0.0.1"]
        assert ep["nodes"] == ["n1"]
        assert curl(ep["base_url"] + "/models").stdout.endswith("\n200")
        lab.cancel(run.job_id)
        assert run.state() == "CANCELLED"
    finally:
        down = lab_command("down", env=env)
        assert down.returncode == 0, down.stdout


def test_a_term_to_the_jobs_steps_is_recorded_as_a_cancel_with_the_engines_last_lines(netns_lab, tmp_path):
    # scancel --signal=TERM JOB signals every step (not the batch script): the ranks' step. Its log-masking
    # reader died first, the rank of SIGPIPE, and the end read "srun step exited with code 141"
    run = Run(netns_lab, tmp_path, SERVE_TIME="00:10:00")
    run.submit()
    run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    netns_lab.run(["scancel", "--signal=TERM", run.job_id])
    run.state(timeout_s=60)
    text = run.out.read_text()
    end = json.loads((run.run_dir / "launch-end.json").read_text())
    log = (run.run_dir / "server-0.log").read_text()
    assert "code 141" not in text and "ENVLAYERS-ERROR" not in text, text
    assert ("ENVLAYERS-STAGE: the server step received SIGTERM after the endpoint was live (scancel --signal, or "
            f"Slurm); the ranks stopped (rank 0 code 0); ending job {run.job_id}") in text, text
    assert (end["code"], end["reason"]) == (143, "live then signal 15 to the server step"), end
    # the engine's shutdown line reached the (masked) log, then the rank's own end
    assert "INFO:     Shutting down" in log and "ENVLAYERS-STAGE: rank 0 exited with code 0 after SIGTERM" in log, log
    run.assert_nothing_left()
