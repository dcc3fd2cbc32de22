"""A job's endpoint as its owner reaches it: the job's files, ownership, the key file, and the tunnel record.

Only the job's owner gets connection details: the caller must be the user Slurm runs the job as
(``UserId``) and own the run directory. The API key itself is read only from a file the caller
owns (``apikey.read_key`` with ``owner``, :meth:`JobAccess.read_key`); everything else names the file,
never the key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .. import ops, rundir
from ..errors import EnvLayersError
from ..filetrust import user_name
from .tunnelrecord import settle



@dataclass
class JobAccess:
    """What ``connect``, ``ping``, ``tunnel`` and ``release`` need to know about one job."""

    job: ops.TrackedJob
    endpoint: rundir.EndpointRecord | None  # endpoint.json, once live
    launch: rundir.LaunchRecord | None  # launch.json
    serve_env: dict[str, str]  # serve.env's literal values

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def run_dir(self) -> Path | None:
        return self.job.files.run_dir

    @property
    def served(self) -> str | None:
        if self.endpoint is not None and self.endpoint.served_model_name:
            return self.endpoint.served_model_name
        if self.launch is not None and self.launch.served_model_name:
            return self.launch.served_model_name
        return self.serve_env.get("VLLM_SERVED_MODEL") or None

    @property
    def base_urls(self) -> list[str]:
        return self.endpoint.base_urls if self.endpoint is not None else []

    @property
    def probe_urls(self) -> list[str]:
        """The base URLs with node names replaced by the addresses the launcher recorded."""
        return ops.endpoint_urls(self.endpoint)

    @property
    def key_required(self) -> bool:
        if self.endpoint is not None and self.endpoint.api_key_required is not None:
            return self.endpoint.api_key_required
        return bool(self.key_file)

    @property
    def key_file(self) -> str | None:
        """Where the key is: endpoint.json's ``api_key_file`` if the launcher recorded one, else
        serve.env's ``SERVER_API_KEY_FILE``."""
        if self.endpoint is not None and self.endpoint.api_key_file:
            return self.endpoint.api_key_file
        from ..apikey import wants_generated

        value = self.serve_env.get("SERVER_API_KEY_FILE") or None
        if wants_generated(value):  # a per-job key: the launcher writes it in the run directory
            return str(self.run_dir / rundir.API_KEY) if self.run_dir else None
        return value

    def read_key(self, uid: int | None = None) -> str:
        """The job's key from :attr:`key_file` (set), read by the one reader (``apikey.read_key``) as a
        client's copy: only from a file the caller (``uid``, default this process's user) owns."""
        from ..apikey import read_key

        return read_key(self.key_file, named_by=f"job {self.job_id}'s key file", serving=False,
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
        info = self.job.info
        return self.endpoint is not None and info is not None and info.running and info.state != "COMPLETING"

    def tunnel(self) -> rundir.TunnelRecord | None:
        """tunnel.json as the truth of now: a tunnel that ended with its job or step says closed
        (access.tunnelrecord), and the file is brought up to date."""
        return settle(rundir.read_tunnel(self.run_dir), self.run_dir, self.job.info)

    def require_live(self, what: str) -> None:
        info = self.job.info
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


def check_owner(job: ops.TrackedJob, uid: int | None = None) -> None:
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


def open_job(job_id: str, *, run_dir: str | None = None, environ: Mapping[str, str] | None = None,
             cwd: Path | None = None, uid: int | None = None) -> JobAccess:
    """Find the job (as ``env_layers status`` does), check the caller owns it, read its files."""
    job = ops.find_job(job_id, run_dir=run_dir, environ=environ, cwd=cwd)
    check_owner(job, uid)
    files = job.files
    return JobAccess(job, files.endpoint(), files.launch(), rundir.read_serve_env(files.run_dir))


def open_serving(job_id: str, *, run_dir: str | None = None) -> tuple[JobAccess, dict | None]:
    """The job of ``job_id``'s chain that serves now: the job itself, or (when it handed over) its newest live
    successor, opened as :func:`open_job` opens it, with ``access.chain.newest_live``'s record of the move
    (None when the job serves itself)."""
    from .chain import newest_live

    acc = open_job(job_id, run_dir=run_dir)
    moved = newest_live(acc.job_id, acc.run_dir)
    if moved is None:
        return acc, None
    return open_job(moved["to"], run_dir=moved["run_dir"]), {**moved, "from_state": acc.job.info.state
                                                               if acc.job.info else None}
