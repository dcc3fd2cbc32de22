"""``release``: give everything back in order, and say what each step did.

1. the gateway route: a reminder with the exact entry to remove (the gateway must stop sending
   traffic to a port that is about to close);
2. the tunnel: closed by its recorded PID and step, only when that PID still runs the recorded command;
3. the server and the allocation: ``env_layers stop`` (``ops.stop_job``), reused as is;
4. the gateway port: asked from the gateway host whether it still answers.

Idempotent: a second run finds each step done and says everything is already released.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from .. import ops
from .gateway import Gateway, check_gateway_port, find_holder_commands
from .job import JobAccess
from .tunnel import close_tunnel


@dataclass
class Step:
    name: str  # route | tunnel | job | gateway-port
    status: str  # done | already | failed | skipped | reminder
    detail: str
    lines: list[str] = field(default_factory=list)  # extra lines to print under it


@dataclass
class ReleaseResult:
    job_id: str
    steps: list[Step]

    @property
    def ok(self) -> bool:
        return not any(s.status == "failed" for s in self.steps)

    @property
    def already(self) -> bool:
        return all(s.status in ("already", "skipped") for s in self.steps if s.name != "route")

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "ok": self.ok, "already_released": self.already,
                "steps": [asdict(s) for s in self.steps]}


def release(acc: JobAccess, *, stop_timeout_s: float = 60.0, port_wait_s: float = 10.0,
            sleep: Callable[[float], None] = time.sleep) -> ReleaseResult:
    record = acc.tunnel()
    steps: list[Step] = []
    # 1. the route
    if record is None:
        steps.append(Step("route", "skipped", "no tunnel was recorded for this job, so no gateway route names it"))
    else:
        route = record.route or {}
        closed = record.state == "closed"
        # an older record closed by release has no closed_by: it was reminded then
        reminded = bool(record.route_reminded_at) or (closed and record.closed_by in (None, "release"))
        if reminded:
            said = "reminded when the tunnel was closed: this route must be gone from the gateway's registry"
        elif closed:
            said = (f"the tunnel closed at {record.closed_at} ({record.closed_why}): remove this route "
                    "from the gateway's model registry and reload the gateway; its port leads nowhere now")
        else:
            said = "remove this route from the gateway's model registry and reload the gateway now, before its port closes"
        steps.append(Step("route", "already" if reminded else "reminder", said,
                          [f"base_url: {route.get('base_url')}", f"provider_model_id: {route.get('provider_model_id')}"]))
        if not reminded and acc.run_dir is not None:
            from ..rundir import write_tunnel
            from .tunnelrecord import now_iso

            try:
                write_tunnel(acc.run_dir, replace(record, route_reminded_at=now_iso()))
            except OSError:
                pass
    # 2. the tunnel (and the process that carries it along a chain of successors)
    from .handover import stop_follower

    stopped_follower = stop_follower(record)
    status, detail = close_tunnel(acc)
    if stopped_follower:
        detail = f"{detail}, {stopped_follower}" if detail else stopped_follower
    steps.append(Step("tunnel", {"closed": "done"}.get(status, status), detail))
    # -- podman, docker (runtimes/): each rank's container stopped by its stable name, while the job runs
    containers = acc.launch.containers if acc.launch is not None else []
    if containers:
        info = acc.job.info
        steps.append(Step("containers", *stop_containers(acc.job_id, list(containers),
                                                         list(acc.launch.nodes),
                                                         bool(info and info.running),
                                                         program=acc.launch.container_program or "podman")))
    # -- end of podman, docker
    # -- a chain of successors: the later links first, so that none starts when this job ends
    later = _release_successors(acc, stop_timeout_s)
    if later is not None:
        steps.append(later)
    # 3. the server and the allocation
    stopped = ops.stop_job(acc.job_id, timeout_s=stop_timeout_s, run_dir=str(acc.run_dir) if acc.run_dir else None,
                           chain=False)  # its successors: step 2c
    lines = [f"endpoint {p['url']}: {'STILL ANSWERS' if p['answers'] else 'no longer answers'} ({p['detail']})"
             for p in stopped.probes]
    if not stopped.ok:
        what = (f"still {stopped.state_after} after {stopped.waited_s:.1f}s" if not stopped.ended
                else "the job ended but its endpoint still answers")
        steps.append(Step("job", "failed", what, lines))
    elif stopped.cancelled:
        steps.append(Step("job", "done", f"scancel sent ({stopped.state_before}); ended "
                          f"({stopped.state_after or 'gone from Slurm'}) after {stopped.waited_s:.1f}s",
                          lines))
    else:
        steps.append(Step("job", "already", f"already ended ({stopped.state_before or 'forgotten by Slurm'})", lines))
    # 4. the gateway port
    if record is None:
        steps.append(Step("gateway-port", "skipped", "no tunnel recorded: no gateway port to check"))
    else:
        gateway = Gateway.from_dict(record.gateway)
        bind, port = record.remote_bind, record.remote_port
        deadline = time.monotonic() + port_wait_s
        while True:
            check = check_gateway_port(gateway, bind, port)
            if check.state != "answers" and check.state != "listening" or time.monotonic() >= deadline:
                break
            sleep(0.5)  # the gateway's sshd closes the listener once it sees the connection end
        where = f"{bind}:{port} on {gateway.destination}"
        tunnel_did = steps[1].status == "done" or any(  # or a later job's tunnel of the chain held it
            s.name == "successors" and any("tunnel closed" in ln for ln in s.lines) for s in steps)
        if check.state == "free":
            steps.append(Step("gateway-port", "done" if tunnel_did else "already",
                              f"{where} no longer answers ({check.detail})"))
        elif check.held:
            steps.append(Step("gateway-port", "failed", f"{where} still answers: {check.detail}; a forward still "
                              "holds it on the gateway host", ["on the gateway host:", *find_holder_commands(port)]))
        else:
            steps.append(Step("gateway-port", "failed", f"could not check {where}: {check.detail}",
                              [f"check it on the gateway host: curl -s --max-time 5 http://{bind}:{port}/v1/models "
                               "(should fail to connect)"]))
    return ReleaseResult(acc.job_id, steps)


def _release_successors(acc: JobAccess, stop_timeout_s: float) -> Step | None:
    """Stop every later link of the job's chain (its tunnel, then the job; a pending one is cancelled)."""
    from ..errors import EnvLayersError
    from ..rundir import chain_links
    from .handover import stop_follower
    from .job import open_job

    links = chain_links(acc.job_id, acc.run_dir)[1:]
    if not links:
        return None
    said, failed = [], False
    for jid, folder in links:
        try:
            link = open_job(jid, run_dir=str(folder))
        except EnvLayersError as err:
            said.append(f"job {jid}: {err.message}")
            continue
        stop_follower(link.tunnel())
        how, detail = close_tunnel(link)
        stopped = ops.stop_job(jid, timeout_s=stop_timeout_s, run_dir=str(folder), chain=False)
        failed = failed or not stopped.ok
        ended = (f"{stopped.state_before} -> {stopped.state_after or 'gone from Slurm'}" if stopped.cancelled
                 else f"already ended ({stopped.state_before or 'forgotten by Slurm'})")
        said.append(f"job {jid}: tunnel {how}; {ended}" + ("" if stopped.ok else " (NOT ended or still answers)"))
    status = "failed" if failed else ("done" if any("->" in s for s in said) else "already")
    return Step("successors", status, f"{len(links)} later job(s) of the chain", said)


def stop_containers(job_id: str, containers: list, nodes: list, running: bool, run=None,
                    program: str = "podman") -> tuple[str, str]:
    """(status, detail) for release: ``podman stop`` (or ``docker stop``) each container launch.json names,
    on its node, while the job runs (after it ended, ranks.sh's ``run --rm`` took its container with it);
    ``runtimes.podman.stop_argv`` says how, this runs it."""
    from .. import slurm
    from ..runtimes.podman import stop_argv

    if not running:
        return "already", f"the job is not running; its containers ({program} run --rm) ended with it"
    run = run or (lambda argv: slurm.run(argv, timeout_s=90))
    done, failed = [], []
    for rank, name in enumerate(containers):
        node = nodes[rank] if rank < len(nodes) else (nodes[0] if nodes else "")
        try:
            proc = run(stop_argv(job_id, node, name, program=program))
            ok = proc.returncode == 0
            why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        except (OSError, slurm.SlurmError) as err:
            ok, why = False, str(err)
        (done if ok else failed).append(name if ok else f"{name} on {node}: {why}")
    if failed:
        return "failed", f"{program} stop failed: " + "; ".join(failed)
    return "done", f"{program} stop " + " ".join(done)
