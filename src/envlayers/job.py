"""A launched job as every operator command holds it: the one ``Job`` handle.

From a job id (read by ``envlayers.jobid``): Slurm's record and the files of the run Slurm runs now
(:func:`find_job`, asked patiently when the caller allows it: a controller that does not answer is
asked again for ``outage_s``); the owner check (:func:`check_owner`, :func:`owned_job`); which key file a
client reads and the key from it (:meth:`Job.key_source`, :meth:`Job.read_key`); what it serves (target,
model, served name, engine, site: :meth:`Job.identity`, which ``status`` shows); the URLs that reach the
endpoint from here (:meth:`Job.reachable_urls`); and the newest live link of a chain of successors
(:func:`newest_live`, :func:`serving_job`). ``ops``, ``access``, ``verify``, ``bench``, ``batch`` and
``diagnose`` all look a job up here; and how the launcher ended (:meth:`Job.launcher_end`, from the run
directory's one reading of it, ``rundir.JobFiles.launcher_ended``, and Slurm's record).

A requeued job's run directory may still hold the previous run's files at its top (until the new run
starts and moves them into ``run-<n>/``); :func:`current_files` hides them, so no operation shows an old
run's ranks, exits or endpoint as current.

Only the job's owner gets connection details: the caller must be the user Slurm runs the job as
(``UserId``) and own the run directory. The API key itself is read only from a file the caller owns
(``apikey.read_key`` with ``owner``); everything else names the file, never the key.

Slurm is read through ``slurm.run`` (looked up at call time, so tests can replace it).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, TypeVar

from . import rundir, slurm
from .errors import EnvLayersError, SlurmUnreachable
from .filetrust import user_name
from .jobid import not_found, parse_job_id

SLURM_OUTAGE_S = 300.0  # how long `wait` and `status` retry a controller that does not answer
OUTAGE_ENV = "ENVLAYERS_SLURM_OUTAGE_S"  # the environment's say on it (docs/operating.md)
OUTAGE_RETRY_S = 1.0  # pause between two asks while Slurm does not answer (each ask itself takes its time)

_T = TypeVar("_T")


@dataclass
class Clock:
    """Time as the operations see it; tests pass a fake whose ``sleep`` advances ``monotonic``."""

    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def outage_error(err: SlurmUnreachable, silent_s: float) -> SlurmUnreachable:
    """The error that ends a command after Slurm did not answer for ``silent_s`` seconds."""
    return SlurmUnreachable(
        f"Slurm did not answer for {silent_s:.0f}s, giving up: {err.message}",
        hint=f"`scontrol ping` says whether slurmctld is up; the job itself runs on without it: ask again once "
             f"it answers (--slurm-outage S or {OUTAGE_ENV} sets how long to keep trying)")


def patiently(ask: Callable[[], _T], *, outage_s: float, clock: Clock | None = None,
              on_silent: Callable[[str], None] | None = None, retry_s: float = OUTAGE_RETRY_S) -> _T:
    """``ask()``, asked again while Slurm does not answer (``SlurmUnreachable``), until it answers or it
    has been silent for ``outage_s`` seconds. ``on_silent(why)`` is called once, at the first silence.
    With ``outage_s`` 0 the first silence is the error as it is. Any other error ends it at once."""
    clock = clock or Clock()
    start = clock.monotonic()
    said = False
    while True:
        try:
            return ask()
        except SlurmUnreachable as err:
            if outage_s <= 0:
                raise
            silent_s = clock.monotonic() - start
            if silent_s >= outage_s:
                raise outage_error(err, silent_s) from None
            if not said and on_silent is not None:
                on_silent(err.message)
                said = True
            clock.sleep(min(retry_s, outage_s - silent_s))


def waiting_to_start(info: slurm.JobInfo | None) -> bool:
    """Pending, or on its way back to pending (Slurm's ``REQUEUED``, ``REQUEUE_HOLD``, ``REQUEUE_FED``)."""
    return info is not None and (info.pending or (info.state or "").startswith("REQUEUE"))


def current_files(files: rundir.JobFiles, info: slurm.JobInfo | None) -> rundir.JobFiles:
    """``files`` with ``previous_at_top`` set from Slurm's record and the top-level launch.json."""
    if info is None:
        stale = False  # Slurm forgot the job: the files are all there is
    else:
        stale = rundir.top_is_previous(files.recorded_restart(), info.restarts, waiting_to_start(info))
    if stale == files.previous_at_top:
        return files
    return rundir.JobFiles(files.job_id, files.job_out, files.run_dir, previous_at_top=stale)


def endpoint_urls(ep: rundir.EndpointRecord | None) -> list[str]:
    """The URLs that reach an endpoint from here: endpoint.json's ``addresses`` matching the base URLs, each
    either a URL (used as is) or an IP (put in the base URL's place, since node names may not resolve on
    the login node); else the base URLs."""
    return [] if ep is None else _reachable(ep.base_urls, ep.addresses)


def replica_urls(ep: rundir.EndpointRecord | None) -> list[str]:
    """Each replica's own URL from here: behind a router (endpoint.json's ``replica_urls`` and
    ``replica_addresses``, the live replicas) the replicas' URLs with their node addresses put in, else
    the same as :func:`endpoint_urls`."""
    if ep is None or not ep.replica_urls:
        return endpoint_urls(ep)
    return _reachable(ep.replica_urls, ep.replica_addresses or [])


def _reachable(bases: list[str], addresses: list[str]) -> list[str]:
    urls = []
    for i, base in enumerate(bases):
        addr = addresses[i] if i < len(addresses) else None
        if not addr:
            urls.append(base)
        elif "://" in str(addr):
            urls.append(str(addr))
        else:
            urls.append(_with_host(base, str(addr)))
    return urls


def _with_host(url: str, host: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


# what Job.identity() says -> its field in (endpoint.json, launch.json, serve.env); None: that record has none
IDENTITY_FIELDS = {
    "target": (None, "target", "ENVLAYERS_TARGET"),
    "model_id": ("model", "model", "INFERENCE_MODEL"),
    "served_name": ("served_model_name", "served_model_name", "VLLM_SERVED_MODEL"),
    "engine": ("engine", "engine", "INFERENCE_ENGINE"),
    "site": ("site", "site", "ENVLAYERS_SITE"),
}


@dataclass
class KeySource:
    """Which key file a job's clients read, and what named it: ``record`` (the run directory file that
    says it) and ``named_by`` (its field there). ``path`` is ``None`` when no file is recorded."""

    path: str | None
    record: str
    named_by: str


@dataclass
class Job:
    """A job: Slurm's record (``None`` once Slurm forgot it) and the current run's files
    (``files.previous_at_top`` when the top-level files are an earlier run's); the run's records are read
    once, and again after :meth:`update`."""

    job_id: str
    info: slurm.JobInfo | None
    files: rundir.JobFiles
    _read: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def state(self) -> str | None:
        return self.info.state if self.info else None

    @property
    def restart(self) -> int:
        """Which run Slurm runs now: 0 for the first, N after N requeues (0 when Slurm did not say)."""
        return (self.info.restarts or 0) if self.info else 0

    @property
    def requeued(self) -> bool:
        """Slurm requeued the job and the run it will start (or started) has not written its files yet."""
        return self.files.previous_at_top and self.restart > 0

    def update(self, info: slurm.JobInfo | None, files: rundir.JobFiles | None = None) -> None:
        """A new Slurm record (and files): which run is current is decided again."""
        self.info = info
        self.files = current_files(files or self.files, info)
        self._read.clear()

    @property
    def run_dir(self) -> Path | None:
        return self.files.run_dir

    def _once(self, name: str, read: Callable):
        if name not in self._read:
            self._read[name] = read()
        return self._read[name]

    @property
    def endpoint(self) -> rundir.EndpointRecord | None:
        """endpoint.json of the current run, once live."""
        return self._once("endpoint", self.files.endpoint)

    @property
    def launch(self) -> rundir.LaunchRecord | None:
        """launch.json of the current run."""
        return self._once("launch", self.files.launch)

    @property
    def serve_env(self) -> dict[str, str]:
        """serve.env's literal values."""
        return self._once("serve_env", lambda: rundir.read_serve_env(self.run_dir))

    def identity(self) -> dict[str, str | None]:
        """What the job serves, in the words every command uses (text and ``--json``):

        - ``target``: the catalog target it was launched from (``experiment:glm53``; ``None`` without one);
        - ``model_id``: the model the engine loaded (``zai-org/GLM-5.3``: INFERENCE_MODEL);
        - ``served_name``: the name clients pass as ``model`` (the served model name);
        - ``engine``: ``sglang`` or ``vllm``;
        - ``site``: the site layer it was rendered with (``mi300a``; ``None`` for a catalog without sites).

        From endpoint.json, else launch.json, else the run's serve.env (not while the top-level files are an
        earlier run's): the same answer before, while and after the endpoint is live. Each record spells a
        field one way (:data:`IDENTITY_FIELDS`)."""
        return self._once("identity", self._identity)

    def _identity(self) -> dict[str, str | None]:
        found: dict = dict.fromkeys(IDENTITY_FIELDS)
        sources = (lambda: self.endpoint.to_dict() if self.endpoint is not None else {},
                   lambda: self.launch.to_dict() if self.launch is not None else {},
                   lambda: {} if self.files.previous_at_top else self.serve_env)
        for column, read in enumerate(sources):
            if all(found.values()):
                break
            data = read()
            for name, spellings in IDENTITY_FIELDS.items():
                value = data.get(spellings[column])
                if found[name] is None and value not in (None, ""):
                    found[name] = str(value)
        return found

    @property
    def served(self) -> str | None:
        """The name clients pass as ``model``: :meth:`identity`'s ``served_name``."""
        return self.identity()["served_name"]

    @property
    def base_urls(self) -> list[str]:
        return self.endpoint.base_urls if self.endpoint is not None else []

    @property
    def reachable_urls(self) -> list[str]:
        """The base URLs with node names replaced by the addresses the launcher recorded."""
        return endpoint_urls(self.endpoint)

    @property
    def replica_urls(self) -> list[str]:
        """Each replica's own URL from here (behind a router too): :func:`replica_urls`."""
        return replica_urls(self.endpoint)

    @property
    def key_required(self) -> bool:
        if self.endpoint is not None and self.endpoint.api_key_required is not None:
            return self.endpoint.api_key_required
        return bool(self.key_file)

    def key_source(self) -> KeySource:
        """Which key file the job's clients read: endpoint.json's ``api_key_file`` if the launcher recorded
        one, else serve.env's ``SERVER_API_KEY_FILE`` (a per-job key, ``generate``: the run directory's
        ``api-key``, which the launcher writes)."""
        from .apikey import wants_generated

        if self.endpoint is not None and self.endpoint.api_key_file:
            return KeySource(self.endpoint.api_key_file, f"{self.run_dir}/{rundir.ENDPOINT}", "api_key_file")
        said = f"{self.run_dir}/{rundir.SERVE_ENV}"
        value = self.serve_env.get("SERVER_API_KEY_FILE") or None
        if wants_generated(value):
            value = str(self.run_dir / rundir.API_KEY) if self.run_dir else None
        return KeySource(value, said, "SERVER_API_KEY_FILE")

    @property
    def key_file(self) -> str | None:
        """Where the key is (:meth:`key_source`)."""
        return self.key_source().path

    def read_key(self, uid: int | None = None) -> str:
        """The job's key from :attr:`key_file` (set), read by the one reader (``apikey.read_key``) as a
        client's copy: only from a file the caller (``uid``, default this process's user) owns."""
        from .apikey import read_key

        source = self.key_source()
        return read_key(source.path, source.record, named_by=f"job {self.job_id}'s key file", serving=False,
                        owner=os.getuid() if uid is None else uid)

    def client_key(self) -> str | None:
        """The key a client sends to this job: None when the job needs none, else read from its key file
        (:meth:`read_key`); an error when it needs one and its key file is not recorded."""
        if not self.key_required:
            return None
        if not self.key_file:
            raise EnvLayersError(f"job {self.job_id} needs a key and its key file is not recorded",
                                 hint="give it with --api-key-file FILE")
        return self.read_key()

    @property
    def live(self) -> bool:
        info = self.info
        return self.endpoint is not None and info is not None and info.running and info.state != "COMPLETING"

    def require_live(self, what: str) -> None:
        info = self.info
        jid = self.job_id
        if info is None or info.finished:
            state = info.state if info else "no longer known to Slurm"
            raise EnvLayersError(f"job {jid} has ended ({state}): nothing to {what}",
                                 hint=f"`env_layers status {jid}` shows how it ended")
        if info.pending:
            raise EnvLayersError(f"job {jid} is PENDING ({info.reason}): nothing to {what} yet",
                                 hint=f"`env_layers wait {jid}` returns once the endpoint is live")
        if self.endpoint is None or not self.base_urls:
            raise EnvLayersError(f"job {jid} is {info.state} but its endpoint is not live yet (no endpoint.json "
                                 f"in {self.run_dir or 'its run directory'})",
                                 hint=f"`env_layers wait {jid}` returns once it is")

    def launcher_end(self) -> dict:
        """How the current run's launcher ended: ``{"launcher": ..., ...}`` with ``launcher`` and what the
        launcher said as ``rundir.JobFiles.launcher_ended`` reads them (``running`` until Slurm says the job
        ended). ``slurm_state`` / ``slurm_exit`` are what Slurm reports (``None`` once it forgot the job)."""
        info = self.info
        how, said = self.files.launcher_ended(job_ended=info is None or info.finished)
        return {"launcher": how, "slurm_state": info.state if info else None,
                "slurm_exit": info.exit_code if info else None, "restart": self.restart, **said}

    def newest_live(self) -> dict | None:
        """The newest successor of the job's chain that serves now (:func:`newest_live`)."""
        return newest_live(self.job_id, self.run_dir)


def slurm_record(job_id: str) -> slurm.JobInfo | None:
    """Slurm's record of the job, or None when Slurm is not reachable from here or forgot the job: for what
    reads a job's files without needing Slurm (``diagnose``)."""
    try:
        return slurm.job_info(job_id, run=slurm.run)
    except EnvLayersError:
        return None


def locate_job(job_id: str, info: slurm.JobInfo | None, *, environ: Mapping[str, str] | None = None,
               cwd: Path | None = None, run_dir: str | None = None) -> Job:
    """The job of a Slurm record in hand (``None``: Slurm does not know it): its current run's files,
    found as ``rundir.locate`` finds them. Asks Slurm nothing and checks nothing."""
    job_id = str(job_id)
    files = rundir.locate(job_id, info, environ=environ, cwd=cwd, run_dir=run_dir)
    return Job(job_id, info, current_files(files, info))


def find_job(job_id: str, *, run_dir: str | None = None, environ: Mapping[str, str] | None = None,
             cwd: Path | None = None, outage_s: float = 0.0, clock: Clock | None = None,
             on_silent: Callable[[str], None] | None = None) -> Job:
    """Slurm's record and the files of ``job_id``; an ``EnvLayersError`` when neither exists.

    A controller that does not answer is asked again for ``outage_s`` seconds (:func:`patiently`); with the
    default 0 it is a ``SlurmUnreachable`` at once (exit 75, never "no such job" or bad input)."""
    job_id = parse_job_id(job_id)
    info = patiently(lambda: slurm.job_info(job_id, run=slurm.run), outage_s=outage_s, clock=clock,
                     on_silent=on_silent)
    job = locate_job(job_id, info, environ=environ, cwd=cwd, run_dir=run_dir)
    files = job.files
    if info is None and not (files.job_out and files.job_out.is_file()) and files.run_dir is None:
        raise not_found(job_id)
    return job


def check_owner(job: Job, uid: int | None = None) -> None:
    """Raise unless the caller is the job's owner (Slurm's UserId and the run directory's owner)."""
    uid = os.getuid() if uid is None else uid
    me = user_name(uid)
    owners = []
    if job.info is not None and job.info.user:
        owners.append(("Slurm runs it as", job.info.user))
    run_dir = job.files.run_dir
    if run_dir is not None and run_dir.is_dir():
        owners.append((f"its run directory {run_dir} belongs to", user_name(run_dir.stat().st_uid)))
    for said, owner in owners:
        if owner not in (me, str(uid)):
            raise EnvLayersError(f"job {job.job_id} is not yours: {said} {owner}, you are {me}",
                                 hint="connection details go to the job's owner only; ask them, or run this "
                                      "as that user")


def owned_job(job_id: str, *, run_dir: str | None = None, environ: Mapping[str, str] | None = None,
              cwd: Path | None = None, uid: int | None = None) -> Job:
    """Find the job (:func:`find_job`, as ``env_layers status`` does) and check the caller owns it."""
    job = find_job(job_id, run_dir=run_dir, environ=environ, cwd=cwd)
    check_owner(job, uid)
    return job


def serving_job(job_id: str, *, run_dir: str | None = None, uid: int | None = None) -> tuple[Job, dict | None]:
    """The job of ``job_id``'s chain that serves now: the job itself, or (when it handed over) its newest live
    successor, each found and owner-checked as :func:`owned_job` does, with :func:`newest_live`'s record of
    the move and ``from_state`` (None when the job serves itself)."""
    job = owned_job(job_id, run_dir=run_dir, uid=uid)
    moved = job.newest_live()
    if moved is None:
        return job, None
    return owned_job(moved["to"], run_dir=moved["run_dir"], uid=uid), {**moved, "from_state": job.state}


def newest_live(job_id: str, run_dir: str | Path | None, job_info: Callable | None = None) -> dict | None:
    """Where a chain's endpoint is now: from a job, follow ``chain.json`` (launch.successor) to the newest
    successor that serves, as ``{"from", "to", "links", "state", "base_urls", "run_dir"}`` (``links``: the
    job ids from ``from`` to ``to``); ``None`` when the job has no successor that serves (it serves itself,
    or its successor is not live yet). A client that kept a node URL learns the new one (cli.access_format
    says it in words).

    A link serves when its run directory holds ``endpoint.json`` and no ``launch-end.json`` (the run has
    not ended) and Slurm says it runs. Each successor's run directory is beside its predecessor's
    (``$RUN_ROOT/<jobid>``), as the launcher that submitted it expects."""
    links = rundir.chain_links(job_id, run_dir)
    if len(links) < 2:
        return None
    if job_info is None:
        def job_info(jid: str):
            return slurm.job_info(jid, run=slurm.run)

    for n in range(len(links) - 1, 0, -1):
        jid, folder = links[n]
        ep = rundir.serving_endpoint(folder)
        if ep is None:
            continue
        info = job_info(jid)
        if info is None or not info.running or info.state == "COMPLETING":
            continue
        return {"from": str(job_id), "to": jid, "links": [j for j, _ in links[:n + 1]], "state": info.state,
                "base_urls": list(ep.base_urls), "run_dir": str(folder)}
    return None


__all__ = [
    "OUTAGE_ENV", "SLURM_OUTAGE_S", "Clock", "Job", "KeySource", "check_owner", "current_files", "endpoint_urls",
    "find_job", "locate_job", "newest_live", "outage_error", "owned_job", "patiently", "replica_urls",
    "serving_job", "slurm_record", "waiting_to_start",
]
