"""install-edfs: idempotency, --force, protection of files the tool did not write, atomicity under
kill -9, the CLI report, and registry.sbatch under SUBMIT=0."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from envlayers import edf, edfinstall
from envlayers.cli import cli

REPO = Path(__file__).resolve().parents[1]
# the roles the catalog's default site (mi300a) runs: install-edfs installs those, not the NVIDIA site's
NAMES = sorted(
    f"hpcagent-bench-{role}-latest{suffix}.toml"
    for role in ("sglang-mi300", "vllm-mi300", "vllm-mi200")
    for suffix in ("", "-intranode")
)


def make_root(path: Path, *, edit: tuple[str, str] | None = None) -> Path:
    """A catalog root: the shipped catalog (its default site picks the roles to install) and the shipped
    sources (optionally with one text edit in every file)."""
    shutil.copytree(REPO / "experiments", path / "experiments")
    shutil.copytree(REPO / "containers" / "edfs", path / "containers" / "edfs")
    if edit:
        for source in (path / "containers" / "edfs").glob("*.yaml"):
            text = source.read_text()
            if "\nedf:" not in text:
                continue  # a role that names an image only
            assert edit[0] in text
            source.write_text(text.replace(edit[0], edit[1]))
    return path


@pytest.fixture()
def root(tmp_path):
    return make_root(tmp_path / "catalog")


@pytest.fixture()
def dest(tmp_path):
    return tmp_path / "edf"


def statuses(results):
    return {r.path.name: r.status for r in results}


def snapshot(folder: Path) -> dict[str, tuple[str, int, int]]:
    return {p.name: (p.read_text(), p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


# ---------------------------------------------------------------------------------------------
# library


def test_first_install_writes_every_variant(root, dest):
    results = edfinstall.install(root, dest, environ={})
    assert statuses(results) == {name: "written" for name in NAMES}
    assert sorted(p.name for p in dest.iterdir()) == NAMES
    for r in results:
        topology = r.topologies[0]
        assert r.path.read_text() == edf.render_edf(r.role, topology, root)
        assert stat.S_IMODE(r.path.stat().st_mode) == 0o644


def test_second_install_changes_nothing(root, dest):
    edfinstall.install(root, dest, environ={})
    before = snapshot(dest)
    results = edfinstall.install(root, dest, environ={})
    assert statuses(results) == {name: "unchanged" for name in NAMES}
    assert snapshot(dest) == before  # same bytes, same inode, same mtime: not rewritten


def test_install_replaces_an_older_render_of_its_own(tmp_path, dest):
    old = make_root(tmp_path / "old", edit=("/.cache/huggingface", "/hf-old"))
    new = make_root(tmp_path / "new")
    edfinstall.install(old, dest, environ={})
    results = edfinstall.install(new, dest, environ={})
    assert statuses(results) == {name: "written" for name in NAMES}
    assert {r.reason for r in results} == {"replaced an older render"}
    assert all("-HF_HOME = \"${SCRATCH}/hf-old\"" in r.diff for r in results)
    assert all(r.path.read_text() == edf.render_edf(r.role, r.topologies[0], new) for r in results)


def test_file_not_written_by_the_tool_is_kept(root, dest):
    dest.mkdir()
    mine = dest / "hpcagent-bench-vllm-mi300-latest.toml"
    mine.write_text('image = "/my/own.sqsh"\n')
    results = {r.path.name: r for r in edfinstall.install(root, dest, environ={})}
    r = results[mine.name]
    assert (r.status, r.reason) == ("differs", "not written by env_layers")
    assert mine.read_text() == 'image = "/my/own.sqsh"\n'
    assert '-image = "/my/own.sqsh"' in r.diff
    assert '+image = "${SCRATCH}/ce-images/vllm-openai-rocm_v0.28.0.sqsh"' in r.diff
    assert all(x.status == "written" for name, x in results.items() if name != mine.name)


def test_file_edited_since_install_is_kept(root, dest):
    edfinstall.install(root, dest, environ={})
    path = dest / "hpcagent-bench-sglang-mi300-latest-intranode.toml"
    edited = path.read_text().replace('NCCL_NET = ""', 'NCCL_NET = "Socket"')
    path.write_text(edited)
    results = {r.path.name: r for r in edfinstall.install(root, dest, environ={})}
    r = results[path.name]
    assert (r.status, r.reason) == ("differs", "edited since env_layers wrote it")
    assert path.read_text() == edited
    assert '-NCCL_NET = "Socket"' in r.diff and '+NCCL_NET = ""' in r.diff


def test_force_overwrites_and_reports_it(root, dest):
    edfinstall.install(root, dest, environ={})
    path = dest / "hpcagent-bench-vllm-mi200-latest.toml"
    path.write_text(path.read_text() + "# my note\n")
    results = {r.path.name: r for r in edfinstall.install(root, dest, force=True, environ={})}
    r = results[path.name]
    assert (r.status, r.reason) == ("overwritten", "edited since env_layers wrote it")
    assert "-# my note" in r.diff
    assert path.read_text() == edf.render_edf("vllm-mi200", "pipeline", root)
    assert statuses(edfinstall.install(root, dest, environ={})) == {name: "unchanged" for name in NAMES}


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_symlink_is_never_replaced(root, dest, tmp_path, force):
    dest.mkdir()
    elsewhere = tmp_path / "shared.toml"
    elsewhere.write_text('image = "/x.sqsh"\n')
    link = dest / "hpcagent-bench-vllm-mi300-latest.toml"
    link.symlink_to(elsewhere)
    r = {r.path.name: r for r in edfinstall.install(root, dest, force=force, environ={})}[link.name]
    assert (r.status, r.reason, r.force_replaces) == (
        "differs", f"a symbolic link to {elsewhere} (it may point into a shared folder): never replaced; "
        "remove the link, or install with --dest", False)
    assert link.is_symlink() and elsewhere.read_text() == 'image = "/x.sqsh"\n'


def _link_report(root, dest, target, force):
    dest.mkdir()
    link = dest / "hpcagent-bench-vllm-mi300-latest.toml"
    link.symlink_to(target)
    args = ["--root", str(root), "install-edfs", "--dest", str(dest)] + (["--force"] if force else [])
    out = run_cli(args, env={"SCRATCH": None})
    line = " ".join(next(x for x in out.output.splitlines() if link.name in x).split())
    return out, line, link


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_cli_symlink_report_never_suggests_force(root, dest, tmp_path, force):
    elsewhere = tmp_path / "shared.toml"
    elsewhere.write_text('image = "/x.sqsh"\n')
    out, line, link = _link_report(root, dest, elsewhere, force)
    assert out.exit_code == 1, out.output
    assert line == (f"differs {link.name} pipeline: a symbolic link to {elsewhere} (it may point into a "
                    "shared folder): never replaced; remove the link, or install with --dest")
    assert "--force" not in out.output.replace("with or without --force", "")
    assert ("1 EDF is a symbolic link that env_layers does not replace, with or without --force: remove it, "
            "or install with --dest.") in out.output


def test_cli_dangling_symlink_says_its_target_is_missing(root, dest, tmp_path):
    gone = tmp_path / "gone.toml"
    out, line, link = _link_report(root, dest, gone, False)
    assert out.exit_code == 1, out.output
    assert line == (f"differs {link.name} pipeline: a symbolic link to {gone}, which does not exist: "
                    "never replaced; remove the link, or install with --dest")
    assert "cannot be read" not in out.output and link.is_symlink() and not gone.exists()


def test_unwritable_target_is_a_clear_error(root, dest):
    (dest / "hpcagent-bench-vllm-mi300-latest.toml").mkdir(parents=True)
    kept = {r.path.name: r for r in edfinstall.install(root, dest, environ={})}["hpcagent-bench-vllm-mi300-latest.toml"]
    assert (kept.status, kept.reason) == ("differs", "cannot be read (Is a directory)")
    with pytest.raises(edf.EdfError) as err:
        edfinstall.install(root, dest, force=True, environ={})
    assert str(err.value).startswith(f"{dest}: cannot write {dest}/hpcagent-bench-vllm-mi300-latest.toml: ")


def test_invalid_catalog_writes_nothing(root, dest):
    bad = root / "containers" / "edfs" / "vllm-mi200.yaml"
    bad.write_text(bad.read_text().replace("vllm/vllm-openai-rocm:v0.28.0", "vllm/vllm-openai-rocm:latest"))
    with pytest.raises(edf.EdfError, match="is tagged 'latest'"):
        edfinstall.install(root, dest, environ={})
    assert not dest.exists()


def test_missing_images_and_fetch_commands(root, dest, tmp_path):
    scratch = tmp_path / "scratch"
    (scratch / "ce-images").mkdir(parents=True)
    (scratch / "ce-images" / "vllm-openai-rocm_v0.28.0.sqsh").write_bytes(b"hsqs")
    results = edfinstall.install(root, dest, environ={"SCRATCH": str(scratch)}, cwd=root)
    by_role = {r.role: r for r in results}
    assert by_role["vllm-mi300"].image_present is True and by_role["vllm-mi300"].fetch_command is None
    assert by_role["vllm-mi200"].image_present is True
    sglang = by_role["sglang-mi300"]
    assert sglang.image_present is False
    assert sglang.image_path == scratch / "ce-images" / "sglang-rocm_v0.5.20-rocm724-mi30x-20260919.sqsh"
    assert sglang.fetch_command == "sbatch containers/registry.sbatch pull sglang-mi300"


def test_fetch_command_from_outside_the_checkout(root, tmp_path):
    assert edf.fetch_command("vllm-mi300", root, cwd=tmp_path / "elsewhere") == (
        f"sbatch {root.resolve()}/containers/registry.sbatch pull vllm-mi300"
    )


def test_images_unchecked_without_scratch(root, dest):
    results = edfinstall.install(root, dest, environ={})
    assert {(r.image_path, r.image_present, r.fetch_command) for r in results} == {(None, None, None)}


def test_stale_temporary_file_of_a_dead_process_is_removed(root, dest):
    dest.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = dest / f".envlayers-tmp-{os.uname().nodename}-{dead.pid}-x.toml.abc.tmp"
    stale.write_text("partial")
    other_host = dest / ".envlayers-tmp-otherhost-1-x.toml.abc.tmp"
    other_host.write_text("partial")
    edfinstall.install(root, dest, environ={})
    assert not stale.exists()
    assert other_host.exists()  # another host's process may still be writing it


# ---------------------------------------------------------------------------------------------
# kill -9 at many points: every EDF is the old file or the new one, never a part

_SLOW_INSTALL = """
import os, sys, time
from pathlib import Path
import envlayers.edf as e
import envlayers.edfinstall as i
import envlayers.fsutil as f

def slow_write_all(fd, data):
    for i in range(0, len(data), 96):
        os.write(fd, data[i:i + 96])
        time.sleep(0.0005)

real_replace = f._replace
def slow_replace(src, dst):
    time.sleep(0.002)
    real_replace(src, dst)
    time.sleep(0.002)

f._write_all, f._replace = slow_write_all, slow_replace
e.load_catalog(Path(sys.argv[1]))  # warm imports and parse before saying ready
print("ready", flush=True)
i.install(Path(sys.argv[1]), Path(sys.argv[2]), environ={})
print("done", flush=True)
"""


def _prepare(tmp_path):
    old_root = make_root(tmp_path / "old", edit=("/.cache/huggingface", "/hf-old"))
    new_root = make_root(tmp_path / "new")
    pristine = tmp_path / "pristine"
    edfinstall.install(old_root, pristine, environ={})
    absent = "hpcagent-bench-vllm-mi300-latest-intranode.toml"  # one EDF the install creates
    (pristine / absent).unlink()
    old = {p.name: p.read_text() for p in pristine.iterdir()}
    new = {n: edf.render_edf(r, t, new_root) for n, r, t in _every_edf(new_root)}
    assert set(old) | {absent} == set(new) and all(old[n] != new[n] for n in old)
    return new_root, pristine, old, new


def _every_edf(root):
    for role in edf.roles(root):
        if not edf.load_catalog(root)[role].edf:
            continue  # a role that names an image only has no EDF
        for topology in ("pipeline", "single"):
            yield f"{edf.edf_name(role, topology, root)}.toml", role, topology


def _reset(dest: Path, pristine: Path):
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(pristine, dest)


def _check(dest: Path, old: dict, new: dict) -> int:
    """Assert old-or-new for every EDF; return how many are new."""
    got = {p.name: p.read_text() for p in dest.iterdir() if p.name.endswith(".toml")}
    assert set(got) <= set(new), f"unexpected files: {set(got) - set(new)}"
    for name in new:
        if name not in got:
            assert name not in old, f"{name} vanished"
        else:
            assert got[name] in (old.get(name), new[name]), f"{name} is neither the old nor the new file"
    leftovers = [p.name for p in dest.iterdir() if not p.name.endswith(".toml")]
    assert all(p.startswith(".envlayers-tmp-") and p.endswith(".tmp") for p in leftovers), leftovers
    return sum(got.get(name) == new[name] for name in new)


def _start(new_root: Path, dest: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_INSTALL, str(new_root), str(dest)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_kill_9_during_install_leaves_old_or_new(tmp_path):
    new_root, pristine, old, new = _prepare(tmp_path)
    dest = tmp_path / "dest"

    # how long an uninterrupted install takes, from "ready" to exit
    _reset(dest, pristine)
    proc = _start(new_root, dest)
    t0 = time.perf_counter()
    assert proc.wait(timeout=30) == 0
    duration_s = time.perf_counter() - t0
    assert _check(dest, old, new) == len(new)

    kills = 16
    seen_new_counts = set()
    for i in range(kills):
        _reset(dest, pristine)
        proc = _start(new_root, dest)
        time.sleep(duration_s * (i + 0.5) / kills)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        seen_new_counts.add(_check(dest, old, new))
        proc.stdout.close()

    # the kills landed across the install, not all before or after it
    assert len(seen_new_counts) >= 3, seen_new_counts

    # and a later install completes the job from whatever state a kill left
    result = edfinstall.install(new_root, dest, environ={})
    assert _check(dest, old, new) == len(new)
    assert {r.status for r in result} <= {"written", "unchanged"}
    assert [p.name for p in dest.iterdir() if not p.name.endswith(".toml")] == []


# ---------------------------------------------------------------------------------------------
# CLI, in process


def run_cli(args, env=None):
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


def test_cli_install_report_and_idempotency(root, dest):
    first = run_cli(["--root", str(root), "install-edfs", "--dest", str(dest)], env={"SCRATCH": None})
    assert first.exit_code == 0, first.output
    assert f"EDFs in {dest}:" in first.output
    assert "  written     hpcagent-bench-sglang-mi300-latest.toml            pipeline\n" in first.output
    assert "  written     hpcagent-bench-sglang-mi300-latest-intranode.toml  single, replicas\n" in first.output
    assert "Not checked (a variable in the path is not set): ${SCRATCH}/ce-images/vllm-openai-rocm_v0.28.0.sqsh" in first.output
    second = run_cli(["--root", str(root), "install-edfs", "--dest", str(dest)], env={"SCRATCH": None})
    assert second.exit_code == 0
    assert second.output.count("  unchanged   ") == 6 and "written" not in second.output


def test_cli_differs_exits_1_and_force_fixes_it(root, dest):
    run_cli(["--root", str(root), "install-edfs", "--dest", str(dest)])
    path = dest / "hpcagent-bench-vllm-mi300-latest.toml"
    path.write_text(path.read_text().replace("rocm6", "rocm5"))
    kept = run_cli(["--root", str(root), "install-edfs", "--dest", str(dest)])
    assert kept.exit_code == 1
    assert (
        "  differs     hpcagent-bench-vllm-mi300-latest.toml              pipeline: "
        "edited since env_layers wrote it; kept (--force replaces it)\n"
    ) in kept.output
    assert '      -variant = "rocm5"\n      +variant = "rocm6"\n' in kept.output
    assert "1 EDF differs from what env_layers renders and was kept; rerun with --force" in kept.output
    forced = run_cli(["--root", str(root), "install-edfs", "--dest", str(dest), "--force"])
    assert forced.exit_code == 0
    assert "  overwritten hpcagent-bench-vllm-mi300-latest.toml" in forced.output
    assert path.read_text() == edf.render_edf("vllm-mi300", "pipeline", root)


def test_cli_missing_images_with_commands(root, dest, tmp_path, monkeypatch):
    monkeypatch.chdir(root)
    scratch = tmp_path / "scratch"
    out = run_cli(["install-edfs", "--dest", str(dest)], env={"SCRATCH": str(scratch), "ENVLAYERS_ROOT": None})
    assert out.exit_code == 0, out.output
    assert (
        f"Missing images (each fetched by its command):\n"
        f"  {scratch}/ce-images/sglang-rocm_v0.5.20-rocm724-mi30x-20260919.sqsh  "
        f"(sglang-mi300: lmsysorg/sglang-rocm:v0.5.20-rocm724-mi30x-20260919)\n"
        f"    sbatch containers/registry.sbatch pull sglang-mi300\n"
        f"  {scratch}/ce-images/vllm-openai-rocm_v0.28.0.sqsh  (vllm-mi200, vllm-mi300: vllm/vllm-openai-rocm:v0.28.0)\n"
        f"    sbatch containers/registry.sbatch pull vllm-mi200\n"
    ) in out.output


def test_cli_json(root, dest, tmp_path):
    out = run_cli(
        ["--root", str(root), "install-edfs", "--dest", str(dest), "--json"],
        env={"SCRATCH": str(tmp_path / "scratch")},
    )
    assert out.exit_code == 0
    report = json.loads(out.output)
    assert report["ok"] is True and report["dest"] == str(dest)
    assert sorted(Path(r["path"]).name for r in report["results"]) == NAMES
    assert {r["status"] for r in report["results"]} == {"written"}
    assert sorted(m["remote_image"] for m in report["missing_images"]) == [
        "lmsysorg/sglang-rocm:v0.5.20-rocm724-mi30x-20260919",
        "vllm/vllm-openai-rocm:v0.28.0",
    ]


def test_cli_default_dest_is_first_edf_path_folder(root, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    out = run_cli(["--root", str(root), "install-edfs"], env={"EDF_PATH": f"{first}:{second}"})
    assert out.exit_code == 0, out.output
    assert sorted(p.name for p in first.iterdir()) == NAMES and not second.exists()


def test_cli_edf_show(root):
    out = run_cli(["--root", str(root), "edf", "show", "vllm-mi200", "--topology", "replicas"])
    assert out.exit_code == 0
    assert out.output == edf.render_edf("vllm-mi200", "replicas", root)
    assert out.output.startswith("# hpcagent-bench-vllm-mi200-latest-intranode: ")
    default = run_cli(["--root", str(root), "edf", "show", "vllm-mi200"])
    assert default.output == edf.render_edf("vllm-mi200", "pipeline", root)


def test_cli_edf_show_unknown_role(root):
    out = CliRunner().invoke(cli, ["--root", str(root), "edf", "show", "sglang-mi200"])
    assert out.exit_code == 2
    assert out.output.endswith(
        "env_layers: error: containers/edfs: unknown container role 'sglang-mi200'; "
        "hint: did you mean 'sglang-mi300'? roles: sglang-h100, sglang-mi300, vllm-h100, vllm-mi200, vllm-mi300\n"
    )


def test_cli_edf_list(root):
    out = run_cli(["--root", str(root), "edf", "list", "--json"])
    rows = {row["role"]: row for row in json.loads(out.output)}
    assert rows["sglang-mi300"]["edfs"] == {
        "single": "hpcagent-bench-sglang-mi300-latest-intranode",
        "replicas": "hpcagent-bench-sglang-mi300-latest-intranode",
        "pipeline": "hpcagent-bench-sglang-mi300-latest",
    }
    text = run_cli(["--root", str(root), "edf", "list"]).output
    assert "  image:     vllm/vllm-openai-rocm:v0.28.0\n" in text


def test_cli_edf_image_shell(root):
    out = run_cli(["--root", str(root), "edf", "image", "vllm-mi300", "--shell"], env={"SCRATCH": "/s"})
    assert out.output == (
        "role=vllm-mi300\n"
        "remote_image=vllm/vllm-openai-rocm:v0.28.0\n"
        "enroot_uri=docker://vllm/vllm-openai-rocm:v0.28.0\n"
        "squashfs=/s/ce-images/vllm-openai-rocm_v0.28.0.sqsh\n"
        f"root={root.resolve()}\n"
        "roles_sharing='vllm-mi200 vllm-mi300'\n"
    )


def test_cli_edf_image_needs_scratch(root):
    out = CliRunner().invoke(cli, ["--root", str(root), "edf", "image", "vllm-mi300", "--json"], env={"SCRATCH": None})
    assert out.exit_code == 2
    assert "containers/edfs/vllm-mi300.yaml: edf.image: ${SCRATCH} is not set" in out.output


# ---------------------------------------------------------------------------------------------
# real subprocesses: the console entry and registry.sbatch


def _env(root: Path, **extra) -> dict[str, str]:
    drop = ("SLURM_", "SBATCH_", "EDF_PATH", "ENVLAYERS_CLI", "SUBMIT", "FORCE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(ENVLAYERS_ROOT=str(root), PYTHON=sys.executable, **extra)
    return env


def test_install_edfs_entry_point_in_a_subprocess(root, dest):
    cmd = [sys.executable, "-c", "from envlayers.cli import install_edfs_main; install_edfs_main()", "--dest", str(dest)]
    first = subprocess.run(cmd, env=_env(root), capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("  written     ") == 6
    (dest / "hpcagent-bench-vllm-mi300-latest.toml").write_text("# mine\n")
    second = subprocess.run(cmd, env=_env(root), capture_output=True, text=True, timeout=60)
    assert second.returncode == 1
    assert "not written by env_layers; kept (--force replaces it)" in second.stdout


SCRIPT = REPO / "containers" / "registry.sbatch"


def test_registry_pull_submit_0_prints_the_commands(root, tmp_path):
    scratch = tmp_path / "scratch"
    out = subprocess.run(
        ["bash", str(SCRIPT), "pull", "sglang-mi300"],
        env=_env(root, SUBMIT="0", SCRATCH=str(scratch)),
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    target = f"{scratch}/ce-images/sglang-rocm_v0.5.20-rocm724-mi30x-20260919.sqsh"
    assert out.stdout == (
        "role:   sglang-mi300 (this SquashFS serves: sglang-mi300)\n"
        "image:  lmsysorg/sglang-rocm:v0.5.20-rocm724-mi30x-20260919\n"
        f"target: {target}\n"
        f"sbatch: sbatch --job-name=envlayers-pull-sglang-mi300 --export=ALL,ENVLAYERS_ROOT={root.resolve()} "
        f"{SCRIPT} pull sglang-mi300\n"
        f"enroot: enroot import -x mount -o {target}.partial.sglang-mi300 "
        "docker://lmsysorg/sglang-rocm:v0.5.20-rocm724-mi30x-20260919\n"
        f"then:   mv -f {target}.partial.sglang-mi300 {target}\n"
    )
    assert not scratch.exists()  # printed, nothing done


def test_registry_pull_unknown_role_fails(root, tmp_path):
    out = subprocess.run(
        ["bash", str(SCRIPT), "pull", "vllm-mi250"],
        env=_env(root, SUBMIT="0", SCRATCH=str(tmp_path)),
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 2
    assert "unknown container role 'vllm-mi250'" in out.stderr


def _fake_bin(tmp_path: Path) -> Path:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {tmp_path}/sbatch.args\necho "Submitted batch job 42"\n')
    # stands in for enroot: writes the -o file, as enroot import does
    (fake / "enroot").write_text('#!/bin/bash\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done\necho hsqs > "$out"\n')
    for tool in fake.iterdir():
        tool.chmod(0o755)
    return fake


def test_registry_pull_outside_a_job_submits_itself(root, tmp_path):
    fake = _fake_bin(tmp_path)
    out = subprocess.run(
        ["bash", str(SCRIPT), "pull", "vllm-mi200"],
        env=_env(root, SCRATCH=str(tmp_path / "scratch"), PATH=f"{fake}:{os.environ['PATH']}"),
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "Submitted batch job 42" in out.stdout
    assert (tmp_path / "sbatch.args").read_text().splitlines() == [
        "--job-name=envlayers-pull-vllm-mi200",
        f"--export=ALL,ENVLAYERS_ROOT={root.resolve()}",
        str(SCRIPT),
        "pull",
        "vllm-mi200",
    ]


def test_registry_pull_inside_a_job_imports_then_renames(root, tmp_path):
    fake = _fake_bin(tmp_path)
    scratch = tmp_path / "scratch"
    env = _env(root, SCRATCH=str(scratch), SLURM_JOB_ID="7", PATH=f"{fake}:{os.environ['PATH']}")
    out = subprocess.run(["bash", str(SCRIPT), "pull", "vllm-mi300"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    target = scratch / "ce-images" / "vllm-openai-rocm_v0.28.0.sqsh"
    assert target.read_text() == "hsqs\n"
    assert not Path(f"{target}.partial").exists()
    assert f"ENVLAYERS-STAGE: pull vllm-mi300: imported vllm/vllm-openai-rocm:v0.28.0 -> {target}" in out.stdout
    again = subprocess.run(["bash", str(SCRIPT), "pull", "vllm-mi200"], env=env, capture_output=True, text=True, timeout=60)
    assert again.stdout == f"already imported: {target} (FORCE=1 imports it again)\n"
