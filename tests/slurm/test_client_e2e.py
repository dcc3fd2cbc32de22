"""The endpoint block works as pasted, with the official ``openai`` Python client, on the real lab.

Submit, ``env_layers wait`` (the block on stdout), then run exactly what the block printed: the Python
snippet (models.list() and a chat completion on every base URL) and, in this process, the client built
from the printed base URL, served name and api_key form; the default (a per-job key the snippet reads from
the run directory), keyless (the key emptied and acknowledged), keyed (SERVER_API_KEY_FILE, 0600) and
replicas (the default key). The only edit: lab node names do not resolve on this host, so they are replaced by their
addresses. Then the block's own stop command.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from extratools import needs_extra

from labruns import BANNER, KEYLESS, Job

openai = needs_extra("openai", "test")

pytestmark = pytest.mark.slurm


def printed_block(job: Job) -> str:
    res = job.cli("wait", job.job_id, "--timeout", "90", "--poll", "0.5", "--progress", "none", timeout_s=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(BANNER + "\n"), res.stdout
    return res.stdout


def field(block: str, label: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in block.splitlines() if line.startswith(label + ": ")]


def resolvable(text: str, lab) -> str:
    """Lab node names -> their addresses (the host cannot resolve n1, n2...)."""
    return re.sub(r"http://(n\d+):", lambda m: f"http://{lab.nodes[m.group(1)]}:", text)


def python_snippet(block: str) -> str:
    lines = block.split("try (Python, pip install openai):\n", 1)[1].splitlines()
    end = lines.index("PY")
    return "\n".join(lines[: end + 1]) + "\n"


@pytest.mark.parametrize("mode", [
    pytest.param("default", id="default-per-job-key"),
    pytest.param("keyless", id="keyless"),
    pytest.param("keyed", id="keyed-0600-key-file"),
    pytest.param("replicas", id="replicas-every-base-url"),
])
def test_the_printed_block_works_with_the_official_openai_client(netns_lab, tmp_path, mode):
    env, layer, key = {}, "", None
    if mode == "keyed":
        key = "k3y-" + os.urandom(6).hex()
        key_file = tmp_path / "api-key"
        key_file.write_text(key + "\n")
        key_file.chmod(0o600)
        layer = f"SERVER_API_KEY_FILE={key_file}\n"
    if mode == "keyless":
        layer = KEYLESS
    if mode == "replicas":
        env["EXPERIMENT"] = "replicas"
    job = Job(netns_lab, tmp_path, layer=layer, **env)
    block = printed_block(job)
    if mode in ("default", "replicas"):  # experiments/serve-only.env: a key made in the job, 0600 in its run dir
        key_file = job.run_dir / "api-key"
        key = key_file.read_text().strip()
    bases, served = field(block, "base URL"), field(block, "served name")[0].split(" ")[0]
    assert len(bases) == (2 if mode == "replicas" else 1)
    assert field(block, "stop") == [f"env_layers stop {job.job_id} (the endpoint stays up until this job ends)"]
    if key:
        assert key not in block
        api_key = open(key_file).read().strip()  # what the snippet's api_key= reads
        assert f'api_key=open("{key_file}").read().strip()' in block
    else:
        assert 'api_key="EMPTY"' in field(block, "API key")[0]
        api_key = "EMPTY"

    # 1. the snippet, run as pasted into a shell
    ran = subprocess.run(["bash", "-c", resolvable(python_snippet(block), netns_lab)], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    assert ran.returncode == 0, ran.stderr
    out = ran.stdout.splitlines()
    assert len(out) == 2 * len(bases), ran.stdout
    for i, base in enumerate(bases):
        assert out[2 * i] == f"{resolvable(base, netns_lab)} ['{served}']" and out[2 * i + 1].strip()

    # 2. the client, built here from the printed base URL, served name and key
    for base in bases:
        client = openai.OpenAI(base_url=resolvable(base, netns_lab), api_key=api_key, max_retries=0, timeout=20)
        assert [m.id for m in client.models.list()] == [served]
        reply = client.chat.completions.create(model=served, max_tokens=32,
                                               messages=[{"role": "user", "content": "Say hi."}])
        assert reply.model == served and reply.choices[0].message.content
        if key:  # the key is enforced: a wrong one is refused
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=resolvable(base, netns_lab), api_key="wrong", max_retries=0).models.list()

    # endpoint.json lists every base URL, in the block's order
    record = json.loads(job.cli("status", job.job_id, "--json").stdout)
    assert record["endpoint"]["base_urls"] == bases and record["urls"] == bases and record["served_name"] == served

    # 3. the block's own stop command
    stop = job.cli("stop", job.job_id)
    assert stop.returncode == 0, stop.stdout + stop.stderr
