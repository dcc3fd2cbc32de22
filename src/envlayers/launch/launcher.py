"""The launcher's entry point inside the job: gather the facts, prepare, write, start, supervise, end.

Runs on the first node of the allocation, outside the container, after the job script has
sourced the merged environment. Everything decided is decided by ``prepare`` (pure); this module
does the side effects: it reads the allocation (node names and addresses, time left, interfaces,
the API key file), writes ranks.sh and launch.json, starts one srun step, runs the supervision
loop, writes endpoint.json once live, and on every orderly end writes launch-end.json (a job that
ended without one had its launcher killed).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .. import shell
from ..errors import KeyValueError, StepSignalled
from ..fsutil import atomic_write
from ..joblines import ERROR, LIVE, STAGE, TAIL_HEADER, UNRECORDED_END, WARN
from ..procgroup import stop_group
from ..rundir import (API_KEY, ENDPOINT, LAUNCH_END, RANK_EXIT_GLOB, RAY_TOKEN, EndpointRecord, LaunchEnd,
                      RecordWriter, server_log_name, write_api_key, write_json)
from .ports import ports_in_use
from .prepare import Allocation, LaunchFailure, LaunchPlan, Node, launch_keys, prepare
from .successor import HandedOver

TAIL_LINES = 20


def say(line: str) -> None:
    print(line, flush=True)


def _tail(path: Path, n: int = TAIL_LINES) -> list[str]:
    """The last lines of a rank's log, read by the one tail reader (tail.last_lines)."""
    from ..tail import last_lines

    try:
        return last_lines(path, n)
    except FileNotFoundError:
        return ["(no log)"]


def read_api_key(path: str) -> str:
    """The key in SERVER_API_KEY_FILE, read by the one reader (apikey.read_key: surrounding whitespace
    stripped, the safe character set). A missing, unreadable, empty or unsafe file stops the launch
    with an error naming it (the login node checks it too, before submission; this catches a file
    changed since)."""
    from ..apikey import read_key
    from ..errors import EnvLayersError

    try:
        return read_key(path)
    except EnvLayersError as err:
        raise LaunchFailure(str(err)) from None


def resolve_nodes(names: Sequence[str], resolve: Callable[[str], str] = socket.gethostbyname,
                  slurm_addrs: Callable[[Sequence[str]], Mapping[str, str]] | None = None) -> tuple[Node, ...]:
    """Each node's address: the host's resolver first; for a name that does not resolve, the NodeAddr
    Slurm has for it (``scontrol show node``), else the bare name."""
    resolved: dict[str, str] = {}
    for name in names:
        try:
            resolved[name] = resolve(name)
        except OSError:
            pass
    missing = [n for n in names if n not in resolved]
    addrs: Mapping[str, str] = {}
    if missing:
        if slurm_addrs is None:
            from ..slurm import node_addrs as slurm_addrs
        try:
            addrs = slurm_addrs(missing)
        except Exception:  # no scontrol here: fall back to the names
            addrs = {}
    return tuple(Node(n, resolved[n], True) if n in resolved else Node(n, addrs.get(n, n), False) for n in names)


def allocation(run_dir: Path, environ: Mapping[str, str]) -> Allocation:
    from .. import fabric, slurm

    job_id = environ.get("SLURM_JOB_ID", "0")
    names = slurm.hostnames(environ.get("SLURM_JOB_NODELIST", ""))
    left = slurm.remaining_s(job_id) if environ.get("SLURM_JOB_ID") else None
    from .. import keys
    from .prepare import RDZV_SCAN_PORTS

    start = keys.value(launch_keys(environ), "RDZV_PORT")  # a bad value: the same error the plan gives
    return Allocation(job_id=job_id, run_dir=run_dir, nodes=resolve_nodes(names),
                      cpus_on_node=environ.get("SLURM_CPUS_ON_NODE", "1"), time_left_s=left,
                      restart=restart_count(environ), ifaces=fabric.local_ipv4(),
                      busy_ports=ports_in_use(start, RDZV_SCAN_PORTS) if len(names) > 1 else frozenset())


def restart_count(environ: Mapping[str, str]) -> int:
    """SLURM_RESTART_COUNT: how often Slurm requeued this job (0 for its first run)."""
    value = environ.get("SLURM_RESTART_COUNT", "")
    return int(value) if value.strip().isdigit() else 0


class _Terminated(BaseException):
    """SIGTERM/SIGINT reached the launcher (BaseException: no `except Exception` swallows it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Launcher:
    """One launch: the side effects around ``prepare`` and the supervision loop."""

    def __init__(self, run_dir: Path, environ: Mapping[str, str]):
        self.run_dir = run_dir
        self.environ = dict(environ)
        self.keys = launch_keys(environ)
        from .pool import POOL_OF_ENV, member_keys

        self.pool_of = (self.environ.get(POOL_OF_ENV) or "").strip() or None  # a replica job of an elastic pool
        if self.pool_of is not None:
            self.keys = member_keys(self.keys)
        self.job_id = self.environ.get("SLURM_JOB_ID", "0")
        self.restart = restart_count(self.environ)
        self.proc: subprocess.Popen | None = None
        self.lp: LaunchPlan | None = None
        self.supervisor = None
        self.meter = None
        self.survivors = None  # launch.replicas.Survivors (replicas shape)
        self.chain = None  # launch.successor.Chain (SUCCESSORS)
        self.router = None  # launch.router.Router (ROUTER=smg, replicas shape): started once live
        self.pool = None  # launch.pool.Pool (MAX_REPLICAS): started once the router is live
        self.time_left_s: int | None = None  # the walltime left when the launch began (None: unlimited)
        self.records = RecordWriter(say)  # the records written once the ranks run: a refused write is said
        self.t0 = time.monotonic()

    def ranks(self) -> int:
        """How many ranks this launch plans (0 before its plan was made)."""
        return self.lp.ranks if self.lp is not None else 0

    @property
    def live(self) -> bool:
        return bool(self.supervisor and self.supervisor.live)

    def run(self) -> None:
        from .supervise import Supervisor
        from ..readiness import generates, probe

        alloc = allocation(self.run_dir, self.environ)
        self.time_left_s = alloc.time_left_s
        try:
            key_file, api_key = self.api_key()
        except OSError as err:
            raise self.unwritable(err, API_KEY) from None
        lp = self.lp = prepare(self.keys, dataclasses.replace(alloc, api_key=bool(api_key)))
        from .health import health_settings
        from .prepare import min_replicas
        from .replicas import survives

        self.health = health_settings(self.keys)  # bad values stop the launch before srun
        self.min_replicas = min_replicas(self.keys, lp.plan.replicas) if survives(lp) else 1
        for line in lp.lines:
            say(line)
        self.router = self.make_router(lp, api_key)  # ROUTER: refused before srun when the plan cannot have it
        from .meter import Meter
        from .timeline import job_start_time

        from .health import OwnRequests

        own = OwnRequests()  # the health watch's one-token completions, left out of the request counters
        self.meter = Meter(lp, self.keys, say, api_key=api_key, job_start=job_start_time(self.environ), own=own)
        self.meter.router = self.router  # with a router, its counters are the requests (launch/router.py)
        for name, text in lp.files.items():
            try:
                atomic_write(self.run_dir / name, text)
            except OSError as err:
                raise self.unwritable(err, name) from None
        if lp.plan.shape in ("ray", "gateway"):  # the Ray cluster's token (launch/raycluster.py), 0600
            from .raycluster import write_token

            try:
                write_token(self.run_dir)
            except OSError as err:
                raise self.unwritable(err, RAY_TOKEN) from None
        self.start(lp, api_key)
        # replicas that survive a peer, and the /health watch once live
        from .health import HealthWatch, generating_health, health_url, metrics_progress
        from .replicas import Survivors, release_node, survives

        health = HealthWatch({t.rank: health_url(t.probe_url) for t in lp.targets}, self.health,
                             get=generating_health(generates, lp.served, api_key, own),
                             progress=metrics_progress(lp.engine, api_key) if lp.metrics else None)
        if survives(lp):
            self.survivors = Survivors(lp, self.proc, self.min_replicas, say=say, tail=_tail,
                                       release=lambda keep: release_node(lp.job_id, keep, self.run_dir),
                                       write=self.records.write_json)
        from .successor import PREDECESSOR, Chain, chain_left, drain_s

        left = chain_left(self.keys, self.environ)
        if self.pool_of is not None:  # a replica job ends with the pool's job (launch/pool.py)
            from .pool import Member

            self.chain = Member(self.pool_of, self.run_dir, say)
        elif left or self.environ.get(PREDECESSOR):
            self.chain = Chain(lp.job_id, self.run_dir, left, drain_s(self.keys), say=say, environ=self.environ)
        self.supervisor = Supervisor(lp, self.proc, probe=probe, on_live=lambda s: self.on_live(lp, s), say=say,
                                     api_key=api_key, t0=self.t0, meter=self.meter, survivors=self.survivors,
                                     health=health if health.enabled else None, successor=self.chain,
                                     generate=generates, diag=self.slurm_diag)
        self.supervisor.router = self.router
        self.supervisor.run()

    def make_router(self, lp: LaunchPlan, api_key: str | None):
        """The router ``ROUTER`` asks for (launch/router.py), not yet started; None without one."""
        from ..engines.router import check
        from ..errors import EnvLayersError

        try:
            if check(self.keys, lp.plan.shape, lp.plan.api_port) is None:
                return None
        except EnvLayersError as err:
            raise LaunchFailure(str(err)) from None
        from .router import Router

        host = lp.targets[0].url.split("//", 1)[1].rsplit(":", 1)[0]  # node 0's host as the replicas print it
        return Router(self.keys, lp.plan.shape, lp.plan.api_port, [t.probe_url for t in lp.targets], self.run_dir,
                      api_key, say, url_host=host)

    def make_pool(self, lp: LaunchPlan, elapsed: float):
        """The elastic pool ``MAX_REPLICAS`` asks for (launch/pool.py), or None when it may not grow."""
        from ..engines.router import max_replicas

        started = len(lp.targets)
        most = max_replicas(self.keys, started)
        if most is None or most <= started:
            return None
        from .pool import Pool

        left = None if self.time_left_s is None else self.time_left_s - (time.monotonic() - self.t0)
        return Pool(self.keys, job_id=lp.job_id, run_dir=self.run_dir, engine=lp.engine, router=self.router,
                    started=started, max_replicas=most, startup_s=elapsed, time_left_s=left, environ=self.environ,
                    api_key=self.router.api_key, say=say)

    def unwritable(self, err: OSError, name: str) -> LaunchFailure:
        """A file the launcher must write before any rank starts, refused by the OS: the job ends, saying
        so in the words of the job script's own check."""
        return LaunchFailure(f"cannot write the run directory {self.run_dir}: {err.strerror or err} (writing "
                             f"{name}); the job ends before any rank starts: free space there, or point SCRATCH "
                             "(or RUN_ROOT) at a writable file system")

    def slurm_diag(self, missing: list[int]) -> list[str]:
        """ENVLAYERS-DIAG lines: Slurm's view of the ranks that did not start, their step and the nodes."""
        from .slurmdiag import slurm_diag

        lp = self.lp
        planned = [(rank, lp.nodes[rank].name if rank < len(lp.nodes) else "?") for rank in missing]
        names = list(dict.fromkeys(node.name for node in lp.nodes))
        return slurm_diag(lp.job_id, planned, names)

    def api_key(self) -> tuple[str | None, str | None]:
        """(key file, key): SERVER_API_KEY_FILE read, or with ``generate`` a per-job key written 0600 to
        $RUN_DIR/api-key, whose path then stands in SERVER_API_KEY_FILE for the plan and endpoint.json."""
        from ..apikey import generate_key, wants_generated

        key_file = self.keys.get("SERVER_API_KEY_FILE")
        if wants_generated(key_file):
            from .successor import inherited_key

            inherited = inherited_key(self.run_dir, self.environ, say)  # a successor keeps the chain's key
            if inherited:
                path, key = inherited
            else:
                key = generate_key()
                path = write_api_key(self.run_dir, key)
            self.keys["SERVER_API_KEY_FILE"] = str(path)
            if not inherited:
                say(STAGE.line(f"generated a per-job API key in {path} (mode 0600; `env_layers connect "
                               f"{self.job_id}` names it)"))
            return str(path), key
        return key_file, (read_api_key(key_file) if key_file else None)

    def start(self, lp: LaunchPlan, api_key: str | None) -> None:
        say(STAGE.line(f"starting {lp.ranks} rank(s): {shell.words(lp.srun)}"))
        child_env = dict(self.environ)
        child_env.pop("SERVER_API_KEY", None)  # only SERVER_API_KEY_FILE sets a key
        # ranks.sh takes ENVLAYERS_RANK before SLURM_PROCID: only this launcher sets it (one step per replica,
        # launch/replicas.py), never a value the job inherited from the shell that submitted it
        child_env.pop("ENVLAYERS_RANK", None)
        if api_key:
            child_env["SERVER_API_KEY"] = api_key
        from .replicas import ReplicaSteps, survives

        if survives(lp):  # one step per replica, so one can end alone
            self.proc = ReplicaSteps(lp, child_env)
        else:
            self.proc = subprocess.Popen(list(lp.srun), env=child_env, start_new_session=True)

    def on_live(self, lp: LaunchPlan, elapsed: float) -> None:
        from ..readiness import add_usage, block

        if self.router is not None:  # one URL in front of the replicas (launch/router.py)
            self.router.start()
            self.pool = self.make_pool(lp, elapsed)
        urls = [self.router.url] if self.router is not None else [t.url for t in lp.targets]
        ep = add_usage(EndpointRecord(
            lp.job_id, lp.served, lp.model, lp.engine, lp.plan.shape, urls, lp.api_key, str(self.run_dir),
            round(elapsed, 1), [n.name for n in lp.nodes], restart=lp.restart,
            key_file=lp.key_file if lp.api_key else None,
            # a router serves its /metrics on the port above its own (launch/router.py)
            metrics=lp.metrics, metrics_at=self.router.metrics_url if self.router is not None else None,
            node_local=lp.node_local))
        ep.addresses = [t.address for t in lp.targets]  # the node addresses behind base_urls
        ep.api_key_file = lp.key_file if lp.api_key else None  # what `env_layers connect` names
        ep.site = self.keys.get("ENVLAYERS_SITE") or None
        if self.router is not None:
            ep.replica_urls = [t.url for t in lp.targets]
            ep.replica_addresses = [t.address for t in lp.targets]  # addresses[0] is the router's node
            ep.router = self.router.record()
        self.records.write_json(self.run_dir / ENDPOINT, ep.to_dict())  # serves on if refused
        if lp.plan.shape in ("ray", "gateway"):  # the Ray cluster node 0 saw form (launch/raycluster.py)
            from .raycluster import joined_line

            say(joined_line(self.run_dir) or WARN.line("no ray-cluster.json from node 0"))
        say(LIVE.line(seconds=elapsed))
        sys.stdout.write(block(ep))
        sys.stdout.flush()
        if self.survivors is not None:
            self.survivors.went_live(ep)
        if self.chain is not None:
            self.chain.went_live(elapsed)
        if self.pool is not None:
            self.pool.went_live(ep)
            if self.supervisor is not None:
                self.supervisor.pool = self.pool

    def stop(self, sig=signal.SIGTERM, grace_s: float = 8.0) -> None:
        if self.router is not None:  # first: no request is routed to a replica that is stopping
            self.router.stop()
        if self.pool is not None:  # every replica job the pool submitted ends with this job
            self.pool.stop()
        if self.proc is not None and not isinstance(self.proc, subprocess.Popen):  # replicas: one step each
            self.proc.stop(sig, grace_s)
            return
        if self.proc is not None:
            stop_group(self.proc, sig, grace_s)


def write_end(run_dir: Path, restart: int, code: int, reason: str, now: Callable[[], float] = time.time) -> None:
    """launch-end.json: how this run's launcher ended (every orderly end writes it)."""
    try:
        write_json(run_dir / LAUNCH_END, LaunchEnd(restart, code, reason, round(now(), 3)).to_dict())
    except OSError as err:  # a full or read-only file system: the end goes to the job output, for status
        say(UNRECORDED_END.line(code=code, path=run_dir / LAUNCH_END, why=err.strerror or str(err),
                                         reason=reason))


def main(run_dir: Path, environ: Mapping[str, str] | None = None) -> int:
    environ = dict(os.environ if environ is None else environ)
    launch = Launcher(run_dir, environ)

    def on_term(signum, _frame):
        raise _Terminated(signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    from .meter import IdleStop

    code = 0
    reason = "ended"
    died = False
    try:
        launch.run()
    except IdleStop as stop:  # no request for IDLE_STOP_AFTER_S: a clean end, not a failure
        reason = str(stop)
    except _Terminated as term:  # scancel or the time limit: the normal end of a serving job
        say(STAGE.line(f"received signal {term.signum}; stopping the ranks"))
        code = 128 + term.signum
        reason = (f"live then signal {term.signum}" if launch.live
                  else f"signal {term.signum} before the endpoint was live")
    except StepSignalled as sig:  # scancel --signal=TERM JOB: the steps were told to end, the batch script was not
        say(STAGE.line(f"{sig}; ending job {launch.job_id}"))
        code = 128 + sig.signum
        reason = (f"live then signal {sig.signum} to the server step" if sig.live
                  else f"signal {sig.signum} to the server step before the endpoint was live")
    except HandedOver as done:  # SUCCESSORS: the successor is live, this link of the chain ends
        say(STAGE.line(f"{done}; ending job {launch.job_id}"))
        code, reason = 0, str(done)
    except (LaunchFailure, KeyValueError) as err:  # a bad launch key ends the launch like a failure
        for line in err.lines:
            say(line)
        say(ERROR.line(str(err)))
        for rank, cause in root_causes(run_dir, launch.ranks(), err.rank):
            say(ERROR.line(f"rank {rank} engine said: {cause}"))
        if err.rank is not None:
            log = run_dir / server_log_name(err.rank)
            say(TAIL_HEADER.line(n=TAIL_LINES, log=log))
            for line in _tail(log):
                say(f"  | {line}")
        say(STAGE.line(f"ending job {launch.job_id}; run `env_layers diagnose {launch.job_id}` for causes"))
        code, reason, died = 1, str(err), True
    except Exception as err:  # an EnvLayersError from planning, or a bug: say it, end the job
        say(ERROR.line(f"launcher failed: {err}"))
        code, reason = 1, f"launcher failed: {err}"
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the clean-up short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        launch.stop()
    if not core_guard(run_dir, Path.cwd()):
        code = 1
        reason += "; a rank ran with a core limit that is not 0"
    write_end(run_dir, launch.restart, code, reason.splitlines()[0] if reason else "")
    if launch.meter is not None:
        ended = time.time()
        launch.meter.write(final=True, end_wall=round(ended, 3), died_wall=died_at(run_dir, ended) if died else None,
                           how=reason.splitlines()[0] if reason else "")
    return code


CAUSE_LINES = 4000  # how far up a rank's log the root cause is looked for
MAX_CAUSES = 4


def root_causes(run_dir: Path, ranks: int, blamed: int | None) -> list[tuple[int, str]]:
    """Each rank's root-cause line (rootcause.py), the blamed rank first, the same line once, at most
    MAX_CAUSES: the error the engine printed tens of lines above its log's last line."""
    from ..rootcause import root_cause

    order = ([blamed] if blamed is not None else []) + [r for r in range(ranks) if r != blamed]
    found: list[tuple[int, str]] = []
    for rank in order:
        try:
            cause = root_cause(_tail(run_dir / server_log_name(rank), CAUSE_LINES))
        except OSError:
            continue
        if cause and cause not in (c for _, c in found):
            found.append((rank, cause))
        if len(found) == MAX_CAUSES:
            break
    return found


def died_at(run_dir: Path, ended: float) -> float:
    """When the server died: the first rank exit file's time, else the launcher's end."""
    times = []
    for f in run_dir.glob(RANK_EXIT_GLOB):
        try:
            times.append(f.stat().st_mtime)
        except OSError:
            pass
    return round(min(times + [ended]), 3)


def core_guard(run_dir: Path, workdir: Path) -> bool:
    """Report core files in the ranks' working directory and the run directory, and fail when a rank
    ran with a core limit that is not 0 (the site core_pattern drops multi-GB cores in the CWD)."""
    from ..cores import check_cores, find_core_files

    ok = True
    try:
        report = check_cores(run_dir)  # the ranks record their core limit there
        cores = list(report.cores)
        if workdir.resolve() != run_dir.resolve():
            cores += find_core_files(workdir)
        for c in cores:
            say(WARN.line(f"core file left: {c.path} ({c.size_bytes} bytes)"))
        for lim in report.bad_limits:
            say(ERROR.line(f"rank {lim.rank} ran with core limit {lim.value}, not 0 ({lim.where})"))
            ok = False
    except Exception as err:  # the guard must not turn a clean end into a crash
        say(WARN.line(f"core check failed: {err}"))
    return ok
