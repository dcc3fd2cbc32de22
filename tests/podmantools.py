"""Real podman for the tests: the test-only configuration and a stand-in engine image built offline.

This machine's podman needs the runc runtime, the cgroupfs manager and no default ulimits (crun
cannot set RLIMIT_NOFILE here and does not support its cgroup mode); that lives in a containers.conf
handed to podman with CONTAINERS_CONF, in the tests only: real sites configure podman themselves.
No registry is reachable: :func:`build_standin_image` packs a minimal root filesystem (this host's
Python, its standard library and the libraries ldd names, plus tests/standin) and ``podman import``s it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "standin"
CONF = """[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
"""
PYTHON = Path("/usr/bin/python3")  # Debian's interpreter: its stdlib lives in /usr/lib/python3.X
_SKIP = {"test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "__pycache__", "dist-packages",
         "site-packages", "pydoc_data"}


def ensure_debian(programs: tuple[str, ...], packages: tuple[str, ...]) -> str | None:
    """None when every program is on PATH; else why not (installs Debian's ``packages`` as root first)."""
    if all(shutil.which(p) for p in programs):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return f"{' and '.join(programs)} not installed (Debian: apt-get install {' '.join(packages)})"
    proc = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if proc.returncode != 0 or not all(shutil.which(p) for p in programs):
        return f"apt-get install {' '.join(packages)} failed: {proc.stderr[-400:]}"
    return None


def ensure_podman() -> str | None:
    """None when podman and runc run here; else why not (installs Debian's packages as root)."""
    return ensure_debian(("podman", "runc"), ("podman", "runc"))


def podman_env(conf_dir: Path) -> dict[str, str]:
    """The environment podman needs on this machine (tests only): CONTAINERS_CONF."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    conf = conf_dir / "containers.conf"
    conf.write_text(CONF)
    return {"CONTAINERS_CONF": str(conf)}


def podman(*args: str, env: dict[str, str], timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["podman", *args], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout_s)
    if check and proc.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} exited {proc.returncode}: {proc.stderr[-800:]}")
    return proc


def _libs(binary: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30).stdout
    return [Path(p) for p in re.findall(r"(/\S+\.so[^\s]*)", out)]


def _copy(src: Path, root: Path) -> None:
    dest = root / src.relative_to("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not dest.exists():
        shutil.copy2(src.resolve(), dest)


def build_rootfs(root: Path) -> None:
    """This host's Python with its standard library and libraries, /usr/bin/env, and the stand-in."""
    real = PYTHON.resolve()
    version = real.name  # python3.11
    for binary in (real, Path("/usr/bin/env")):
        _copy(binary, root)
        for lib in _libs(binary):
            _copy(lib, root)
    (root / "usr/bin/python3").symlink_to(version)
    stdlib = Path("/usr/lib") / version
    shutil.copytree(stdlib, root / stdlib.relative_to("/"), symlinks=True,
                    ignore=lambda d, names: [n for n in names if n in _SKIP])
    for so in (root / stdlib.relative_to("/") / "lib-dynload").glob("*.so"):
        for lib in _libs(so):
            _copy(lib, root)
    for d in ("tmp", "etc", "proc", "sys", "dev", "run"):
        (root / d).mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    shutil.copytree(STANDIN, root / "opt/standin", ignore=shutil.ignore_patterns("__pycache__", "test_*.py"))


def build_standin_image(work: Path, ref: str, env: dict[str, str]) -> None:
    """``podman import`` a root filesystem holding the stand-in engine as ``ref`` (PATH finds vllm)."""
    root = work / "rootfs"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    build_rootfs(root)
    tar = work / "rootfs.tar"
    subprocess.run(["tar", "-C", str(root), "-cf", str(tar), "."], check=True, timeout=120)
    # the official vLLM image's entrypoint (vLLM's docker/Dockerfile: ENTRYPOINT ["vllm", "serve"]), so a
    # launcher that ran its own `vllm serve MODEL` after it would start `vllm serve vllm serve MODEL` here too
    podman("import", "--change", "ENV PATH=/opt/standin/bin:/usr/bin:/bin",
           "--change", "ENV PYTHONPATH=/opt/standin/pypath", "--change", 'ENTRYPOINT ["vllm", "serve"]',
           str(tar), ref, env=env)
