"""Where a launched job's files are, and what the launcher wrote in them.

The launcher's contract (cluster/serve-only.sbatch and ``env_layers launch``):

- the job output ``serve-only-<jobid>.out`` sits in the submit directory (Slurm's ``StdOut`` says where)
  and carries greppable lines (their texts: :mod:`envlayers.joblines`): ``ENVLAYERS-STAGE: run_dir=<abs path>`` early, ``ENVLAYERS-TOPOLOGY: ...``,
  ``ENVLAYERS-STAGE: rank R up on <host>``, ``ENVLAYERS-STAGE: all N ranks started``,
  ``ENVLAYERS-WARN: ...``, ``ENVLAYERS-ERROR: ...``, and once live ``ENVLAYERS-STAGE: endpoint live after
  <s>s`` followed by the endpoint block that starts with ``defaults.BANNER``;
- the run directory ``<RUN_ROOT>/<jobid>/`` (RUN_ROOT defaults to ``${SCRATCH:-$PWD/runs}/inference-server``)
  holds ``server-<rank>.log``, ``rank-<rank>.exit``, ``endpoint.json`` (written when live), ``launch.json``,
  ``launch-end.json`` (written by the launcher on every orderly end: ``restart``, ``code``, ``reason``,
  ``ended_at``), ``serve.env``, ``job.sh``, ``ranks.sh``;
- a record the launcher cannot write once ranks run (a full or read-only file system) is said in the job
  output instead (:class:`RecordWriter`): ``ENVLAYERS-WARN: cannot write <path>: <what the OS said>; ...``
  once per file, and for ``launch-end.json`` the end itself (``joblines.UNRECORDED_END``), so ``status``
  tells a launcher that could not write from one that was killed;
- a requeued job keeps the current run's files at the top of that folder: when it starts again, every
  top-level entry except the ``run-<n>/`` folders moves into ``run-<n>/`` (``n`` the first free number
  from 0); ``launch.json`` and ``endpoint.json`` carry ``"restart"`` (Slurm's ``SLURM_RESTART_COUNT``,
  0 for the first run). Until the new run has written its ``launch.json``, the top-level files are the
  previous run's (:func:`top_is_previous`), and :class:`JobFiles` then shows none of them as current.

This module owns the run directory: every file's name (the constants below; no other module spells
one, and the job's scripts get theirs from :data:`SCRIPT_NAMES`), the record type of each JSON file (a
dataclass whose fields are the file's keys: :class:`LaunchRecord`, :class:`LaunchEnd`, :class:`ChainRecord`,
:class:`AccountingRecord`, :class:`GatewayState`, :class:`RouterState`, :class:`TunnelRecord`, :class:`RayCluster`,
:class:`PoolRecord`, :class:`EndpointRecord`), the one converter between a record and its file's data
(:class:`Record`'s ``from_dict``/``to_dict``, from the fields and their type hints), their readers, the one
writer of a JSON record (:func:`write_json`, atomic through ``fsutil.atomic_write``), and the one reading of how
a run's launcher ended (:meth:`JobFiles.launcher_ended`, from :class:`LaunchEnd` and its ``kind``). The two
scripts the job copies into the run directory and runs with the standard library only (``gateway_app.py``,
``launch/raynode.py``) repeat the names of the files they write; a test keeps them equal to the ones here.

Parsing here is pure (text in, records out); ``locate`` and ``JobFiles`` only read files.
Unknown fields in the JSON files are ignored, missing or mistyped ones are ``None`` (or empty lists).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from .slurm import JobInfo

from . import joblines
from .defaults import BANNER
from .fsutil import atomic_write


# --- every file of a run directory, by name ---
ENDPOINT = "endpoint.json"  # EndpointRecord: written once live (launch.launcher), rewritten by replicas and pool
LAUNCH = "launch.json"  # LaunchRecord: what the launcher planned (launch.prepare), written before srun
LAUNCH_END = "launch-end.json"  # LaunchEnd: how the launcher ended: restart, code, reason, ended_at
CHAIN = "chain.json"  # ChainRecord: the job's link in a chain of successors (launch.successor)
POOL = "pool.json"  # PoolRecord: the elastic pool's replica jobs added and released, each decision (launch.pool)
TUNNEL = "tunnel.json"  # TunnelRecord: the login node's tunnel to the endpoint (access.tunnel, access.tunnelrecord)
TUNNEL_LOG = "tunnel.log"  # the tunnel step's output, and each handover's lines (access.tunnel, access.handover)
ACCOUNTING = "accounting.json"  # AccountingRecord: the GPU-hour timeline (launch.timeline, envlayers.accounting)
SERVE_ENV = "serve.env"  # the job's merged keys, ``export KEY='value'`` lines
API_KEY = "api-key"  # a per-job generated API key, 0600 (write_api_key; apikey reads it)
RAY_TOKEN = "ray-token"  # the job's Ray authentication token, 0600 (launch.raycluster)
RAY_CLUSTER = "ray-cluster.json"  # RayCluster: the Ray cluster node 0 saw form (written by launch/raynode.py)
GATEWAY_STATE = "gateway-state.json"  # the gateway's replicas healthy and last events (written by gateway_app.py)
ROUTER_LOG = "router.log"  # the router's output (launch.router)
ROUTER_STATE = "router-state.json"  # which replicas the router (ROUTER=smg) calls healthy (launch.router)
GATEWAY_APP = "gateway_app.py"  # the Serve application, copied here for node 0
RAY_NODE = "raynode.py"  # the Ray node helper, copied here for every node
RANKS_SH = "ranks.sh"  # the script srun runs on every rank
JOB_SH = "job.sh"  # the job script itself, copied by the job script (a successor resubmits it)
CORE_LIMIT = "core-limit.txt"  # every rank's core-dump limit, one line each, written by ranks.sh (cores)


@dataclass(frozen=True)
class RankFile:
    """A file of one rank, ``<prefix><rank><suffix>``. The job's scripts get the two parts (:data:`SCRIPT_NAMES`)
    and put the rank between them in bash."""

    prefix: str
    suffix: str

    def name(self, rank: int) -> str:
        return f"{self.prefix}{rank}{self.suffix}"

    @property
    def glob(self) -> str:
        return f"{self.prefix}*{self.suffix}"

    @property
    def pattern(self) -> re.Pattern:
        return re.compile(f"^{re.escape(self.prefix)}(\\d+){re.escape(self.suffix)}$")


SERVER_LOG = RankFile("server-", ".log")  # one rank's output
RANK_EXIT = RankFile("rank-", ".exit")  # one rank's exit code, written by ranks.sh
# the signal a rank's script received (TERM, INT, HUP: scancel --signal, Slurm, srun), written by ranks.sh
# before it passes it on to the engine
RANK_SIGNAL = RankFile("rank-", ".signal")
RAY_PIDS = RankFile("ray-pids-", ".txt")  # every process launch/raynode.py started on that rank's node
RUN_FOLDER = "run-"  # ``run-<n>/``: an earlier run of a requeued job, moved there by the job script


def server_log_name(rank: int) -> str:
    """``server-<rank>.log``: one rank's output."""
    return SERVER_LOG.name(rank)


def rank_exit_name(rank: int) -> str:
    """``rank-<rank>.exit``: one rank's exit code, written by ranks.sh."""
    return RANK_EXIT.name(rank)


RANK_EXIT_GLOB = RANK_EXIT.glob


def rank_signal_name(rank: int) -> str:
    """``rank-<rank>.signal``: the signal that rank's script received and passed on to its engine."""
    return RANK_SIGNAL.name(rank)


def ray_pids_name(rank: int) -> str:
    """``ray-pids-<rank>.txt``: every process launch/raynode.py started on that rank's node."""
    return RAY_PIDS.name(rank)


def write_api_key(run_dir: "str | os.PathLike[str]", key: str) -> Path:
    """Write ``key`` to ``run_dir/api-key`` (:data:`API_KEY`), created with mode 0600 (never wider, whatever the
    umask; an earlier file there, or a link planted in its place, is removed first, never written through).
    Returns the path."""
    path = Path(run_dir) / API_KEY
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (key + "\n").encode())
    finally:
        os.close(fd)
    return path


# the names the job's scripts write (templates/, through ``scripttext``): passed in as ``files``, so that the
# bash spells no name of its own
SCRIPT_NAMES = {"serve_env": SERVE_ENV, "job_sh": JOB_SH, "run_folder": RUN_FOLDER, "core_limit": CORE_LIMIT,
                "server_log": SERVER_LOG, "rank_exit": RANK_EXIT, "rank_signal": RANK_SIGNAL}
_RUN_SUBDIR_RE = re.compile(f"^{re.escape(RUN_FOLDER)}(\\d+)$")
# the job script's (and the launcher's) line for a run directory it cannot write before any rank starts
_JOB_ID_RE = re.compile(r"[0-9]+")


@dataclass
class LauncherReport:
    """What the launcher said in the job output, in order of appearance.

    A requeued job prints a new ``run_dir=`` line when it starts again: from there on the report is the
    new run's (``runs_seen`` counts the runs the output shows)."""

    run_dir: str | None = None
    runs_seen: int = 0
    topology: list[str] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    ranks_up: dict[int, str] = field(default_factory=dict)  # rank -> host
    ranks_started: int | None = None  # N of "all N ranks started"
    live_after_s: float | None = None
    endpoint_block: str | None = None
    # the launcher's end when it could not write launch-end.json: {"code", "reason", "path", "write_error"}
    unrecorded_end: dict | None = None
    # the run directory could not be written before any rank started: {"path", "error", "doing"}
    run_dir_error: dict | None = None
    _in_block: bool = field(default=False, repr=False)

    @property
    def live(self) -> bool:
        return self.live_after_s is not None or self.endpoint_block is not None

    @property
    def last_error(self) -> str | None:
        """The last ``ENVLAYERS-ERROR`` that says something (not a ``last 20 lines of <log>:`` header)."""
        said = [e for e in self.errors if not joblines.TAIL_HEADER.match(e)]
        return said[-1] if said else (self.errors[-1] if self.errors else None)

    def feed_lines(self, lines) -> list[tuple[str, str]]:
        """Add lines; returns the new launcher messages as ``(kind, text)``, kind in STAGE/TOPOLOGY/WARN/ERROR/DIAG."""
        new = []
        for raw in lines:
            line = raw.rstrip("\r\n")
            parsed = joblines.parse(line)
            if parsed is None:
                if self._in_block:
                    if line.strip():
                        self.endpoint_block = (self.endpoint_block or "") + line + "\n"
                    else:
                        self._in_block = False
                elif line.strip() == BANNER:
                    self.endpoint_block = line + "\n"
                    self._in_block = True
                continue
            self._in_block = False
            kind, text = parsed
            new.append((kind, text))
            if kind == "TOPOLOGY":
                self.topology.append(text)
            elif kind == "WARN":
                self.warnings.append(text)
            elif kind == "ERROR":
                self.errors.append(text)
                if mm := joblines.RUN_DIR_UNWRITABLE.match(text):
                    self.run_dir_error = {"path": mm["path"], "error": mm["error"], "doing": mm["doing"]}
                if mm := joblines.UNRECORDED_END.match(text):
                    self.unrecorded_end = {"code": int(mm["code"]), "path": mm["path"],
                                           "write_error": mm["why"], "reason": mm["reason"]}
            elif kind == "STAGE":
                self.stages.append(text)
                if mm := joblines.RUN_DIR.match(text):
                    if self.runs_seen:
                        self._new_run()
                        self.stages.append(text)
                    self.runs_seen += 1
                    self.run_dir = mm["path"].strip()
                elif mm := joblines.RANK_UP.match(text):
                    self.ranks_up[int(mm["rank"])] = mm["host"]
                elif mm := joblines.ALL_STARTED.match(text):
                    self.ranks_started = int(mm["n"])
                elif mm := joblines.LIVE.match(text):
                    self.live_after_s = float(mm["seconds"])
        return new

    def _new_run(self) -> None:
        fresh = LauncherReport()
        for name in ("topology", "stages", "warnings", "errors", "ranks_up", "ranks_started", "live_after_s",
                     "endpoint_block", "unrecorded_end", "run_dir_error", "_in_block"):
            setattr(self, name, getattr(fresh, name))

    def to_dict(self) -> dict:
        return {"run_dir": self.run_dir, "topology": self.topology, "stages": self.stages,
                "warnings": self.warnings, "errors": self.errors,
                "ranks_up": {str(k): v for k, v in sorted(self.ranks_up.items())},
                "ranks_started": self.ranks_started, "live_after_s": self.live_after_s, "live": self.live,
                "unrecorded_end": self.unrecorded_end, "run_dir_error": self.run_dir_error}


class RecordWriter:
    """The launcher's writer of run-directory records once it runs: each file replaced atomically, and a
    write the OS refuses (a full or read-only file system) said in the job output, once per file until a
    write of it succeeds again, instead of ending the job: a live endpoint keeps serving."""

    def __init__(self, say):
        self.say = say
        self.failing: dict[str, str] = {}  # path -> what the OS said, while its writes fail

    def write_json(self, path: Path, data: Mapping) -> bool:
        """Write the record ``data`` to ``path`` (:func:`json_text`); False (said once) when the OS refused."""
        return self.write(path, json_text(data))

    def write(self, path: Path, text: str) -> bool:
        """Write ``path``; False (said once) when the OS refused."""
        try:
            atomic_write(path, text)
        except OSError as err:
            why = err.strerror or str(err)
            if self.failing.get(str(path)) != why:
                self.say(joblines.WARN.line(f"cannot write {path}: {why}; the job goes on without this "
                                            "record (free space there, or point SCRATCH or RUN_ROOT at a writable "
                                            "file system next time)"))
            self.failing[str(path)] = why
            return False
        self.failing.pop(str(path), None)
        return True


def parse_job_output(text: str) -> LauncherReport:
    """The launcher's lines from a whole ``serve-only-<jobid>.out``."""
    report = LauncherReport()
    report.feed_lines(text.splitlines())
    return report


def top_is_previous(recorded_restart: int | None, slurm_restarts: int | None, pending: bool) -> bool:
    """Whether the top-level files of a run directory belong to an earlier run than the one Slurm runs now.

    ``recorded_restart``: the ``restart`` of the top-level ``launch.json`` (0 when it has none, ``None``
    when there is no launch.json); ``slurm_restarts``: Slurm's ``Restarts`` (``None`` when Slurm did not
    say). A pending job has no current files: whatever is there is a previous run's."""
    if pending:
        return True
    if slurm_restarts is None:
        return False  # nothing to compare with: trust the files
    return slurm_restarts > (recorded_restart or 0)


LAUNCHER_ENDS = ("running", "reported", "idle stop", "unrecorded", "died", "never started")  # JobFiles.launcher_ended


@dataclass
class JobFiles:
    """A job's output file and run directory (either may be ``None`` or not exist yet).

    ``previous_at_top``: the top-level files are an earlier run's (a requeued job that has not started
    again): every accessor of the current run's files then answers "nothing yet"."""

    job_id: str
    job_out: Path | None
    run_dir: Path | None
    previous_at_top: bool = False

    def server_log(self, rank: int = 0) -> Path | None:
        if self.previous_at_top:
            return None
        return self.run_dir / server_log_name(rank) if self.run_dir else None

    def server_logs(self) -> dict[int, Path]:
        return {} if self.previous_at_top else self._numbered(SERVER_LOG.pattern)

    def earlier_runs(self) -> dict[int, Path]:
        """n -> ``run-<n>/``: the folders earlier runs of a requeued job were moved into."""
        return earlier_run_dirs(self.run_dir)

    def recorded_restart(self) -> int | None:
        """The ``restart`` of the top-level launch.json, whichever run wrote it (0 when it has none,
        ``None`` when there is no readable launch.json)."""
        record = self._record(LAUNCH, LaunchRecord)
        return None if record is None else record.restart

    def rank_exits(self) -> dict[int, int | None]:
        """rank -> exit code from ``rank-<rank>.exit`` (``None`` when the file does not hold a number)."""
        if self.previous_at_top:
            return {}
        exits: dict[int, int | None] = {}
        for rank, path in self._numbered(RANK_EXIT.pattern).items():
            try:
                text = path.read_text().strip().split()
                exits[rank] = int(text[0]) if text and text[0].lstrip("-").isdigit() else None
            except OSError:
                exits[rank] = None
        return exits

    def endpoint(self) -> EndpointRecord | None:
        """``endpoint.json`` of the current run (``None`` before it is live), with the gateway's own state file
        as ``gateway`` (:func:`read_gateway_state`) and behind a router its state file as ``router_state``, as
        status shows it."""
        record = None if self.previous_at_top else self._record(ENDPOINT, EndpointRecord)
        if record is not None and self.run_dir is not None:
            record.gateway = read_gateway_state(self.run_dir)
            record.router_state = read_router_state(self.run_dir) if record.router is not None else None
        return record

    def launch_end(self) -> LaunchEnd | None:
        """``launch-end.json`` of the current run: how the launcher ended (``None``: it did not say)."""
        return None if self.previous_at_top else self._record(LAUNCH_END, LaunchEnd)

    def launch(self) -> LaunchRecord | None:
        """``launch.json`` of the current run: what the launcher planned (``None`` before it started)."""
        return None if self.previous_at_top else self._record(LAUNCH, LaunchRecord)

    def accounting(self) -> AccountingRecord | None:
        """``accounting.json`` of the current run: its GPU-hour timeline (``launch.timeline``), or ``None``."""
        return None if self.previous_at_top else self._record(ACCOUNTING, AccountingRecord)

    def launcher_ended(self, job_ended: bool = True) -> tuple[str, dict]:
        """How the current run's launcher ended, the one reading of it (``status``, ``diagnose``, an earlier
        run's summary): ``(how, what it said)``, ``how`` one of :data:`LAUNCHER_ENDS`:

        - ``"running"``: the job has not ended (``job_ended`` false): nothing to say yet;
        - ``"reported"``: the launcher wrote ``launch-end.json`` (its ``code``, ``reason``, ``ended_at``);
        - ``"idle stop"``: reported, of kind :data:`END_IDLE_STOP` (no request for IDLE_STOP_AFTER_S; exit 0);
        - ``"unrecorded"``: the launcher ended but could not write launch-end.json (a full or read-only file
          system) and said its end in the job output instead (``code``, ``reason``, ``path``, ``write_error``);
        - ``"died"``: the launcher had started (launch.json) but wrote no launch-end.json: it was killed
          (SIGKILL, the node went away) or crashed;
        - ``"never started"``: the job ended before this run's launcher wrote launch.json."""
        if not job_ended:
            return "running", {}
        end = self.launch_end()
        if end is not None:
            said = {"code": end.code, "reason": end.reason, "ended_at": end.ended_at}
            return ("idle stop" if end.kind == END_IDLE_STOP else "reported"), said
        unrecorded = self.read_job_output().unrecorded_end
        if unrecorded is not None:
            return "unrecorded", dict(unrecorded)
        return ("died" if self.launch() is not None else "never started"), {}

    def read_job_output(self) -> LauncherReport:
        """The current run's launcher lines (nothing while the top-level files are a previous run's)."""
        if self.job_out is None or self.previous_at_top:
            return LauncherReport()
        try:
            return parse_job_output(self.job_out.read_text(errors="replace"))
        except OSError:
            return LauncherReport()

    def _json(self, name: str) -> dict | None:
        return None if self.run_dir is None else read_json(self.run_dir / name)

    def _record(self, name: str, kind):
        return None if self.run_dir is None else read_record(self.run_dir / name, kind)

    def _numbered(self, pattern: re.Pattern) -> dict[int, Path]:
        if self.run_dir is None or not self.run_dir.is_dir():
            return {}
        found = {}
        for entry in self.run_dir.iterdir():
            m = pattern.match(entry.name)
            if m:
                found[int(m.group(1))] = entry
        return dict(sorted(found.items()))


def run_root_candidates(environ: Mapping[str, str], cwd: Path, workdir: str | None = None) -> list[Path]:
    """Where ``<RUN_ROOT>`` may be, most specific first (the launcher's default is
    ``${SCRATCH:-$PWD/runs}/inference-server``, with ``$PWD`` the submit directory)."""
    roots: list[Path] = []
    for key in ("ENVLAYERS_RUN_ROOT", "RUN_ROOT"):
        if environ.get(key):
            roots.append(Path(environ[key]))
    if environ.get("SCRATCH"):
        roots.append(Path(environ["SCRATCH"]) / "inference-server")
    if workdir:
        roots.append(Path(workdir) / "runs" / "inference-server")
    roots.append(cwd / "runs" / "inference-server")
    seen, unique = set(), []
    for root in roots:
        if root not in seen:
            seen.add(root)
            unique.append(root)
    return unique


def job_output_path(job_id: str, info: "JobInfo | None", cwd: Path) -> Path:
    """Slurm's ``StdOut`` when it says, else ``serve-only-<jobid>.out`` in the job's (or this) directory."""
    if info is not None and info.stdout:
        out = info.stdout.replace("%j", str(job_id)).replace("%x", info.name or "serve-only")
        if "%" not in out:
            return Path(out)
    base = Path(info.workdir) if info is not None and info.workdir else cwd
    return base / f"serve-only-{job_id}.out"


def locate(job_id: str, info: "JobInfo | None" = None, *, environ: Mapping[str, str] | None = None,
           cwd: Path | None = None, run_dir: str | None = None) -> JobFiles:
    """Find the job's files: the output from Slurm's record, the run directory from the launcher's
    ``run_dir=`` line, else the first ``<RUN_ROOT>/<jobid>`` that exists. ``run_dir`` overrides."""
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    job_id = str(job_id)
    out = job_output_path(job_id, info, cwd)
    if run_dir:
        return JobFiles(job_id, out, Path(run_dir))
    said = None
    if out.is_file():
        said = _run_dir_line(out)
    if said and _is_dir(Path(said)):
        return JobFiles(job_id, out, Path(said))
    for root in run_root_candidates(environ, cwd, info.workdir if info else None):
        if _is_dir(root / job_id):
            return JobFiles(job_id, out, root / job_id)
    # the announced folder may not be visible here yet (or was moved): keep it for the messages
    return JobFiles(job_id, out, Path(said) if said else None)


def _is_dir(path: Path) -> bool:
    """A folder this user can see; another user's run directory (0700) counts as not there, so what asks
    for it (``stop``, ``status`` of someone else's job) reaches Slurm's own answer instead of an OS error."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _run_dir_line(path: Path, max_bytes: int = 1 << 20) -> str | None:
    """The ``run_dir=`` of the first ``ENVLAYERS-STAGE: run_dir=`` line (read from the file's start)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(max_bytes).decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in head.splitlines():
        parsed = joblines.parse(line)
        if parsed is not None and parsed[0] == joblines.STAGE.name and (m := joblines.RUN_DIR.match(parsed[1])):
            return m["path"].strip()
    return None


# --- the one writer of a JSON record, and the readers of the records other modules share ---

def json_text(data: Mapping) -> str:
    """A record's file text: indented JSON and a final newline (every JSON file here looks alike)."""
    return json.dumps(data, indent=2) + "\n"


def write_json(path: Path, data: Mapping, *, mode: int | None = None) -> None:
    """Replace the record at ``path`` atomically (a reader sees the old one or the new one); OSError as the
    OS said it (the launcher's writes once ranks run go through :class:`RecordWriter`)."""
    atomic_write(path, json_text(data), mode=mode)


def read_json(path: Path) -> dict | None:
    """A JSON record as a dict; ``None`` when absent, unreadable, half-written or not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None  # absent, or half-written: the writer replaces it atomically, so try again later
    return data if isinstance(data, dict) else None


# --- the records: one dataclass per JSON file, read and written by one converter (:class:`Record`) from its own
# fields and their type hints

# when a field is in its file: always, when not None, when not empty, never
_ALWAYS, _IF_SET, _IF_ANY, _NEVER = "always", "if set", "if any", "never"


def filed(*, write: str = _ALWAYS, read=None, then: str | None = None) -> dict:
    """How a field is filed, as its ``metadata``: ``write`` (when it is in the file), ``read`` (its own reader,
    ``read(data, key) -> value or None``, instead of the one its type hint gives), ``then`` (a property the file
    holds right after this field)."""
    return {"write": write, "read": read, "then": then}


def _whole(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _count(data: Mapping, key: str) -> int | None:
    """A count from 0: ``restart`` (a negative or mistyped one is the field's default, the first run)."""
    value = _whole(data.get(key))
    return value if value is not None and value >= 0 else None


def _job_id(data: Mapping, key: str) -> str | None:
    """A job id: digits, as text or as the number a hand-edited file may hold (``41`` for ``"41"``); never a
    path (a chain's successor names a folder beside this one)."""
    value = data.get(key)
    text = str(value) if isinstance(value, str) or _whole(value) is not None else ""
    return text if _JOB_ID_RE.fullmatch(text) else None


_TYPE_CHECKS = {str: lambda v: isinstance(v, str), bool: lambda v: isinstance(v, bool),
                int: lambda v: _whole(v) is not None, float: lambda v: _number(v) is not None,
                dict: lambda v: isinstance(v, dict), object: lambda v: True}


def _reader(hint):
    """``value -> field value`` for a field of type ``hint`` (``X | None`` reads as ``X``); ``None``: the field's
    default. A value not of the type is ``None``; a list's items are read as text (or as records, the items
    that are objects); a ``dict[str, V]`` keeps the entries whose value is a ``V``."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    kind, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    if _is_record(kind):
        return lambda v: kind.from_dict(v) if isinstance(v, dict) else None
    if kind is list and _is_record(args[0]):
        return lambda v: [args[0].from_dict(i) for i in v if isinstance(i, dict)] if isinstance(v, list) else None
    if kind is list:
        return lambda v: [str(i) for i in v] if isinstance(v, list) else None
    if kind is dict and args:
        keep = _TYPE_CHECKS[args[1]]
        return lambda v: {str(k): i for k, i in v.items() if keep(i)} if isinstance(v, dict) else None
    check = _TYPE_CHECKS[kind]
    return (lambda v: dict(v) if check(v) else None) if kind is dict else (lambda v: v if check(v) else None)


def _is_record(kind) -> bool:
    return isinstance(kind, type) and issubclass(kind, Record)


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


class Record:
    """A run-directory record, a dataclass whose fields are its file's keys in the file's order.

    ``from_dict`` is tolerant: unknown keys are ignored, a missing or mistyped one takes the field's default
    (``None``, or the empty list); ``to_dict`` gives the file's keys in field order, the later ones only when
    their ``write`` (:func:`filed`) says so. A subclass may map an older form of its file first (``_older``)."""

    _plans = {}  # record type -> [(name, read(data, key), write, then, field)], made on first use (not on import)

    @classmethod
    def _plan(cls) -> list:
        plan = Record._plans.get(cls)
        if plan is None:
            hints = typing.get_type_hints(cls)
            plan = Record._plans[cls] = []
            for f in dataclasses.fields(cls):
                how = f.metadata or filed()
                read = how["read"] or (lambda data, key, by_type=_reader(hints[f.name]): by_type(data.get(key)))
                plan.append((f.name, read, how["write"], how["then"], f))
        return plan

    @classmethod
    def _older(cls, data: Mapping) -> Mapping:
        return data

    # a record's __repr__ and __eq__ as dataclass writes them, made once here rather than once per record type
    # (``@record`` leaves them out): making them is most of what a dataclass costs, and dataclasses most of this
    # module's import time
    def __repr__(self) -> str:
        return f"{type(self).__qualname__}(" + ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)) + ")"

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        names = [f.name for f in dataclasses.fields(self)]
        return [getattr(self, n) for n in names] == [getattr(other, n) for n in names]

    __hash__ = None

    @classmethod
    def from_dict(cls, data: Mapping):
        data = cls._older(data)
        values = {}
        for name, read, _, _, f in cls._plan():
            value = read(data, name)
            values[name] = _default(f) if value is None else value
        return cls(**values)

    def to_dict(self) -> dict:
        out = {}
        for name, _, write, then, _ in self._plan():
            value = getattr(self, name)
            if write == _ALWAYS or write == _IF_SET and value is not None or write == _IF_ANY and value:
                out[name] = _written(value)
            if then:
                out[then] = getattr(self, then)
        return out


def record(cls):
    """A record type: a dataclass with :class:`Record`'s ``__repr__`` and ``__eq__``."""
    return dataclass(cls, repr=False, eq=False)


def _written(value):
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, list):
        return [_written(v) for v in value]
    return dict(value) if isinstance(value, dict) else value


@record
class LaunchRecord(Record):
    """``launch.json``: what the launcher planned, written before srun (``launch.prepare``). ``restart`` is
    Slurm's ``SLURM_RESTART_COUNT`` of the run that wrote it (0 when the file has none: the first run);
    ``containers`` (podman only, in the file only when there are some): each rank's container name."""

    job_id: str | None = None
    restart: int = field(default=0, metadata=filed(read=_count))
    target: str | None = None
    engine: str | None = None
    model: str | None = None  # INFERENCE_MODEL (None when empty)
    served_model_name: str | None = None
    shape: str | None = None
    nodes: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    ready_timeout_s: int | None = None
    # in the file only when not empty
    containers: list[str] = field(default_factory=list, metadata=filed(write=_IF_ANY))
    # with containers: the program that stops them (podman, docker)
    container_program: str | None = field(default=None, metadata=filed(write=_IF_ANY))
    # ENVLAYERS_SITE: the site layer of the render
    site: str | None = field(default=None, metadata=filed(write=_IF_ANY))


# how a launcher ended, as launch-end.json's ``kind`` says it (:func:`end_kind`)
END_ENDED = "ended"  # the launch returned: every rank ended on its own
END_IDLE_STOP = "idle stop"  # IDLE_STOP_AFTER_S: no request for that long (launch.meter.IdleStop), code 0
END_HANDED_OVER = "handed over"  # a successor (or the pool's job) took over, code 0
END_SIGNAL = "signal"  # scancel, the time limit, or a signal to the server step: 128 + the signal
END_FAILED = "failed"  # a rank, a launch key or the launcher itself failed: code 1
END_KINDS = (END_ENDED, END_IDLE_STOP, END_HANDED_OVER, END_SIGNAL, END_FAILED)
IDLE_STOP_REASON = "idle stop"  # how launch.meter.IdleStop's reason begins


def end_kind(code: int | None, reason: str | None) -> str | None:
    """The kind of a launcher's end from the ``code`` and ``reason`` it wrote (``None`` without a code)."""
    if code is None:
        return None
    if code == 0:
        if (reason or "").startswith(IDLE_STOP_REASON):
            return END_IDLE_STOP
        return END_ENDED if reason in ("ended", "", None) else END_HANDED_OVER
    return END_SIGNAL if code >= 128 else END_FAILED


def _end_kind(data: Mapping, key: str) -> str | None:
    value = data.get(key)
    return value if value in END_KINDS else None


@record
class LaunchEnd(Record):
    """``launch-end.json``: how the launcher ended, written on every orderly end (``launch.launcher``):
    the run's ``restart``, the exit ``code``, the ``reason`` and ``ended_at`` (epoch seconds). ``kind``
    (:data:`END_KINDS`) is not written: it follows from ``code`` and ``reason`` (:func:`end_kind`); a file
    that holds one is read as it says."""

    restart: int | None = None
    code: int | None = None
    reason: str | None = None
    ended_at: float | None = None
    kind: str | None = field(default=None, metadata=filed(write=_NEVER, read=_end_kind))

    def __post_init__(self):
        if self.kind is None:
            self.kind = end_kind(self.code, self.reason)


@record
class ChainRecord(Record):
    """``chain.json``: the job's link in a chain of successors (``launch.successor``): the job before it, the
    successor it submitted (a job id) with its ``--dependency``, and how many successors are ``left``."""

    predecessor: str | None = field(default=None, metadata=filed(read=_job_id))
    successor: str | None = field(default=None, metadata=filed(read=_job_id))
    dependency: str | None = None
    left: int | None = None

    @property
    def is_link(self) -> bool:
        """Whether the job is a link of a chain at all (a predecessor, a successor, or successors to come)."""
        return bool(self.predecessor or self.successor or self.left)


@record
class AccountingRecord(Record):
    """``accounting.json``: the job's GPU-hour timeline (``launch.timeline``) and its ``split``
    (``envlayers.accounting``). Its fields are kept as written, not made to fit a type: the file may be
    hand-edited or cut short, and ``accounting.problem`` names a value no sum can take (the report lists such
    a file as skipped, status shows it as it is)."""

    job_id: object = None
    restart: object = None
    gpus: object = None
    nodes: object = None
    shape: object = None
    engine: object = None
    model: object = None
    served: object = None
    job_start: object = None  # epoch seconds; a record without one is no timeline
    ranks_up_at: object = None
    phases: object = None  # phase -> epoch seconds rank 0's log entered it
    live_at: object = None
    last_request_at: object = None
    live: object = None  # the idle tracker's serving / idle seconds (``launch.idle``)
    idle_stop_after_s: object = None
    died_at: object = None
    ended_at: object = None
    final: object = None  # the launcher's last write (its end)
    how: object = None  # how the job ended, in a few words
    split: object = None


def read_record(path: Path, kind):
    """The record of type ``kind`` (a class above) in ``path``; ``None`` when :func:`read_json` has none."""
    data = read_json(path)
    return None if data is None else kind.from_dict(data)


KEEP_EVENTS = 5  # gateway_app.KEEP_EVENTS


def _last_events(data: Mapping, key: str) -> list[str]:
    value = data.get(key)
    return [str(v) for v in value][-KEEP_EVENTS:] if isinstance(value, list) else []


@record
class GatewayState(Record):
    """``gateway-state.json``: what the gateway (gateway_app.py) last saw of its replicas: how many Ray Serve
    reports healthy of how many, its survival settings, the Serve application's status, and the latest
    replica events (``replica 1 on n2: its vllm serve ...``, newest last, at most ``KEEP_EVENTS``)."""

    KEEP_EVENTS = KEEP_EVENTS

    healthy: int | None = None
    replicas: int | None = None
    min_replicas: int | None = None
    grace_s: int | None = None
    serve_status: str | None = None
    events: list[str] = field(default_factory=list, metadata=filed(read=_last_events))


def read_gateway_state(run_dir: Path) -> GatewayState | None:
    """The gateway's state file in ``run_dir`` (``None`` without one: not the gateway shape, or not yet)."""
    return read_record(Path(run_dir) / GATEWAY_STATE, GatewayState)


def _seconds(data: Mapping, key: str) -> float | None:
    """A time as a float (``5`` reads as ``5.0``)."""
    value = _number(data.get(key))
    return None if value is None else float(value)


@record
class RouterState(Record):
    """``router-state.json``: each worker URL the router knows and whether its own health checks call it
    healthy (smg's ``smg_worker_health``), and when the launcher last read that (Unix time)."""

    workers: dict[str, bool] = field(default_factory=dict)
    at: float | None = field(default=None, metadata=filed(read=_seconds))

    @property
    def healthy(self) -> int:
        return sum(self.workers.values())


def read_router_state(run_dir: Path) -> RouterState | None:
    """The router's state file in ``run_dir`` (``None`` without one: no router, or not read yet)."""
    return read_record(Path(run_dir) / ROUTER_STATE, RouterState)


@record
class RayCluster(Record):
    """``ray-cluster.json``: the Ray cluster node 0 saw form, written by ``launch/raynode.py`` (standard library
    only, so it writes the file itself; this is its reader): the head's ``address``, the ``nodes`` that joined
    and after how many seconds (``joined_after_s``)."""

    address: str | None = None
    nodes: int | None = None
    joined_after_s: float | None = None


_SET = filed(write=_IF_SET)


@record
class TunnelRecord(Record):
    """``tunnel.json``: the login node's reverse SSH tunnel to the endpoint (``access.tunnel`` opens it,
    ``access.tunnelrecord`` settles it against Slurm and the recorded process, ``access.handover`` carries it
    along a chain of successors). ``state``: ``opening``, ``open``, ``handed-over`` or ``closed``.

    The fields up to ``control`` are in every record (``null`` until known); the later ones only in the records
    that have them (``None``: absent from the file): ``replica`` (which base URL), ``took_over_from`` and
    ``port_closed_s`` (a successor's tunnel), ``follower`` (the chain follower's ``pid``, ``argv``, ``host``),
    ``successor``, ``handed_over_at`` and ``closed_s`` (a tunnel handed over), ``route_reminded_at`` (release
    reminded the gateway route), ``closed_at``, ``closed_by`` and ``closed_why`` (a closed one)."""

    job_id: str | None = None
    state: str | None = None
    node: str | None = None
    local_port: int | None = None
    gateway: dict | None = None  # access.gateway.Gateway.to_dict()
    remote_bind: str | None = None
    remote_port: int | None = None
    route: dict | None = None  # {"base_url", "provider_model_id"}: the gateway's route entry
    keep_alive: bool | None = None
    restarts: int | None = None
    host: str | None = None  # the host whose srun carries the step (its srun_pid means something there only)
    srun_pid: int | None = None
    srun_argv: list[str] | None = None
    command: str | None = None
    ssh_command: str | None = None
    step_id: str | None = None
    node_pid: int | None = None
    log: str | None = None
    opened_at: str | None = None
    control: bool | None = None
    # in the file only when set
    replica: int | None = field(default=None, metadata=_SET)
    took_over_from: str | None = field(default=None, metadata=_SET)
    follower: dict | None = field(default=None, metadata=_SET)
    port_closed_s: float | None = field(default=None, metadata=_SET)
    successor: str | None = field(default=None, metadata=_SET)
    handed_over_at: str | None = field(default=None, metadata=_SET)
    closed_s: float | None = field(default=None, metadata=_SET)
    route_reminded_at: str | None = field(default=None, metadata=_SET)
    closed_at: str | None = field(default=None, metadata=_SET)
    closed_by: str | None = field(default=None, metadata=_SET)
    closed_why: str | None = field(default=None, metadata=_SET)


def read_tunnel(run_dir: Path | None) -> TunnelRecord | None:
    """The tunnel record in ``run_dir`` (``None`` without one); as written, not settled (access.tunnelrecord)."""
    return None if run_dir is None else read_record(Path(run_dir) / TUNNEL, TunnelRecord)


def write_tunnel(run_dir: Path, record: TunnelRecord) -> None:
    """Replace ``run_dir``'s tunnel.json with ``record`` (atomically)."""
    write_json(Path(run_dir) / TUNNEL, record.to_dict())


@record
class PoolJob(Record):
    """One replica job of pool.json's ``jobs``: when it was submitted, went live (joined the router) and was
    released, its URL and node, and how it ``ended`` (``None`` while it runs; ``ended_at`` only once it did)."""

    job: str | None = None
    submitted_at: float | None = None
    live_at: float | None = None
    url: str | None = None
    node: str | None = None
    released_at: float | None = None
    ended: str | None = None
    ended_at: float | None = field(default=None, metadata=_SET)


@record
class PoolDecision(Record):
    """One decision of pool.json's ``decisions`` (``launch.poolpolicy``): when, ``grow`` or ``shrink``, which
    job (a shrink's), and why."""

    at: float | None = None
    action: str | None = None
    job: str | None = None
    why: str | None = None


@record
class PoolRecord(Record):
    """``pool.json``: the elastic pool (``launch.pool``): its bounds (the replicas it ``started`` with,
    ``MAX_REPLICAS``, ``SCALE_UP_WAIT_S``, ``SCALE_UP_WINDOW_S``, ``IDLE_STOP_AFTER_S``), every replica job it
    submitted and every decision. ``jobs`` is ``None`` when the file has no list of them (no pool record)."""

    started: int | None = None
    max_replicas: int | None = None
    wait_s: float | None = None
    window_s: float | None = None
    idle_s: float | None = None
    jobs: list[PoolJob] | None = None
    decisions: list[PoolDecision] = field(default_factory=list)


@record
class ReplicaRow(Record):
    """One replica of endpoint.json's ``replicas`` list (``launch.replicas``): its rank, node, base URL and
    address, whether it is ``alive``, and why it ``ended`` (``None`` while alive)."""

    rank: int | None = None
    node: str | None = None
    base_url: str | None = None
    address: str | None = None
    alive: bool | None = None
    ended: str | None = None


def _urls(data: Mapping, key: str) -> list[str]:
    value = data.get(key)
    return [str(v) for v in value if str(v)] if isinstance(value, list) else []


@record
class EndpointRecord(Record):
    """``endpoint.json``: what the operator needs once the endpoint answers, written by the launcher once live
    (``launch.launcher``; ``readiness`` prints it as the endpoint block and fills the commands to paste:
    ``stop``, ``curl``, ``curls``, ``python``, ``client_api_key``) and rewritten as replicas are lost
    (``launch.replicas``: ``replicas``, ``min_replicas``, the live ``base_urls``/``addresses``, or behind a
    router the live ``replica_urls``/``replica_addresses``) and as the elastic pool changes (``launch.pool``:
    ``pool``, ``router["workers"]``). ``base_url`` is the first of ``base_urls``, written after ``metrics_at``
    (a file with ``base_url`` only reads as that one URL).

    The fields up to ``api_key_file`` are in every file the launcher writes; the later ones only when set
    (``None``: absent from the file). ``gateway`` and ``router_state`` are never in the file: status reads the
    gateway's and the router's state files beside it (:meth:`JobFiles.endpoint`) and shows them here."""

    job_id: str | None = None
    served_model_name: str | None = None
    model: str | None = None
    engine: str | None = None
    shape: str | None = None
    base_urls: list[str] = field(default_factory=list, metadata=filed(read=_urls))
    api_key_required: bool | None = None
    run_dir: str | None = None
    startup_s: float | None = None
    nodes: list[str] = field(default_factory=list)
    metrics: bool | None = None  # None: the engine serves /metrics (vLLM always; SGLang unless turned off)
    restart: int = field(default=0, metadata=filed(read=_count))  # SLURM_RESTART_COUNT of the run that went live
    key_file: str | None = None  # SERVER_API_KEY_FILE: the printed curl reads the key from it
    node_local: bool = False  # SERVER_HOST binds loopback: only the node itself, or `env_layers tunnel`, reach it
    # the Prometheus URL when it is not the base URL's root (a router's own port); then the file's base_url
    metrics_at: str | None = field(default=None, metadata=filed(then="base_url"))
    stop: str | None = None  # the commands to paste (readiness.add_usage)
    curl: str | None = None
    curls: list[str] = field(default_factory=list)
    python: str | None = None
    client_api_key: str | None = None
    addresses: list[str] = field(default_factory=list)  # the node addresses behind base_urls
    api_key_file: str | None = None  # what `env_layers connect` names
    # in the file only when set
    replica_urls: list[str] | None = field(default=None, metadata=_SET)  # behind a router: the live replicas' URLs
    replica_addresses: list[str] | None = field(default=None, metadata=_SET)
    router: dict | None = field(default=None, metadata=_SET)  # launch.router.Router.record()
    replicas: list[ReplicaRow] | None = field(default=None, metadata=_SET)
    min_replicas: int | None = field(default=None, metadata=_SET)
    pool: dict | None = field(default=None, metadata=_SET)  # {"max_replicas", "replicas": [{"job", "url", "node"}]}
    site: str | None = field(default=None, metadata=_SET)  # the site layer the job was rendered with (ENVLAYERS_SITE)
    # never in the file: the state files beside it, as status shows them
    gateway: GatewayState | None = field(default=None, metadata=_SET)
    router_state: RouterState | None = field(default=None, metadata=_SET)

    @property
    def base_url(self) -> str | None:
        return self.base_urls[0] if self.base_urls else None

    @property
    def dead_ranks(self) -> set[int]:
        """The ranks listed as dropped replicas: their exits do not mean the job is ending."""
        return {r.rank for r in self.replicas or [] if r.alive is False and r.rank is not None}

    @classmethod
    def _older(cls, data: Mapping) -> Mapping:
        """A file with ``base_url`` and no URL in ``base_urls`` (written before there were replicas)."""
        old = data.get("base_url")
        if isinstance(old, str) and old and not _urls(data, "base_urls"):
            return {**data, "base_urls": [old]}
        return data


def read_endpoint(run_dir: Path) -> EndpointRecord | None:
    """The endpoint.json in ``run_dir`` as written (``None`` before the endpoint is live)."""
    return read_record(Path(run_dir) / ENDPOINT, EndpointRecord)


def chain_of(run_dir: "str | os.PathLike | None") -> ChainRecord | None:
    """The run directory's chain.json (``None`` when the job is no link of a chain)."""
    if not run_dir:
        return None
    record = read_record(Path(run_dir) / CHAIN, ChainRecord)
    return record if record is not None and record.is_link else None


def read_serve_env(run_dir: Path | None) -> dict[str, str]:
    """The run's serve.env as text values: assignments whose value is literal text (references are left
    out); ``{}`` when absent, unreadable or not an env file."""
    from .envfile import parse_text
    from .errors import EnvLayersError

    if run_dir is None:
        return {}
    path = Path(run_dir) / SERVE_ENV
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    try:
        assignments = parse_text(text, str(path))
    except EnvLayersError:
        return {}
    return {a.key: "".join(a.value) for a in assignments if all(isinstance(part, str) for part in a.value)}


def earlier_run_dirs(run_dir: Path | None) -> dict[int, Path]:
    """n -> ``run-<n>/``: the folders earlier runs of a requeued job were moved into, in run order."""
    if run_dir is None:
        return {}
    try:
        entries = list(Path(run_dir).iterdir())
    except OSError:
        return {}
    found = {int(m.group(1)): e for e in entries if (m := _RUN_SUBDIR_RE.match(e.name)) and e.is_dir()}
    return dict(sorted(found.items()))


MAX_LINKS = 1000  # a chain.json cycle (a hand-edited file) must not loop forever


def chain_links(job_id: str, run_dir: "str | Path | None") -> list[tuple[str, Path]]:
    """``[(job id, run dir), ...]``: this job, then each successor its ``chain.json`` names, in order (each
    successor's run directory is beside its predecessor's, ``$RUN_ROOT/<jobid>``)."""
    if not run_dir:
        return []
    links = [(str(job_id), Path(run_dir))]
    seen = {str(job_id)}
    while len(links) < MAX_LINKS:
        record = read_record(links[-1][1] / CHAIN, ChainRecord)
        succ = record.successor if record is not None else None
        if succ is None or succ in seen:  # a job id (ChainRecord), never a path
            break
        seen.add(succ)
        links.append((succ, links[-1][1].parent / succ))
    return links


def end_recorded(run_dir: Path) -> bool:
    """Whether the run's launcher recorded its end (``launch-end.json`` is there): the run is over."""
    return (Path(run_dir) / LAUNCH_END).exists()


def serving_endpoint(run_dir: Path) -> EndpointRecord | None:
    """endpoint.json of a run that has not ended (no launch-end.json), else ``None``."""
    if end_recorded(run_dir):
        return None
    return read_endpoint(run_dir)
