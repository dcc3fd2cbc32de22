"""The core-dump guard: core files left behind, and a recorded core limit that is not 0."""

from __future__ import annotations

import json
import struct

import pytest
from click.testing import CliRunner

from envlayers.cli import cli
from envlayers.cores import check_cores, find_core_files, is_elf_core, parse_core_limits
from envlayers.errors import EnvLayersError


def elf(e_type: int, little: bool = True) -> bytes:
    """The first bytes of an ELF file of the given type (4 = ET_CORE, 2 = ET_EXEC)."""
    ident = b"\x7fELF" + bytes([2, 1 if little else 2, 1]) + bytes(9)
    return ident + struct.pack("<H" if little else ">H", e_type) + bytes(46)


@pytest.mark.parametrize("name, content, reported, elf_core", [
    pytest.param("core", b"not elf", True, False, id="plain-core-name"),
    pytest.param("core.4711", elf(4), True, True, id="core-dot-pid-elf"),
    pytest.param("core.4711", b"", True, False, id="core-dot-pid-empty"),
    pytest.param("python3.core", elf(4), True, True, id="star-dot-core"),
    pytest.param("core.python3.4711", elf(4), True, True, id="core-pattern-variant-that-is-elf-core"),
    pytest.param("core.py", b"print('hi')\n", False, False, id="core-py-is-not-a-core"),
    pytest.param("core.sh", elf(2), False, False, id="core-dot-name-elf-executable-is-not-a-core"),
    pytest.param("server-0.log", elf(4), False, False, id="other-names-ignored"),
    pytest.param("score", b"", False, False, id="suffix-core-without-dot-ignored"),
])
def test_core_file_names(tmp_path, name, content, reported, elf_core):
    (tmp_path / name).write_bytes(content)
    found = find_core_files(tmp_path)
    if reported:
        assert [(f.path, f.elf_core, f.size_bytes) for f in found] == [(str(tmp_path / name), elf_core, len(content))]
    else:
        assert found == []


def test_a_directory_named_core_is_not_a_core_file(tmp_path):
    (tmp_path / "core").mkdir()
    assert find_core_files(tmp_path) == []


def test_big_endian_elf_core_is_recognised(tmp_path):
    (tmp_path / "dump").write_bytes(elf(4, little=False))
    assert is_elf_core(tmp_path / "dump")


def test_cores_below_the_folder_are_not_searched(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "core").write_bytes(elf(4))
    assert find_core_files(tmp_path) == []


@pytest.mark.parametrize("text, values, ok", [
    pytest.param("rank=0 limit=0\nrank=1 limit=0\n", [(0, "0"), (1, "0")], True, id="all-zero"),
    pytest.param("rank=0 limit=0\nrank=1 limit=unlimited\n", [(0, "0"), (1, "unlimited")], False, id="unlimited"),
    pytest.param("rank=0 limit=1024\n", [(0, "1024")], False, id="nonzero-number"),
    pytest.param("# written by the job\n\nrank=0 limit=0\n", [(0, "0")], True, id="comments-and-blank-lines"),
])
def test_core_limit_lines(text, values, ok):
    limits = parse_core_limits(text)
    assert [(lim.rank, lim.value) for lim in limits] == values
    assert all(lim.ok for lim in limits) is ok


def test_malformed_limit_line_names_file_and_line():
    with pytest.raises(EnvLayersError) as err:
        parse_core_limits("rank=0 limit=0\nlimit is 0\n", origin="run/core-limit.txt")
    assert str(err.value).startswith("run/core-limit.txt:2: expected 'rank=<r> limit=<value>'")


def test_clean_folder(tmp_path):
    (tmp_path / "core-limit.txt").write_text("rank=0 limit=0\n")
    report = check_cores(tmp_path)
    assert report.ok and report.limit_file == str(tmp_path / "core-limit.txt")


def test_missing_limit_file_is_not_a_failure(tmp_path):
    report = check_cores(tmp_path)
    assert report.ok and report.limit_file is None and report.limits == []


def test_missing_folder_is_bad_input(tmp_path):
    with pytest.raises(EnvLayersError, match="no such directory"):
        check_cores(tmp_path / "nope")


def run(*args: str):
    return CliRunner().invoke(cli, ["check-cores", *args], catch_exceptions=False)


def test_cli_clean_exits_0(tmp_path):
    (tmp_path / "core-limit.txt").write_text("rank=0 limit=0\nrank=1 limit=0\n")
    result = run(str(tmp_path))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "clean"


def test_cli_core_file_exits_1(tmp_path):
    (tmp_path / "core.4711").write_bytes(elf(4))
    result = run(str(tmp_path))
    assert result.exit_code == 1
    assert f"core file: {tmp_path / 'core.4711'} (64 bytes, ELF core)" in result.output


def test_cli_limit_not_zero_exits_1(tmp_path):
    (tmp_path / "core-limit.txt").write_text("rank=0 limit=0\nrank=1 limit=unlimited\n")
    result = run(str(tmp_path))
    assert result.exit_code == 1
    assert "core limit: rank 1: unlimited (NOT 0" in result.output


def test_cli_explicit_limit_file(tmp_path):
    limits = tmp_path / "elsewhere.txt"
    limits.write_text("rank=0 limit=unlimited\n")
    assert run(str(tmp_path), "--limit-file", str(limits)).exit_code == 1


def test_cli_json(tmp_path):
    (tmp_path / "core").write_bytes(b"x")
    (tmp_path / "core-limit.txt").write_text("rank=0 limit=0\n")
    result = run("--json", str(tmp_path))
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["ok"] is False
    assert data["cores"] == [{"path": str(tmp_path / "core"), "size_bytes": 1, "elf_core": False}]
    assert data["bad_limits"] == []
    assert data["limits"] == [{"rank": 0, "value": "0", "where": f"{tmp_path / 'core-limit.txt'}:1", "ok": True}]


def test_cli_missing_folder_exits_2(tmp_path):
    result = run(str(tmp_path / "nope"))
    assert result.exit_code == 2
    assert "no such directory" in result.stderr
