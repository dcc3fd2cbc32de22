"""Inside the job: start the ranks, wait for readiness, report the endpoint, fail fast.

Runs on the first node of the allocation, outside the container, after the job script has
sourced the merged environment. It writes ``ranks.sh`` (pure bash: it also runs inside a
container), starts one srun step with one task per node, and then watches three things until
the job ends: each rank's exit file, the srun step itself, and the readiness probe. Any rank
that exits, the step dying, a rank that never starts, or a spent readiness budget ends the job
at once with an ``ENVLAYERS-ERROR:`` line, so no allocation idles on a dead server.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

RANK_UP = "ENVLAYERS-STAGE: rank {rank} up on "
DEFAULT_RANK_START_TIMEOUT_S = 300
POLL_S = 0.25
PROBE_EVERY_S = 0.5
CLAMP = 0.9
TAIL_LINES = 20
EXIT_SETTLE_S = 1.5
# exits that are usually srun stopping a rank because another one failed (SIGINT, SIGTERM, a clean
# stop); SIGKILL (137) is not among them: that is how the kernel's OOM killer ends a rank
STOPPED_CODES = {"0", "130", "143"}


def say(line: str) -> None:
    print(line, flush=True)


def rank_script(commands, run_dir: Path) -> str:
    """ranks.sh: SLURM_PROCID picks the rank's command; the exit code lands in rank-<r>.exit."""
    from .engines import quote

    arms = []
    for rank, cmd in enumerate(commands):
        exports = "".join(f"export {k}={quote(v)}; " for k, v in sorted(cmd.env.items()))
        arms.append(f"  {rank}) {exports}set -- {' '.join(quote(a) for a in cmd.argv)} ;;")
    rd = shlex.quote(str(run_dir))
    return "\n".join([
        "#!/bin/bash",
        "# One server rank per node; written by `env_layers launch`. SLURM_PROCID selects the command.",
        "set -u",
        "ulimit -c 0",
        'rank="${SLURM_PROCID:?not inside an srun step}"',
        f"run_dir={rd}",
        'echo "rank=${rank} limit=$(ulimit -c)" >> "$run_dir/core-limit.txt"',
        'log="$run_dir/server-${rank}.log"',
        "# engines print their arguments, the API key among them: mask it before it reaches the log",
        'if [ -n "${SERVER_API_KEY:-}" ]; then',
        '  exec > >(while IFS= read -r l || [ -n "$l" ]; do printf \'%s\\n\' "${l//"$SERVER_API_KEY"/***}"; done >> "$log") 2>&1',
        "else",
        '  exec >> "$log" 2>&1',
        "fi",
        'echo "ENVLAYERS-STAGE: rank ${rank} up on $(hostname)"',
        'case "$rank" in',
        *arms,
        '  *) echo "ENVLAYERS-ERROR: no command for rank ${rank}"; echo 2 > "$run_dir/rank-${rank}.exit"; exit 2 ;;',
        "esac",
        '"$@" &',
        "pid=$!",
        "trap 'kill -TERM \"$pid\" 2>/dev/null' TERM INT HUP",
        "while :; do",
        '  wait "$pid"; rc=$?',
        '  kill -0 "$pid" 2>/dev/null || break',
        "done",
        'echo "ENVLAYERS-STAGE: rank ${rank} exited with code ${rc}"',
        'echo "$rc" > "$run_dir/rank-${rank}.exit"',
        'exit "$rc"',
        "",
    ])


# what the job script itself exports besides the merged environment
JOB_SCRIPT_KEYS = ("ENVLAYERS_KEYS", "ENVLAYERS_TARGET", "ENVLAYERS_EDF", "ENVLAYERS_READY_TIMEOUT_S")


def launch_keys(environ: dict[str, str]) -> dict[str, str]:
    """The launch keys: exactly the keys the merged environment assigns (ENVLAYERS_KEYS, written by
    the job script), with the values the job's shell gave them (deferred references expanded). A
    variable merely exported in the submitting shell is not a launch key: sbatch passes the whole
    environment on, and the dry run would lie."""
    keys = environ.get("ENVLAYERS_KEYS", "").split()
    env = {k: environ[k] for k in keys if k in environ}
    env.update({k: environ[k] for k in JOB_SCRIPT_KEYS if k in environ})
    return env


def _tail(path: Path, n: int = TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ["(no log)"]
    return data.splitlines()[-n:]


def _address(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _int_env(environ, key: str, default: int) -> int:
    value = environ.get(key)
    return int(value) if value and value.strip().isdigit() else default


class Launch:
    def __init__(self, run_dir: Path, environ: dict[str, str]):
        self.run_dir = run_dir
        self.environ = environ
        self.job_id = environ.get("SLURM_JOB_ID", "0")
        self.proc: subprocess.Popen | None = None
        self.started: set[int] = set()
        self.first_exit_at: float | None = None
        self.keys = launch_keys(environ)
        self.t0 = time.monotonic()

    # -- setup -------------------------------------------------------------------------------
    def prepare(self):
        from . import engines, slurm, topology

        env = self.keys
        self.plan = topology.plan(env)
        for line in topology.topology_lines(self.plan):
            say(line)
        nodes = slurm.hostnames(self.environ.get("SLURM_JOB_NODELIST", ""))
        if len(nodes) != self.plan.nodes:
            raise LaunchFailure(f"allocation has {len(nodes)} node(s), expected {self.plan.nodes}: "
                                "an extra --nodes on the sbatch line? Slurm honours the last one")
        self.nodes = nodes
        self.addresses = [_address(n) for n in nodes]
        build_env = dict(env)
        if self.plan.shape == "pipeline":
            self.fabric(build_env)
        key_file = env.get("SERVER_API_KEY_FILE")
        self.api_key = None
        if key_file:
            try:
                self.api_key = Path(key_file).read_text(encoding="utf-8").strip()
            except OSError as err:
                raise LaunchFailure(f"cannot read SERVER_API_KEY_FILE {key_file}: {err.strerror}") from None
            build_env["SERVER_API_KEY"] = "${SERVER_API_KEY}"
        self.commands = engines.build_commands(self.plan, build_env, nodes[0])
        self.engine = engines.engine_name(env)
        self.served = env.get("VLLM_SERVED_MODEL", "")
        for rank, cmd in enumerate(self.commands):
            say(f"ENVLAYERS-STAGE: rank {rank} on {nodes[rank]}: {engines.shell_line(cmd)}")
        budget = _int_env(env, "ENVLAYERS_READY_TIMEOUT_S", 7200)
        left = slurm.remaining_s(self.job_id) if self.environ.get("SLURM_JOB_ID") else None
        if left is not None and budget > CLAMP * left:
            clamped = int(CLAMP * left)
            say(f"ENVLAYERS-WARN: readiness budget {budget}s exceeds the allocation; clamping to {clamped}s "
                f"(90% of the {left}s left)")
            budget = clamped
        self.budget_s = budget
        self.rank_start_s = _int_env(env, "ENVLAYERS_RANK_START_TIMEOUT", DEFAULT_RANK_START_TIMEOUT_S)
        say(f"ENVLAYERS-TOPOLOGY: readiness_budget={self.budget_s}s rank_start_budget={self.rank_start_s}s")
        (self.run_dir / "ranks.sh").write_text(rank_script(self.commands, self.run_dir), encoding="utf-8")
        (self.run_dir / "launch.json").write_text(json.dumps({
            "job_id": self.job_id, "target": env.get("ENVLAYERS_TARGET"), "engine": self.engine,
            "served_model_name": self.served, "shape": self.plan.shape, "nodes": nodes,
            "addresses": self.addresses, "ready_timeout_s": self.budget_s,
        }, indent=2) + "\n", encoding="utf-8")

    def fabric(self, build_env: dict[str, str]) -> None:
        """Name the head node's fabric interfaces, derive NCCL_SOCKET_IFNAME from them unless the
        layers set it, and stop before srun when a prefix the operator asked for matches nothing."""
        from . import fabric

        asked = build_env.get("ENVLAYERS_HSN_IFACE")
        prefix = asked or fabric.DEFAULT_PREFIX
        ifaces = fabric.local_ipv4()
        found = fabric.matching(ifaces, prefix)
        for name, addr in found:
            say(f"ENVLAYERS-TOPOLOGY: iface {name} {addr}")
        if not found:
            have = ", ".join(sorted(n for n, a in ifaces.items() if a and n != "lo")) or "none"
            if asked:
                raise LaunchFailure(f"no routable fabric IPv4 address on the head node: no interface "
                                    f"{prefix}<N> with an IPv4 address (have: {have}); check ENVLAYERS_HSN_IFACE")
            say(f"ENVLAYERS-WARN: no {prefix}<N> interface with an IPv4 address on the head node (have: {have}); "
                "NCCL picks its interface itself (set ENVLAYERS_HSN_IFACE to require one)")
            return
        if build_env.get("NCCL_SOCKET_IFNAME"):
            say(f"ENVLAYERS-TOPOLOGY: nccl_socket_ifname={build_env['NCCL_SOCKET_IFNAME']} (from the layers)")
            return
        # one leading "=" makes the whole list exact names (NCCL), so hsn0.561 stays out
        build_env["NCCL_SOCKET_IFNAME"] = "=" + ",".join(name for name, _ in found)
        say(f"ENVLAYERS-TOPOLOGY: nccl_socket_ifname={build_env['NCCL_SOCKET_IFNAME']} (derived)")

    def srun_argv(self) -> list[str]:
        n = str(self.plan.nodes)
        argv = ["srun", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1",
                f"--cpus-per-task={self.environ.get('SLURM_CPUS_ON_NODE', '1')}", "--kill-on-bad-exit=1"]
        edf = self.keys.get("ENVLAYERS_EDF")
        if edf:
            argv.append(f"--environment={edf}")
        return argv + ["bash", str(self.run_dir / "ranks.sh")]

    # -- run ---------------------------------------------------------------------------------
    def start(self) -> None:
        argv = self.srun_argv()
        say(f"ENVLAYERS-STAGE: starting {self.plan.nodes} rank(s): {shlex.join(argv)}")
        child_env = dict(self.environ)
        child_env.pop("SERVER_API_KEY", None)  # only SERVER_API_KEY_FILE sets a key
        if self.api_key:
            child_env["SERVER_API_KEY"] = self.api_key
        self.proc = subprocess.Popen(argv, env=child_env, start_new_session=True)

    def readiness_targets(self) -> list[tuple[int, str, str]]:
        out = []
        for r in self.plan.readiness_ranks():
            host, addr = self.nodes[r.node_index], self.addresses[r.node_index]
            out.append((r.rank, f"http://{host}:{r.port}/v1", f"http://{addr}:{r.port}/v1"))
        return out

    def check_ranks(self) -> None:
        for rank in range(self.plan.nodes):
            if rank in self.started:
                continue
            log = self.run_dir / f"server-{rank}.log"
            try:
                with open(log, encoding="utf-8", errors="replace") as fh:
                    first = fh.readline()
            except FileNotFoundError:
                continue
            if first.startswith(RANK_UP.format(rank=rank)):
                self.started.add(rank)
                say(first.strip())
                if len(self.started) == self.plan.nodes:
                    say(f"ENVLAYERS-STAGE: all {self.plan.nodes} ranks started")
        exits = []
        for rank in range(self.plan.nodes):
            exit_file = self.run_dir / f"rank-{rank}.exit"
            try:
                code = exit_file.read_text().strip() or "?"
                exits.append((code in STOPPED_CODES, exit_file.stat().st_mtime_ns, rank, code))
            except FileNotFoundError:
                continue
        if exits:
            now = time.monotonic()
            self.first_exit_at = self.first_exit_at or now
            if len(exits) < self.plan.nodes and now - self.first_exit_at < EXIT_SETTLE_S:
                return  # srun stops the other ranks on a bad exit: let their codes land too
            # the rank that failed first, not one that srun stopped because of it
            _, _, rank, code = min(exits)
            when = "after" if self.live else "before"
            others = ", ".join(f"rank {r} code {c}" for _, _, r, c in sorted(exits, key=lambda e: e[2]) if r != rank)
            raise LaunchFailure(f"rank {rank} on {self.nodes[rank]} exited with code {code} {when} the endpoint "
                                f"was live" + (f" (then: {others})" if others else ""), rank=rank)

    def run(self) -> int:
        from .readiness import Endpoint, probe

        self.live = False
        self.prepare()
        self.start()
        next_probe = 0.0
        targets = self.readiness_targets()
        ready: set[int] = set()
        last_probe: dict[int, str] = {}
        while True:
            self.check_ranks()
            code = self.proc.poll()
            if code is not None:
                deadline = time.monotonic() + EXIT_SETTLE_S + 0.5
                while time.monotonic() < deadline:
                    self.check_ranks()  # raises once the ranks' exit codes have landed
                    time.sleep(0.1)
                if len(self.started) < self.plan.nodes:
                    raise LaunchFailure(f"srun step exited with code {code} before all ranks started "
                                        f"({len(self.started)} of {self.plan.nodes}): a bind mount or cache path "
                                        "missing inside the container, or the EDF not found")
                raise LaunchFailure(f"srun step exited with code {code}")
            elapsed = time.monotonic() - self.t0
            if len(self.started) < self.plan.nodes and elapsed > self.rank_start_s:
                missing = sorted(set(range(self.plan.nodes)) - self.started)
                raise LaunchFailure(f"only {len(self.started)} of {self.plan.nodes} ranks started within "
                                    f"{self.rank_start_s}s (missing: {', '.join(map(str, missing))}): Slurm did "
                                    "not place them, or the run directory is not shared between nodes")
            if not self.live and time.monotonic() >= next_probe:
                next_probe = time.monotonic() + PROBE_EVERY_S
                for rank, _, url in targets:
                    if rank not in ready:
                        result = probe(url, self.served, self.api_key, timeout_s=2.0)
                        last_probe[rank] = result.detail
                        if result.ok:
                            ready.add(rank)
                if len(ready) == len(targets):
                    self.live = True
                    ep = Endpoint(self.job_id, self.served, self.environ.get("INFERENCE_MODEL", ""), self.engine,
                                  self.plan.shape, [u for _, u, _ in targets], bool(self.api_key),
                                  str(self.run_dir), round(elapsed, 1), list(self.nodes))
                    data = json.loads(ep.to_json())
                    # the node addresses behind base_urls, for hosts that cannot resolve node names
                    data["addresses"] = [self.addresses[r.node_index] for r in self.plan.readiness_ranks()]
                    tmp = self.run_dir / ".endpoint.json.tmp"
                    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
                    os.replace(tmp, self.run_dir / "endpoint.json")
                    say(f"ENVLAYERS-STAGE: endpoint live after {elapsed:.1f}s")
                    sys.stdout.write(ep.block())
                    sys.stdout.flush()
                elif elapsed > self.budget_s:
                    waiting = sorted(set(last_probe) - ready)
                    raise LaunchFailure(f"endpoint not live after {self.budget_s}s (readiness budget): "
                                        f"{len(ready)} of {len(targets)} answered; last probe of rank "
                                        f"{waiting[0]}: {last_probe[waiting[0]]}", rank=waiting[0])
            time.sleep(POLL_S)

    def stop(self, sig=signal.SIGTERM, grace_s: float = 8.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


class _Terminated(BaseException):
    """SIGTERM/SIGINT reached the launcher (BaseException: no `except Exception` swallows it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class LaunchFailure(Exception):
    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


def main(run_dir: Path, environ: dict[str, str] | None = None) -> int:
    environ = dict(os.environ if environ is None else environ)
    launch = Launch(run_dir, environ)
    launch.live = False

    def on_term(signum, _frame):
        raise _Terminated(signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    code = 0
    try:
        launch.run()
    except _Terminated as term:  # scancel or the time limit: the normal end of a serving job
        say(f"ENVLAYERS-STAGE: received signal {term.signum}; stopping the ranks")
        code = 128 + term.signum
    except LaunchFailure as err:
        say(f"ENVLAYERS-ERROR: {err}")
        if err.rank is not None:
            log = run_dir / f"server-{err.rank}.log"
            say(f"ENVLAYERS-ERROR: last {TAIL_LINES} lines of {log}:")
            for line in _tail(log):
                say(f"  | {line}")
        say(f"ENVLAYERS-STAGE: ending job {launch.job_id}; run `env_layers diagnose {launch.job_id}` for causes")
        code = 1
    except Exception as err:  # an EnvLayersError from planning, or a bug: say it, end the job
        say(f"ENVLAYERS-ERROR: launcher failed: {err}")
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the clean-up short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        launch.stop()
    return code if core_guard(run_dir, Path.cwd()) else 1


def core_guard(run_dir: Path, workdir: Path) -> bool:
    """Report core files in the ranks' working directory and the run directory, and fail when a rank
    ran with a core limit that is not 0 (the site core_pattern drops multi-GB cores in the CWD)."""
    from .cores import check_cores, find_core_files

    ok = True
    try:
        report = check_cores(run_dir)  # the ranks record their core limit there
        cores = list(report.cores)
        if workdir.resolve() != run_dir.resolve():
            cores += find_core_files(workdir)
        for c in cores:
            say(f"ENVLAYERS-WARN: core file left: {c.path} ({c.size_bytes} bytes)")
        for lim in report.bad_limits:
            say(f"ENVLAYERS-ERROR: rank {lim.rank} ran with core limit {lim.value}, not 0 ({lim.where})")
            ok = False
    except Exception as err:  # the guard must not turn a clean end into a crash
        say(f"ENVLAYERS-WARN: core check failed: {err}")
    return ok
