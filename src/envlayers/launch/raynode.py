"""One Ray node of a job's ``ray`` or ``gateway`` shape, run by ranks.sh on every node.

Copied into the run directory by the launcher (launch/raycluster.py) and run with the ranks' own
``python3``: it needs the standard library, plus Ray in the short-lived process that counts nodes.

    python3 raynode.py --rank R --run-dir D --job J --address HEAD:PORT --nodes N [--join-timeout S]
                       [--auth-token-file F] -- RAY_START_ARGV... [-- SERVER_ARGV...]

With ``--auth-token-file`` (the launcher always gives one) every process it starts runs with Ray's token
authentication on (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN_PATH=F``): the job's own token, the same file
on every node, so only the job's processes can join or use its Ray cluster. The token is read by Ray from
the file; it is on no command line and in no log.

It starts ``ray start ... --block`` in a process group of its own (with ``--temp-dir`` under /tmp,
one per job and rank), and records every process it started, and theirs, in ``ray-pids-<R>.txt``
(``PID STARTTIME NAME``). Rank 0 then waits, at most ``--join-timeout`` seconds, until the Ray head
reports ``N`` live nodes (``ENVLAYERS-ERROR`` naming the missing count when it does not), and starts
the server with ``RAY_ADDRESS`` set. It ends when Ray or the server ends, or on SIGTERM/SIGINT/SIGHUP
(then with the shell's code 128+N, also before every node joined), and then stops what it started by those
PIDs (SIGTERM, then SIGKILL after a grace period): never with ``ray stop``, which would end every Ray
process on the machine.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib

# run-directory files: envlayers/rundir.py owns their names (RAY_CLUSTER, RAY_PIDS_PREFIX, server_log_name);
# this script runs with the standard library only inside the job, so it repeats them (a test keeps them equal)
CLUSTER_FILE = "ray-cluster.json"
PIDS_FILE = "ray-pids-{rank}.txt"
SERVER_LOG = "server-{rank}.log"
KEY_VARS = ("VLLM_API_KEY", "SERVER_API_KEY")  # where ranks.sh puts the endpoint's API key
GRACE_S = 3.0  # the server's time to exit on SIGTERM; Slurm's KillWait is often 5 s or more
POLL_S = 0.5
SETTLE_S = 120.0
SCAN_LATER_S = 2.0


def say(line: str) -> None:
    print(line, flush=True)


def proc_stat(pid: int) -> tuple[int, int, int, str] | None:
    """(ppid, pgid, starttime, name) of a live process, from /proc/PID/stat; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    name = text[text.find("(") + 1:text.rfind(")")]
    fields = text[text.rfind(")") + 2:].split()
    if fields[0] in ("Z", "X"):  # a zombie is gone for every purpose here
        return None
    return int(fields[1]), int(fields[2]), int(fields[19]), name


def alive(pid: int, start: int) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` (not a reused PID)."""
    st = proc_stat(pid)
    return st is not None and st[2] == start


class Tracker:
    """The processes this node started: our children and their descendants, and anything left in the
    process groups we created. Every one found is appended to the PID file once."""

    def __init__(self, path: str):
        self.path = path
        self.seen: dict[int, int] = {}  # pid -> starttime
        self.names: dict[int, str] = {}
        self.groups: set[int] = set()
        self.lock = threading.Lock()
        open(path, "a").close()

    def scan(self) -> None:
        me = os.getpid()
        table = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                st = proc_stat(int(entry))
                if st is not None:
                    table[int(entry)] = st
        ours, groups = {me}, set(self.groups)
        changed = True
        while changed:
            changed = False
            for pid, (ppid, pgid, _, _) in table.items():
                if pid not in ours and (ppid in ours or pgid in groups):
                    ours.add(pid)
                    changed = True
        ours.discard(me)
        with self.lock:
            # again when the name changed: a child keeps its parent's name until it execs
            new = [(p, table[p]) for p in sorted(ours)
                   if self.seen.get(p) != table[p][2] or self.names.get(p) != table[p][3]]
            if not new:
                return
            with open(self.path, "a", encoding="utf-8") as fh:
                for pid, (_, _, start, name) in new:
                    self.seen[pid], self.names[pid] = start, name
                    fh.write(f"{pid} {start} {name}\n")

    def living(self) -> list[int]:
        with self.lock:
            return [p for p, s in self.seen.items() if alive(p, s)]


class Node:
    def __init__(self, opts: dict, ray_argv: list[str], server_argv: list[str]):
        self.rank = int(opts["rank"])
        self.run_dir = opts["run-dir"]
        self.address = opts["address"]
        self.nodes = int(opts["nodes"])
        self.join_timeout = float(opts.get("join-timeout") or 300)
        # short (Ray's socket paths must fit 107 bytes) and unique even where two test clusters share /tmp
        # and job IDs: the run directory's checksum
        tag = f"{zlib.crc32(os.path.abspath(self.run_dir).encode()):08x}"
        self.temp_dir = f"/tmp/envlayers-ray-{opts['job']}-{self.rank}-{tag}"
        self.ray_argv = [*ray_argv[:-1], f"--temp-dir={self.temp_dir}", ray_argv[-1]] if ray_argv[-1:] == [
            "--block"] else [*ray_argv, f"--temp-dir={self.temp_dir}"]
        self.server_argv = server_argv
        self.env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        token_file = opts.get("auth-token-file")
        if token_file:  # Ray's token authentication, with the job's token (Ray reads it from the file)
            self.env.pop("RAY_AUTH_TOKEN", None)  # Ray would prefer a token from the environment
            self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=os.path.abspath(token_file))
        self.token_file = token_file
        # Ray's own processes (ray start, its raylet, GCS and workers, the node count) never carry the API
        # key: only the server this node runs gets it (vLLM's API server); the gateway's replicas read it
        # from the key file (gateway_app.py --api-key-file)
        self.ray_env = {k: v for k, v in self.env.items() if k not in KEY_VARS}
        # this node's address, for Ray and for vLLM's workers on it (vLLM wants a VLLM_HOST_IP per node)
        given = [a.split("=", 1)[1] for a in self.ray_argv if a.startswith("--node-ip-address=")]
        # the launcher gives every multi-node rank VLLM_HOST_IP, its node's address (engines/vllm.py)
        ip = given[0] if given else (os.environ.get("VLLM_HOST_IP") or local_ip_towards(self.address))
        if ip:
            if not given:
                self.ray_argv.insert(self.ray_argv.index("start") + 1 if "start" in self.ray_argv else 0,
                                     f"--node-ip-address={ip}")
            self.env["VLLM_HOST_IP"] = ip
        self.tracker = Tracker(os.path.join(self.run_dir, PIDS_FILE.format(rank=self.rank)))
        self.ray: subprocess.Popen | None = None
        self.server: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.signum = 0

    def spawn(self, argv: list[str], env: dict, death_signal: int = signal.SIGKILL) -> subprocess.Popen:
        """A child in a process group of its own, sent ``death_signal`` by the kernel if this process dies
        first (even by SIGKILL), so nothing it started outlives the rank. Main thread only: the kernel
        sends it when the forking *thread* ends."""
        proc = subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=lambda: _die_with_parent(death_signal))
        self.tracker.groups.add(proc.pid)
        self.guard.group(proc.pid)
        self.tracker.scan()
        return proc

    def watch(self) -> None:
        """Record new processes: every POLL_S while the node starts, every SCAN_LATER_S once settled
        (reading every /proc/PID/stat costs a little on a busy node)."""
        t0 = time.monotonic()
        while not self.stopping.is_set():
            self.tracker.scan()
            self.stopping.wait(POLL_S if time.monotonic() - t0 < SETTLE_S else SCAN_LATER_S)

    def on_signal(self, signum, _frame) -> None:
        self.signum = signum
        self.stopping.set()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self.on_signal)
        problem = token_problem(self.token_file)
        if problem:  # Ray would abort on an unreadable or empty token file, less clearly
            say(f"ENVLAYERS-ERROR: ray: the job's Ray token {problem}")
            return 2
        self.guard = Guard.start(self.tracker.path, self.temp_dir, os.path.join(self.run_dir,
                                                                                SERVER_LOG.format(rank=self.rank)))
        role = "head" if self.rank == 0 else "worker"
        say(f"ENVLAYERS-STAGE: ray {role} node of rank {self.rank} starting (cluster {self.address}): "
            f"{shlex.join(self.ray_argv)}")
        try:
            self.ray = self.spawn(self.ray_argv, self.ray_env)
        except FileNotFoundError:
            self.guard.done()
            return self.missing(self.ray_argv[0], "Ray (`pip install 'ray[serve]'`)")
        threading.Thread(target=self.watch, daemon=True).start()
        try:
            if self.server_argv:
                code = self.wait_for_nodes()
                if code or self.stopping.is_set():
                    return code or self.signalled()
                try:
                    self.server = self.spawn(self.server_argv, dict(self.env, RAY_ADDRESS=self.address),
                                             signal.SIGTERM)
                except FileNotFoundError:
                    return self.missing(self.server_argv[0], "the server it names")
            return self.supervise()
        finally:
            self.stop()
            self.guard.done()

    def missing(self, program: str, what: str) -> int:
        """One line for a program the rank's image does not have, in place of Python's FileNotFoundError."""
        say(f"ENVLAYERS-ERROR: ray: {program} is not installed where rank {self.rank} runs (not on its PATH): the "
            f"ray and gateway shapes need {what} in the image (and aiohttp for the gateway); use an image with "
            "them, or a shape without Ray (docs/topology.md)")
        return 2

    def wait_for_nodes(self) -> int:
        """Rank 0: until Ray reports every node, bounded; a counter in its own process (it imports Ray)."""
        t0 = time.monotonic()
        counter = self.spawn([sys.executable, os.path.abspath(__file__), "--count", self.address, str(self.nodes),
                              str(self.join_timeout)], self.ray_env)
        while counter.poll() is None:
            if self.stopping.wait(POLL_S):
                return 0
            if time.monotonic() - t0 > self.join_timeout + 30:  # ray.init itself hangs on a head that never answers
                say(f"ENVLAYERS-ERROR: ray: the Ray head at {self.address} did not answer within "
                    f"{self.join_timeout:.0f}s; 0 of {self.nodes} node(s) seen ({self.nodes} missing)")
                return 3
            if self.ray.poll() is not None:
                say(f"ENVLAYERS-ERROR: ray: the Ray head exited with code {self.ray.returncode} before every node "
                    f"joined (see the lines above)")
                return self.ray.returncode or 1
        if counter.returncode != 0:
            return counter.returncode
        took = round(time.monotonic() - t0, 1)
        say(f"ENVLAYERS-STAGE: ray: {self.nodes} of {self.nodes} node(s) joined the cluster at {self.address} "
            f"after {took:.1f}s; starting the server")
        record = os.path.join(self.run_dir, CLUSTER_FILE)
        with open(record + ".tmp", "w", encoding="utf-8") as fh:  # the launcher prints it once live
            json.dump({"address": self.address, "nodes": self.nodes, "joined_after_s": took}, fh)
        os.replace(record + ".tmp", record)
        return 0

    def supervise(self) -> int:
        while not self.stopping.wait(POLL_S):
            if self.server is not None and self.server.poll() is not None:
                code = self.server.returncode
                code = 128 - code if code < 0 else code  # killed by a signal: the shell's 128+N
                say(f"ENVLAYERS-STAGE: ray: the server exited with code {code}; stopping Ray")
                return code
            if self.ray.poll() is not None:
                say(f"ENVLAYERS-ERROR: ray: `ray start` of rank {self.rank} exited with code {self.ray.returncode}"
                    " (its node left the cluster)")
                return self.ray.returncode if self.ray.returncode > 0 else 1
        return self.signalled()

    def signalled(self) -> int:
        """The exit code of a node stopped by a signal: the shell's 128+N (0 when no signal came)."""
        return 128 + self.signum if self.signum else 0

    def stop(self) -> None:
        """The server first (SIGTERM, SIGKILL after GRACE_S), then Ray at once with SIGKILL: its process
        group and every recorded PID. Not SIGTERM for Ray: `ray start` answers it with a drain of up to
        30 s, longer than Slurm waits before it kills the step (KillWait), and a rank killed mid-stop
        would leave Ray behind. Then the temp dir goes."""
        self.stopping.set()
        self.tracker.scan()
        if self.server is not None:
            self.signal_group(self.server, signal.SIGTERM)
            deadline = time.monotonic() + GRACE_S
            while time.monotonic() < deadline and self.server.poll() is None:
                time.sleep(0.1)
            self.signal_group(self.server, signal.SIGKILL)
        self.tracker.scan()
        for proc in (self.server, self.ray):
            self.signal_group(proc, signal.SIGKILL)
        for pid in self.tracker.living():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and self.tracker.living():
            for proc in (self.server, self.ray):
                if proc is not None:
                    proc.poll()  # reap our own children
            time.sleep(0.1)
        left = self.tracker.living()
        for _ in range(3):  # a process in its last moments may still write a file there
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            time.sleep(0.1)
        if left:
            say(f"ENVLAYERS-WARN: ray: processes still alive after SIGKILL: {left}")
        else:
            say(f"ENVLAYERS-STAGE: ray node of rank {self.rank} stopped: none of the {len(self.tracker.seen)} "
                "process(es) it started is left")

    @staticmethod
    def signal_group(proc: subprocess.Popen | None, sig: int) -> None:
        if proc is None:
            return
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class Guard:
    """A process outside the rank's process tree that stops what this node started if the node helper
    itself is killed (srun ends a task with SIGKILL when it is signalled twice, as on scancel, and
    Slurm's process tracking by parent PID then misses the Ray agents a dead raylet leaves behind).
    It waits on a pipe: ``group PGID`` lines name the process groups, ``done`` ends it quietly, and
    end-of-file (the helper died) makes it SIGKILL those groups and every PID recorded in the PID file,
    sweep again for a moment, remove the temp dir, and say so in the rank's log."""

    def __init__(self, fd: int | None):
        self.fd = fd

    @classmethod
    def start(cls, pid_file: str, temp_dir: str, log: str) -> "Guard":
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # before any thread starts: forking is safe here
            os.close(write)
            try:
                os.setsid()
                if os.fork() == 0:  # the grandchild: reparented, out of the step's process tree
                    _guard(read, pid_file, temp_dir, log)
            finally:
                os._exit(0)
        os.close(read)
        os.waitpid(child, 0)
        return cls(write)

    def group(self, pgid: int) -> None:
        self._send(f"group {pgid}\n")

    def done(self) -> None:
        self._send("done\n")
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _send(self, text: str) -> None:
        if self.fd is not None:
            try:
                os.write(self.fd, text.encode())
            except OSError:
                pass


def _guard(fd: int, pid_file: str, temp_dir: str, log: str) -> None:
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the step's signals are for the helper; this one waits for its end
    null = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(null, std)
    groups, buf = set(), b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line == b"done":
                return
            if line.startswith(b"group "):
                groups.add(int(line.split()[1]))
    killed = set()
    for _ in range(6):  # SIGKILL is at once, but a dying parent's last child may appear in between
        try:
            with open(pid_file, encoding="utf-8") as fh:
                recorded = [tuple(map(int, line.split(" ", 2)[:2])) for line in fh if line.strip()]
        except OSError:
            recorded = []
        living = [pid for pid, start in recorded if alive(pid, start)]
        killed.update(living)
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in living:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.3)
    shutil.rmtree(temp_dir, ignore_errors=True)
    try:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"ENVLAYERS-STAGE: ray: the node helper was killed; its guard stopped {len(killed)} process(es) "
                     "it had started\n")
    except OSError:
        pass


def local_ip_towards(address: str) -> str | None:
    """The address this node reaches ``HOST:PORT`` from (a UDP socket's source address: no packet is sent)."""
    import socket

    host, _, port = address.rpartition(":")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((host, int(port)))
            return sock.getsockname()[0]
    except (OSError, ValueError):
        return None


def _prctl():
    """libc's prctl, looked up here in the parent: a child between fork and exec must not import or load
    anything (another thread may hold a lock it would wait on forever). None where there is none."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


PRCTL = _prctl()


def _die_with_parent(sig: int) -> None:
    if PRCTL is not None:  # not Linux: the PID record and the guard still stop the child
        PRCTL(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG


def token_problem(path: str | None) -> str | None:
    """Why the token file cannot be used (missing, empty, readable by others), or None."""
    if not path:
        return None
    try:
        st = os.stat(path)
        with open(path, encoding="utf-8") as fh:
            empty = not fh.read().strip()
    except OSError as err:
        return f"{path} cannot be read: {err.strerror}"
    if empty:
        return f"{path} is empty"
    if st.st_mode & 0o077:
        return f"{path} is readable by others (mode {st.st_mode & 0o777:04o}; the launcher writes it 0600)"
    return None


def count_nodes(address: str, want: int, timeout_s: float) -> int:
    """Connect to the head at ``address`` and wait until it reports ``want`` live nodes."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    import ray

    seen, last_err = 0, ""
    connected = False
    while time.monotonic() < deadline:
        try:
            if not connected:
                ray.init(address=address, logging_level="WARNING", log_to_driver=False)
                connected = True
            seen = sum(1 for n in ray.nodes() if n.get("Alive"))
            if seen >= want:
                ray.shutdown()
                return 0
        except Exception as err:  # the head's GCS is not up yet: retry until the deadline
            last_err = str(err).splitlines()[0] if str(err) else type(err).__name__
        time.sleep(1.0)
    missing = want - seen
    detail = "" if connected else f"; the head never answered ({last_err})"
    say(f"ENVLAYERS-ERROR: ray: {seen} of {want} node(s) joined the Ray cluster at {address} within "
        f"{timeout_s:.0f}s ({missing} missing){detail}; see the missing ranks' server-<rank>.log, or raise "
        "RAY_JOIN_TIMEOUT_S")
    return 3


def parse(argv: list[str]) -> tuple[dict, list[str], list[str]]:
    """``--name value ... -- RAY_START... [-- SERVER...]``."""
    if "--" not in argv:
        raise SystemExit("raynode.py: expected `-- RAY_START_ARGV...` after the options")
    cut = argv.index("--")
    head, rest = argv[:cut], argv[cut + 1:]
    if len(head) % 2 or not all(w.startswith("--") for w in head[::2]):
        raise SystemExit(f"raynode.py: options must be --name value pairs, got {head}")
    opts = {k[2:]: v for k, v in zip(head[::2], head[1::2])}
    missing = [k for k in ("rank", "run-dir", "job", "address", "nodes") if k not in opts]
    if missing:
        raise SystemExit(f"raynode.py: missing --{', --'.join(missing)}")
    if "--" in rest:
        cut = rest.index("--")
        return opts, rest[:cut], rest[cut + 1:]
    return opts, rest, []


def main(argv: list[str]) -> int:
    if argv[:1] == ["--count"]:
        return count_nodes(argv[1], int(argv[2]), float(argv[3]))
    opts, ray_argv, server_argv = parse(argv)
    if not ray_argv:
        raise SystemExit("raynode.py: no `ray start` command after `--`")
    return Node(opts, ray_argv, server_argv).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
