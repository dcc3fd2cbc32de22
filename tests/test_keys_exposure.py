"""Per-job API keys (SERVER_API_KEY_FILE=generate) and the refusal of a keyless server on every interface."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import subprocess
from pathlib import Path

import pytest

from envlayers.apikey import KEY_CHARS, generate_key, read_key, wants_generated
from envlayers.rundir import write_api_key
from envlayers.exposure import public_keyless
from envlayers.jobscript import prepare

REPO = Path(__file__).resolve().parents[1]
PY = "/usr/bin/python3"


# ------------------------------------------------------------------ the refusal, pure


@pytest.mark.parametrize("env, refused", [
    pytest.param({}, True, id="host-absent-binds-everywhere"),
    pytest.param({"SERVER_HOST": "0.0.0.0"}, True, id="all-ipv4"),
    pytest.param({"SERVER_HOST": "::"}, True, id="all-ipv6"),
    pytest.param({"SERVER_HOST": "0.0.0.0", "ALLOW_PUBLIC_UNAUTHENTICATED": "0"}, True, id="ack-0-is-no-ack"),
    pytest.param({"SERVER_HOST": "0.0.0.0", "ALLOW_PUBLIC_UNAUTHENTICATED": "yes"}, True, id="ack-must-be-1"),
    pytest.param({"SERVER_HOST": "0.0.0.0", "ALLOW_PUBLIC_UNAUTHENTICATED": "1"}, False, id="acknowledged"),
    pytest.param({"SERVER_HOST": "0.0.0.0", "SERVER_API_KEY_FILE": "/k"}, False, id="key-file"),
    pytest.param({"SERVER_API_KEY_FILE": "generate"}, False, id="generated-key"),
    pytest.param({"SERVER_HOST": "127.0.0.1"}, False, id="loopback"),
    pytest.param({"SERVER_HOST": "10.0.0.5"}, True, id="routable-address"),
    pytest.param({"SERVER_HOST": "10.0.0.5", "SERVER_API_KEY_FILE": "generate"}, False, id="routable-with-a-key"),
    pytest.param({"SERVER_HOST": "nid001234"}, True, id="host-name"),
    pytest.param({"SERVER_HOST": "localhost"}, False, id="localhost"),
    pytest.param({"SERVER_HOST": "::1"}, False, id="loopback-ipv6"),
    pytest.param({"SERVER_HOST": "127.0.0.2"}, False, id="loopback-net"),
    pytest.param({"SERVER_HOST": "${MY_ADDR}"}, True, id="decided-in-the-job"),
    pytest.param({"SERVER_HOST": "0.0.0.0", "CONTAINER_RUNTIME": "podman"}, True, id="podman-publishes-everywhere"),
    pytest.param({"SERVER_HOST": "127.0.0.1", "CONTAINER_RUNTIME": "podman"}, False, id="podman-publishes-loopback"),
    pytest.param({"SERVER_HOST": "0.0.0.0", "CONTAINER_RUNTIME": "none"}, True, id="runtime-none"),
])
def test_public_keyless(env, refused):
    text = public_keyless(env)
    assert (text is not None) == refused
    if refused:
        assert "SERVER_API_KEY_FILE=generate" in text and "ALLOW_PUBLIC_UNAUTHENTICATED=1" in text
    if env.get("ALLOW_PUBLIC_UNAUTHENTICATED") == "yes":
        assert "ALLOW_PUBLIC_UNAUTHENTICATED='yes' is not 1" in text


EVERY_INTERFACE_SPELLINGS = ["0.0.0.0", "0", "0.0", "0.0.0", "0x0", "0X00", "00", "000.000.000.000", "0x0.0",
                             "::", "::0", "0:0:0:0:0:0:0:0", "0000::", "::ffff:0.0.0.0", "::ffff:0:0"]


@pytest.mark.parametrize("host", EVERY_INTERFACE_SPELLINGS)
def test_every_spelling_of_the_unspecified_address_binds_every_interface(host):
    from envlayers.exposure import EVERY_INTERFACE, reach

    assert reach(host)[0] == EVERY_INTERFACE
    text = public_keyless({"SERVER_HOST": host})
    assert text and text.startswith(f"the server binds every interface (SERVER_HOST={host}")


@pytest.mark.parametrize("host, kind", [
    *[pytest.param(h, "every interface", id=f"unspecified-{h}") for h in EVERY_INTERFACE_SPELLINGS],
    pytest.param("127.0.0.1", "loopback", id="loopback"), pytest.param("127.1", "loopback", id="loopback-short"),
    pytest.param("0x7f.1", "loopback", id="loopback-hex"), pytest.param("2130706433", "loopback", id="loopback-number"),
    pytest.param("::1", "loopback", id="loopback-ipv6"), pytest.param("::ffff:127.0.0.1", "loopback", id="mapped"),
    pytest.param("10.0.0.5", "routable", id="private-net"), pytest.param("012.0.0.5", "routable", id="octal"),
])
def test_the_bind_reads_the_address_the_way_the_parse_does(host, kind):
    """The engines bind with Python's socket (vLLM: socket.bind((host, port)); SGLang through uvicorn:
    getaddrinfo(host, AI_PASSIVE)): the address the kernel was given is the one parse_host read."""
    import ipaddress
    import socket

    from envlayers.exposure import parse_host, reach

    address = parse_host(host)
    assert reach(host)[0] == kind
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    got = {ipaddress.ip_address(info[4][0]) for info in
           socket.getaddrinfo(host, 0, family, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)}
    assert got == {address}
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, 0))
        except OSError as err:  # an address this machine has not (10.0.0.5), or no IPv6 here
            assert kind == "routable" or family == socket.AF_INET6, err
            return
        assert ipaddress.ip_address(sock.getsockname()[0]) == address


@pytest.mark.parametrize("host, needle", [
    pytest.param("[::]", "an address is written without brackets here; hint: write '::'", id="brackets"),
    pytest.param("*", "is not an IP address or a host name", id="star"),
    pytest.param("08", "is not an IPv4 address", id="bad-octal"),
    pytest.param("0x", "is not an IPv4 address", id="hex-without-digits"),
    pytest.param("1.2.3.4.5", "is not an IPv4 address", id="five-parts"),
    pytest.param("256.1.1.1", "is not an IPv4 address", id="part-over-255"),
    pytest.param("0.0.0.0 ", "holds a blank", id="trailing-blank"),
    pytest.param("a b", "holds a blank", id="inner-blank"),
    pytest.param("host\n", "holds a blank or a control character", id="newline"),
    pytest.param("nid_01", "is not an IP address or a host name", id="underscore"),
    pytest.param("-node", "is not an IP address or a host name", id="leading-dash"),
    pytest.param("a" * 64 + ".x", "is not an IP address or a host name", id="label-too-long"),
])
def test_a_server_host_that_is_no_address_and_no_host_name_is_one_line(host, needle):
    from envlayers.errors import EnvLayersError

    with pytest.raises(EnvLayersError) as err:
        public_keyless({"SERVER_HOST": host, "SERVER_API_KEY_FILE": "generate"})  # a key does not excuse it
    text = str(err.value)
    assert text.startswith("SERVER_HOST: ") and needle in text and "; hint: " in text and "\n" not in text
    assert err.value.exit_code == 2


# ------------------------------------------------------------------ the refusal on the login node


def _job(tmp_path, layer: str):
    mine = tmp_path / "mine.env"
    mine.write_text("CONTAINER_RUNTIME=none\n" + layer)
    return prepare(REPO, "qwen38", env_file=mine, python=PY, environ={"HOME": str(tmp_path), "PWD": str(tmp_path)})


KEYLESS = "SERVER_API_KEY_FILE=\n"  # empties the per-job key experiments/serve-only.env sets


@pytest.mark.parametrize("layer, blocked", [
    pytest.param("", False, id="catalog-default-per-job-key"),
    pytest.param(KEYLESS, True, id="keyless"),
    pytest.param(KEYLESS + "ALLOW_PUBLIC_UNAUTHENTICATED=1\n", False, id="keyless-acknowledged"),
    pytest.param(KEYLESS + "ALLOW_PUBLIC_UNAUTHENTICATED=yes\n", True, id="keyless-acknowledged-not-with-1"),
    pytest.param(KEYLESS + "SERVER_API_KEY_FILE=generate\n", False, id="per-job-key-again"),
    pytest.param(KEYLESS + "SERVER_HOST=127.0.0.1\n", False, id="keyless-loopback"),
    pytest.param(KEYLESS + "SERVER_HOST=0\n", True, id="zero"),
    pytest.param(KEYLESS + "SERVER_HOST=::ffff:0.0.0.0\n", True, id="mapped-unspecified"),
    pytest.param(KEYLESS + "SERVER_HOST=10.1.2.3\n", True, id="routable"),
])
def test_the_dry_run_shows_the_refusal_with_the_fix(tmp_path, layer, blocked):
    job = _job(tmp_path, layer)
    dry = job.dry_run_text()
    shown = [line for line in dry.splitlines() if line.startswith("# would refuse to submit: the server binds")]
    assert bool(shown) == blocked
    if blocked:
        assert "fix: set SERVER_API_KEY_FILE=generate" in shown[0]
        assert shown[0].endswith(f"; the key is emptied at {tmp_path / 'mine.env'}:2 (SERVER_API_KEY_FILE=)")


def test_a_real_submission_is_refused_before_sbatch(tmp_path):
    mine = tmp_path / "mine.env"
    mine.write_text("CONTAINER_RUNTIME=none\n" + KEYLESS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(PYTHONPATH=str(REPO / "src"), HOME=str(tmp_path), PATH="/usr/bin:/bin")  # no sbatch on PATH
    proc = subprocess.run([sys.executable, "-m", "envlayers", "serve", "--model", "qwen38", "--env-file", str(mine)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the server binds every interface" in proc.stderr and "ALLOW_PUBLIC_UNAUTHENTICATED=1" in proc.stderr
    assert "sbatch" not in proc.stderr.replace("SUBMIT=0", "")


def test_the_catalog_default_is_a_per_job_key(tmp_path):
    job = _job(tmp_path, "")  # nothing about the key: experiments/serve-only.env decides
    assert "\nexport SERVER_API_KEY_FILE='generate'\n" in job.script
    assert not job.blockers and all("--api-key '***'" in line for line in job.rank_lines), job.rank_lines


def test_an_acknowledgement_alone_does_not_make_the_server_keyless(tmp_path):
    job = _job(tmp_path, "ALLOW_PUBLIC_UNAUTHENTICATED=1\n")
    assert all("--api-key '***'" in line for line in job.rank_lines), job.rank_lines


def test_keyless_takes_the_emptied_key_and_the_acknowledgement(tmp_path):
    job = _job(tmp_path, KEYLESS + "ALLOW_PUBLIC_UNAUTHENTICATED=1\n")
    assert not job.blockers and not any("--api-key" in line for line in job.rank_lines), job.rank_lines


def test_generate_is_not_checked_as_a_file_on_the_login_node(tmp_path):
    job = _job(tmp_path, "SERVER_API_KEY_FILE=generate\n")
    assert not job.blockers and not any("SERVER_API_KEY_FILE" in w for w in job.warnings), job.warnings
    # the rank gets a key (shown redacted; qwen38 is SGLang, which takes it only as --api-key)
    assert all("--api-key '***'" in line for line in job.rank_lines), job.rank_lines


# ------------------------------------------------------------------ the generated key


@pytest.mark.parametrize("value, wanted", [
    pytest.param("generate", True, id="generate"), pytest.param(" generate\n", True, id="spaces"),
    pytest.param("/home/u/generate", False, id="a-path"), pytest.param(None, False, id="absent"),
    pytest.param("", False, id="empty"),
])
def test_wants_generated(value, wanted):
    assert wants_generated(value) is wanted


def _generated(run_dir):
    """What the launcher does for SERVER_API_KEY_FILE=generate: a fresh key, written to the run directory."""
    key = generate_key()
    return write_api_key(run_dir, key), key


def test_generated_key_file_is_0600_whatever_the_umask_and_reads_back(tmp_path):
    old = os.umask(0)
    try:
        path, key = _generated(tmp_path)
    finally:
        os.umask(old)
    assert path == tmp_path / "api-key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_key(path) == key and len(key) >= 40
    assert re.fullmatch(f"[{KEY_CHARS}]+", key)
    again, key2 = _generated(tmp_path)  # a requeued run replaces it
    assert again == path and key2 != key and read_key(path) == key2


def test_generated_key_does_not_follow_a_planted_link(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("x")
    (tmp_path / "api-key").symlink_to(target)
    path, key = _generated(tmp_path)  # the link is removed, not written through
    assert not path.is_symlink() and target.read_text() == "x" and read_key(path) == key


def test_the_launcher_generates_the_key_and_endpoint_json_names_its_file(tmp_path, capsys):
    from envlayers.launch.launcher import Launcher

    launcher = Launcher(tmp_path, {"ENVLAYERS_KEYS": "SERVER_API_KEY_FILE", "SERVER_API_KEY_FILE": "generate",
                                   "SLURM_JOB_ID": "42"})
    key_file, key = launcher.api_key()
    assert key_file == str(tmp_path / "api-key") and read_key(key_file) == key
    assert launcher.keys["SERVER_API_KEY_FILE"] == key_file
    out = capsys.readouterr().out
    assert f"generated a per-job API key in {key_file}" in out and key not in out


def test_a_job_finds_a_generated_key_before_endpoint_json_exists(tmp_path):
    from envlayers.job import Job
    from envlayers.rundir import ENDPOINT, SERVE_ENV, JobFiles, write_json

    (tmp_path / SERVE_ENV).write_text("export SERVER_API_KEY_FILE='generate'\n")
    job = Job("42", None, JobFiles("42", None, tmp_path))
    assert job.key_file == str(tmp_path / "api-key") and job.key_required
    assert job.key_source().named_by == "SERVER_API_KEY_FILE"
    write_json(tmp_path / ENDPOINT, {"api_key_required": True, "api_key_file": "/x/api-key"})
    job.update(None)  # the records are read again
    assert job.key_file == "/x/api-key"  # endpoint.json's field is what connect (and verify) read
    assert job.key_source().record == f"{tmp_path}/{ENDPOINT}"


@pytest.mark.parametrize("host, local", [
    pytest.param(None, None, id="absent"),
    pytest.param("0.0.0.0", None, id="every-interface"),
    pytest.param("10.0.0.5", None, id="routable"),
    pytest.param("127.0.0.1", "127.0.0.1", id="loopback"),
    pytest.param("127.0.0.2", "127.0.0.2", id="loopback-net"),
    pytest.param("localhost", "127.0.0.1", id="localhost"),
    pytest.param("::1", "[::1]", id="ipv6-in-brackets"),
    pytest.param("::ffff:127.0.0.1", "127.0.0.1", id="mapped"),
    pytest.param("0x7f000001", "127.0.0.1", id="hex-spelling"),
])
def test_a_loopback_bind_is_reached_at_its_own_address(host, local):
    from envlayers.exposure import loopback_host

    assert loopback_host({} if host is None else {"SERVER_HOST": host}) == local


@pytest.mark.parametrize("host, nodes, refused", [
    pytest.param("127.0.0.1", [0], False, id="one-node"),
    pytest.param("127.0.0.1", [0, 1], True, id="replicas-on-two-nodes"),
    pytest.param("0.0.0.0", [0, 1], False, id="every-interface"),
])
def test_loopback_refuses_serving_ranks_beyond_the_first_node(host, nodes, refused):
    from envlayers.exposure import loopback_unreachable

    text = loopback_unreachable({"SERVER_HOST": host}, nodes)
    assert (text is not None) == refused
    if refused:
        assert "node index 1" in text and "SERVER_HOST=127.0.0.1" in text


def test_loopback_with_replicas_on_two_nodes_is_refused_naming_the_layer_line(tmp_path):
    mine = tmp_path / "mine.env"
    mine.write_text("CONTAINER_RUNTIME=none\nINFERENCE_NODES=2\nSERVER_HOST=127.0.0.1\n")
    job = prepare(REPO, "qwen38", experiment="replicas", env_file=mine, python=PY,
                  environ={"HOME": str(tmp_path), "PWD": str(tmp_path)})
    refused = [b for b in job.blockers if "binds loopback only" in b]
    assert refused and refused[0].startswith(f"{mine}:3: the server binds loopback only (SERVER_HOST=127.0.0.1)")


@pytest.mark.parametrize("model", ["qwen38", "glm53"])  # the README's `SUBMIT=0 ...` and `MODEL=glm53 ...`
def test_the_readmes_commands_are_refused_for_nothing_but_a_missing_edf(tmp_path, model):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SBATCH_", "SERVE_", "ENVLAYERS_")) and k not in ("EXPERIMENT", "MODEL")}
    env.update(PYTHONPATH=str(REPO / "src"), HOME=str(tmp_path), MODEL=model, SUBMIT="0")  # a fresh account
    proc = subprocess.run([str(REPO / "cluster" / "serve-only.sbatch")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    refusals = [line for line in proc.stdout.splitlines() if line.startswith("# would refuse to submit: ")]
    assert len(refusals) == 1 and " is not installed in " in refusals[0] and "env_layers install-edfs" in refusals[0]
    assert "\nexport SERVER_API_KEY_FILE='generate'\n" in proc.stdout


def test_a_generated_key_never_starts_with_a_dash(monkeypatch):
    # SGLang takes the key as `--api-key KEY`: a key starting with '-' read as an option stopped a requeued
    # lab job ("argument --api-key: expected one argument"); token_urlsafe gives one in 64 so
    import secrets

    from envlayers.apikey import generate_key

    given = iter(["-starts-with-a-dash-" + "x" * 23, "A" * 43])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n: next(given))
    assert generate_key() == "A" * 43


def test_a_key_file_whose_key_starts_with_a_dash_is_refused(tmp_path):
    from envlayers.apikey import read_key
    from envlayers.errors import EnvLayersError

    key_file = tmp_path / "key"
    key_file.write_text("-abcdefgh12345\n")
    with pytest.raises(EnvLayersError, match="the key starts with '-'"):
        read_key(key_file)
