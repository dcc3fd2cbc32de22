"""apikey.read_key is the one reader of an API key file: the rules every reader shares, and the two that
differ by the caller's parameters (``serving``: the safe set for a server's key; ``owner``: a client reads
only a file of its own). Every error names the file and what named it, and says the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envlayers.apikey import check_key_file, mode_warning, read_key
from envlayers.errors import EnvLayersError

GOOD = "k3y-0123456789abcdef"


def _file(tmp_path: Path, content: bytes | str | None, mode: int = 0o600) -> Path:
    path = tmp_path / "key"
    if content is not None:
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        path.chmod(mode)
    return path


@pytest.mark.parametrize("serving", [True, False], ids=["serving", "client"])
@pytest.mark.parametrize("content, message", [
    pytest.param(None, "the key file does not exist", id="missing"),
    pytest.param("", "the key file is empty", id="empty"),
    pytest.param(" \n\t\n", "the key file is empty", id="only-whitespace"),
    pytest.param(b"\xff\xfe" + b"x" * 10, "the key file is not text (not UTF-8)", id="not-utf8"),
    pytest.param(f"{GOOD}\n{GOOD}\n", "the key file holds more than one line", id="two-lines"),
])
def test_every_reader_refuses_an_unusable_file(tmp_path, serving, content, message):
    path = _file(tmp_path, content)
    with pytest.raises(EnvLayersError) as err:
        read_key(path, serving=serving)
    assert str(err.value).startswith(f"SERVER_API_KEY_FILE {path}: {message}; hint: ")
    assert GOOD not in str(err.value)


def test_a_folder_is_a_file_that_cannot_be_read(tmp_path):
    with pytest.raises(EnvLayersError, match=f"SERVER_API_KEY_FILE {tmp_path}: cannot read the key file: "):
        read_key(tmp_path)


@pytest.mark.parametrize("content, message", [
    pytest.param("abc'def\\ghij", "the key holds characters outside the safe set", id="quote-and-backslash"),
    pytest.param("key with spaces", "the key holds characters outside the safe set", id="spaces"),
    pytest.param("short", "the key is 5 characters long", id="too-short"),
    pytest.param("x" * 513, "the key is 513 characters long", id="too-long"),
    pytest.param("-abcdefgh12345", "the key starts with '-'", id="leading-dash"),
])
def test_a_servers_key_must_be_safe_but_a_clients_copy_is_any_key(tmp_path, content, message):
    path = _file(tmp_path, content + "\n")
    with pytest.raises(EnvLayersError, match=message):
        read_key(path)
    assert read_key(path, serving=False) == content


def test_the_key_is_the_text_without_surrounding_whitespace(tmp_path):
    assert read_key(_file(tmp_path, f"\n  {GOOD}  \n")) == GOOD


def test_where_and_named_by_lead_the_error(tmp_path):
    path = _file(tmp_path, "")
    with pytest.raises(EnvLayersError) as err:
        read_key(path, "mine.env:2", named_by="--api-key-file", serving=False)
    assert str(err.value).startswith(f"mine.env:2: --api-key-file {path}: the key file is empty")


def test_a_client_reads_only_a_file_of_its_own(tmp_path):
    path = _file(tmp_path, GOOD)
    me = os.getuid()
    assert read_key(path, serving=False, owner=me) == GOOD
    with pytest.raises(EnvLayersError) as err:
        read_key(path, serving=False, owner=me + 1)
    assert ", not to you (" in str(err.value) and str(err.value).startswith(f"SERVER_API_KEY_FILE {path}: the key file "
                                                                          "belongs to ")
    assert "only the key file's owner may print or use the key" in str(err.value)
    assert read_key(path) == GOOD  # the server's side does not ask who owns it (a team's shared file)


def test_a_client_path_may_start_with_a_tilde_a_servers_may_not(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    _file(tmp_path, GOOD)
    assert read_key("~/key", serving=False) == GOOD
    with pytest.raises(EnvLayersError, match="does not exist"):
        read_key("~/key")


@pytest.mark.parametrize("mode, warned", [(0o600, False), (0o400, False), (0o640, True), (0o604, True)])
def test_a_key_file_others_can_read_or_write_is_a_warning(tmp_path, mode, warned):
    path = _file(tmp_path, GOOD, mode)
    want = [f"SERVER_API_KEY_FILE {path} is readable or writable by others (mode {mode:04o}); run `chmod 600 {path}`"]
    assert check_key_file(path) == (want if warned else [])
    assert mode_warning(path, "the key file") == (want[0].replace("SERVER_API_KEY_FILE", "the key file", 1)
                                                  if warned else None)


def test_no_warning_for_a_file_that_is_not_there(tmp_path):
    assert mode_warning(tmp_path / "nope") is None


@pytest.mark.parametrize("mode", [0o620, 0o606, 0o666])
def test_a_key_file_others_can_write_is_refused(tmp_path, mode):
    # another user who can write the key file chooses the key the server accepts
    path = _file(tmp_path, GOOD, mode)
    with pytest.raises(EnvLayersError) as err:
        check_key_file(path, where="mine.env:3")
    assert str(err.value).startswith(f"mine.env:3: SERVER_API_KEY_FILE {path}: is writable by others (mode {mode:04o}): "
                                     "another user could choose the key this server accepts; hint: chmod go-w")


def test_a_key_file_in_a_folder_others_can_write_is_refused(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    path = _file(folder, GOOD)
    folder.chmod(0o777)
    with pytest.raises(EnvLayersError, match="which others can write"):
        check_key_file(path)



@pytest.mark.parametrize("how", ["writable", "other-owner", "open-folder"])
def test_the_key_the_job_starts_its_server_with_comes_from_a_file_no_other_user_could_write(tmp_path, how):
    # the launcher reads SERVER_API_KEY_FILE again in the job (read_key, serving); a path the login node could not
    # check (it read a variable set only in the job) or a file changed since is refused there too
    from envlayers.launch.launcher import read_api_key
    from envlayers.launch.prepare import LaunchFailure

    if how == "other-owner" and os.getuid() != 0:
        pytest.skip("only root can give a file to another uid")
    folder = tmp_path / "keys"
    folder.mkdir()
    path = _file(folder, GOOD, 0o620 if how == "writable" else 0o600)
    if how == "other-owner":
        os.chown(path, 4242, 4242)
    if how == "open-folder":
        folder.chmod(0o777)
    said = {"writable": f"SERVER_API_KEY_FILE {path}: is writable by others (mode 0620): another user could choose "
                        "the key this server accepts; hint: chmod go-w",
            "other-owner": f"SERVER_API_KEY_FILE {path}: belongs to 4242: another user could choose the key this "
                           "server accepts; hint: copy it to a file of your own",
            "open-folder": f"SERVER_API_KEY_FILE {path}: is in {folder}, which others can write (mode 0777)"}[how]
    with pytest.raises(EnvLayersError) as err:
        read_key(path)
    assert str(err.value).startswith(said), str(err.value)
    with pytest.raises(LaunchFailure) as failure:
        read_api_key(str(path))
    assert str(failure.value).startswith(said)
    assert read_key(path, serving=False) == GOOD  # a client's copy: the owner check is the client's own rule
