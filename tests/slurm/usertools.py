"""Two throw-away users on the local Slurm lab, and a Python they can run the launcher with.

Root's Python (and the editable install) usually live under /root, which other users cannot enter, so
:func:`user_python` builds an environment anyone can read and no one but root can change: a venv of
the system's /usr/bin/python3 holding a copy of what a job needs (src/, cluster/, experiments/,
containers/, tests/standin/) and of the runtime dependencies as installed for the running Python
(copied file by file from their installed records: no network). It is built once per source: the
folder's name is a hash of everything copied, so a changed checkout gets a fresh one.

:class:`Users` makes the users (``useradd --create-home``), runs commands as them (``runuser``), and
removes them with their home folders (``userdel -r``); processes it started as them are stopped by PID.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = Path("/usr/bin/python3")
# what a job reads from the project: the launcher, the submit script, the catalog, the container
# definitions and the test-only stand-in engine
PROJECT_PARTS = ("src/envlayers", "cluster", "experiments", "containers", "tests/standin")
RUNTIME_DISTS = ("click", "PyYAML", "Jinja2", "MarkupSafe", "tomli_w")
ENV_BASE = Path(os.environ.get("ENVLAYERS_USER_ENV_DIR", "/var/tmp/envlayers-user-env"))


class UsersUnavailable(Exception):
    """Two users cannot be made or used here (not root, no useradd, the lab unreachable to them...)."""


def _project_files() -> list[Path]:
    files = []
    for part in PROJECT_PARTS:
        for path in sorted((REPO / part).rglob("*")):
            if "__pycache__" in path.parts or path.suffix == ".pyc" or not path.is_file():
                continue
            files.append(path)
    return files


def _dist_files() -> list[tuple[Path, Path]]:
    """(installed file, path relative to site-packages) for every runtime dependency."""
    out = []
    for name in RUNTIME_DISTS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError as exc:
            raise UsersUnavailable(f"{name} is not installed for {sys.executable}") from exc
        for rel in dist.files or ():
            if "__pycache__" in rel.parts or rel.suffix == ".pyc" or rel.parts[0] == "..":
                continue
            src = Path(dist.locate_file(rel))
            if src.is_file():
                out.append((src, Path(rel)))
    return out


def _digest(project: list[Path], dists: list[tuple[Path, Path]]) -> str:
    h = hashlib.sha256()
    h.update(SYSTEM_PYTHON.resolve().as_posix().encode())
    for path in project:
        h.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for src, rel in dists:
        h.update(rel.as_posix().encode() + b"\0" + src.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _only_root_writes(path: Path) -> bool:
    st = path.lstat()
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


@dataclass(frozen=True)
class UserPython:
    """The shared environment: ``python`` (the venv's interpreter), ``root`` (the project copy: pass it as
    ENVLAYERS_ROOT or run ``root/cluster/serve-only.sbatch``), ``standin`` (its tests/standin)."""

    home: Path

    @property
    def python(self) -> Path:
        return self.home / "venv" / "bin" / "python3"

    @property
    def root(self) -> Path:
        return self.home / "project"

    @property
    def standin(self) -> Path:
        return self.root / "tests" / "standin"

    @property
    def sbatch(self) -> Path:
        return self.root / "cluster" / "serve-only.sbatch"


def user_python() -> UserPython:
    """The world-readable, root-owned environment for the current source, built when missing."""
    if not SYSTEM_PYTHON.exists():
        raise UsersUnavailable(f"{SYSTEM_PYTHON} is missing: the users need a Python outside /root")
    project, dists = _project_files(), _dist_files()
    ENV_BASE.mkdir(mode=0o755, exist_ok=True)
    if not _only_root_writes(ENV_BASE):  # a shared /var/tmp: someone else could have made it first
        raise UsersUnavailable(f"{ENV_BASE} is not a folder only root can change; remove it or set ENVLAYERS_USER_ENV_DIR")
    final = ENV_BASE / _digest(project, dists)
    if final.is_dir():
        return UserPython(final)
    work = Path(tempfile.mkdtemp(prefix="building-", dir=ENV_BASE))
    try:
        subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(work / "venv")], check=True,
                       capture_output=True, timeout=120)
        site = next((work / "venv" / "lib").glob("python3*/site-packages"))
        for src, rel in dists:
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, site / rel)
        for path in project:
            dest = work / "project" / path.relative_to(REPO)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
        (site / "envlayers-project.pth").write_text(f"{final / 'project' / 'src'}\n")
        for dirpath, dirnames, filenames in os.walk(work):
            os.chmod(dirpath, 0o755)
            for name in filenames:
                p = Path(dirpath, name)
                if not p.is_symlink():
                    p.chmod(0o755 if p.stat().st_mode & 0o100 else 0o644)
        try:
            os.rename(work, final)
        except OSError:  # another session built the same one meanwhile
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return UserPython(final)


@dataclass
class User:
    name: str
    uid: int
    gid: int
    home: Path


@dataclass
class Users:
    """Two users made for a module: ``victim`` submits jobs, ``attacker`` tries to harm them."""

    victim: User
    attacker: User
    py: UserPython
    lab_env: dict[str, str]
    _started: list[tuple[subprocess.Popen, User]] = field(default_factory=list)

    def env(self, user: User, **extra: str) -> dict[str, str]:
        """A clean login-like environment for ``user``: the shared Python and the stand-in engine first on
        PATH, the lab's SLURM_CONF, nothing of root's."""
        path = os.pathsep.join([str(self.py.python.parent), str(self.py.standin / "bin"), "/usr/local/bin",
                                "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
        return {"HOME": str(user.home), "USER": user.name, "LOGNAME": user.name, "PATH": path, "LANG": "C.UTF-8",
                "SLURM_CONF": self.lab_env["SLURM_CONF"], "PYTHONPATH": str(self.py.standin / "pypath"),
                "ENVLAYERS_STANDIN_DIR": str(self.py.standin), **extra}

    def argv(self, user: User, argv, env: dict[str, str] | None = None) -> list[str]:
        merged = self.env(user, **(env or {}))
        return ["runuser", "-u", user.name, "--", "env", "-i", *(f"{k}={v}" for k, v in merged.items()),
                *map(str, argv)]

    def run(self, user: User, argv, *, cwd=None, env=None, timeout_s: float = 90, input: str | None = None):
        """Run ``argv`` as ``user`` and wait; CompletedProcess (text)."""
        return subprocess.run(self.argv(user, argv, env), cwd=cwd or user.home, capture_output=True, text=True,
                              timeout=timeout_s, input=input)

    def start(self, user: User, argv, *, cwd=None, env=None, stdout=None) -> subprocess.Popen:
        """Start ``argv`` as ``user`` in the background; stopped by PID at teardown."""
        proc = subprocess.Popen(self.argv(user, argv, env), cwd=cwd or user.home, stdout=stdout or subprocess.DEVNULL,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self._started.append((proc, user))
        return proc

    def stop_started(self) -> None:
        """Stop what :meth:`start` started: its process group (runuser and what runs under it), by PID."""
        for proc, _user in self._started:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
        self._started.clear()


def _pids_of(uid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def make_users(lab_env: dict[str, str]):
    """Generator for a fixture: yields :class:`Users`; removes the users (and their homes) after, even when
    the test failed. Raises UsersUnavailable with the reason when it cannot run here."""
    if os.geteuid() != 0:
        raise UsersUnavailable("making two users needs root")
    for tool in ("useradd", "userdel", "runuser"):
        if not shutil.which(tool):
            raise UsersUnavailable(f"{tool} is not installed")
    py = user_python()
    tag = secrets.token_hex(3)
    made: list[User] = []
    users = None
    try:
        for role in ("victim", "attacker"):
            name = f"el{role[:6]}{tag}"
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True,
                           capture_output=True, timeout=60)
            pw = pwd.getpwnam(name)
            made.append(User(name, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir)))
        users = Users(victim=made[0], attacker=made[1], py=py, lab_env=lab_env)
        _check_reachable(users)
        yield users
    finally:
        if users is not None:
            users.stop_started()
        left = []
        for user in made:
            # the caller cancels the users' jobs first; their steps end with scancel, so wait for them
            deadline = time.monotonic() + 30
            while _pids_of(user.uid) and time.monotonic() < deadline:
                time.sleep(0.2)
            gone = subprocess.run(["userdel", "-r", user.name], capture_output=True, text=True, timeout=60)
            if gone.returncode not in (0, 12):  # 12: the home folder could not be removed entirely
                left.append(f"{user.name}: {gone.stderr.strip()} (processes: {_pids_of(user.uid)})")
        if left:
            raise RuntimeError("userdel failed: " + "; ".join(left))


def _check_reachable(users: Users) -> None:
    """The victim can run the launcher and reach the lab (slurm.conf, munge's socket): else nothing after
    could mean anything."""
    got = users.run(users.victim, [users.py.python, "-m", "envlayers", "--help"], cwd="/")
    if got.returncode != 0:
        raise UsersUnavailable(f"{users.victim.name} cannot run the launcher with {users.py.python}: "
                               f"{(got.stderr or got.stdout).strip()[-500:]}")
    got = users.run(users.victim, ["sinfo", "-h", "-o", "%P"], cwd="/")
    if got.returncode != 0:
        raise UsersUnavailable(f"{users.victim.name} cannot reach the lab ({users.lab_env['SLURM_CONF']}): "
                               f"{(got.stderr or got.stdout).strip()[-500:]}; the lab folder and its parents "
                               "must be readable by other users (ENVLAYERS_LAB_DIR outside /root)")
