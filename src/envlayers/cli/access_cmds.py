"""``connect``, ``ping``, ``tunnel``, ``release``: reach a live endpoint from elsewhere, then give it back.

Thin click wrappers around ``envlayers.access`` (imported when a command runs); docs/access.md.
Exit statuses: 0 done, 1 the endpoint/tunnel/release failed, 2 bad input or could not run.
"""

from __future__ import annotations

import json
import os

import click

from .params import Seconds

_RUN_DIR_HELP = "The job's run directory, when it is not where the job output says (or the output is gone)."


def _dump(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@click.command()
@click.argument("job_id", metavar="JOBID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--show-key", is_flag=True, help="Print the API key itself (only when you own its file).")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None, help=_RUN_DIR_HELP)
def connect(job_id: str, as_json: bool, show_key: bool, run_dir: str | None) -> None:
    """What a client needs to use JOBID's endpoint: base URL(s), model name, and whether a key is
    needed and which file holds it (never the key, unless --show-key). For the job's owner only.

    Exit 0 with the endpoint; 2 when there is no such job, it is not yours, or it is not live yet."""
    from ..access.connect import connect_info
    from .access_format import format_connect
    from ..access.job import open_job

    data = connect_info(open_job(job_id, run_dir=run_dir), show_key=show_key)
    if as_json:
        _dump(data)
    else:
        click.echo(format_connect(data), nl=False)


@click.command()
@click.argument("target", metavar="JOBID|URL")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--api-key-file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Read the key from FILE (default with a JOBID: the job's key file, when it needs one).")
@click.option("--model", default=None, help="With a URL: the model name to ask for (default: the first listed).")
@click.option("--timeout-s", "timeout_s", type=Seconds(zero_ok=False, minimum=0.1, maximum=600), default=10.0, show_default=True,
              metavar="S", help="Timeout of each request.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None, help=_RUN_DIR_HELP)
@click.pass_context
def ping(ctx: click.Context, target: str, as_json: bool, api_key_file: str | None, model: str | None,
         timeout_s: float, run_dir: str | None) -> None:
    """Check an endpoint: GET /v1/models and a one-token chat completion, with latency.

    \b
    TARGET is a job id (its endpoint, every replica; for a job of a chain of successors, the job of the
    chain that serves now) or a base URL (e.g. http://127.0.0.1:8001/v1).
    Exit 0 when both answer, 1 when they do not, 2 when the check could not run."""
    from ..apikey import read_key
    from ..job import serving_job
    from ..access.ping import EXIT_FAILED, EXIT_OK, normalize_base_url, ping as do_ping
    from .access_format import format_ping, moved_line

    key = read_key(api_key_file, named_by="--api-key-file", serving=False, owner=os.getuid()) if api_key_file else None
    from ..jobid import looks_like_job_id

    moved = None
    if looks_like_job_id(target):
        job, moved = serving_job(target, run_dir=run_dir)  # a chain's successor serves now: ping that one
        job.require_live("ping")
        if key is None:
            key = job.client_key()
        urls, served = job.reachable_urls, model or job.served
    else:
        urls, served = [normalize_base_url(target)], model
    results = [do_ping(url, served, key, timeout_s) for url in urls]
    if as_json:
        _dump({"ok": all(r.ok for r in results), "results": [r.to_dict() for r in results], "moved": moved})
    else:
        if moved:
            click.echo(f"moved: {moved_line(moved, moved['from_state'])}")
        click.echo(format_ping(results), nl=False)
    ctx.exit(EXIT_OK if all(r.ok for r in results) else EXIT_FAILED)


@click.command()
@click.argument("job_id", metavar="JOBID")
@click.option("--to", "destination", required=True, metavar="USER@GATEWAY", help="The gateway host to tunnel to.")
@click.option("--remote-port", type=int, required=True, metavar="N",
              help="The fixed port on the gateway host that the gateway's route names.")
@click.option("--remote-bind", default=None, metavar="ADDR",
              help="Gateway-side bind address: a numeric loopback address only (default 127.0.0.1).")
@click.option("--ssh-port", type=int, default=None, metavar="N", help="The gateway's sshd port (default: ssh's).")
@click.option("--identity", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Private key for the gateway (ssh -i), readable on the API node.")
@click.option("-o", "options", multiple=True, metavar="SSH_OPTION", help="An extra ssh option, Key=Value (repeatable).")
@click.option("--keep-alive", is_flag=True, help="Restart ssh when it drops while the job runs (bounded restarts).")
@click.option("--restarts", type=click.IntRange(min=1, max=100), default=5, show_default=True, metavar="N",
              help="With --keep-alive: restarts in a row before giving up (delays double from 2 s to 60 s).")
@click.option("--replica", type=click.IntRange(min=0), default=0, show_default=True, metavar="I",
              help="Which base URL to tunnel when the job has several (replicas).")
@click.option("--start-timeout", "start_timeout_s", type=Seconds(zero_ok=False, minimum=1, maximum=600), default=30.0,
              show_default=True, metavar="S", help="How long to wait for the gateway to accept the forward.")
@click.option("--json", "as_json", is_flag=True, help="Print the tunnel record as JSON.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None, help=_RUN_DIR_HELP)
@click.pass_context
def tunnel(ctx: click.Context, job_id: str, destination: str, remote_port: int, remote_bind: str | None, ssh_port: int | None,
           identity: str | None, options: tuple[str, ...], keep_alive: bool, restarts: int, replica: int,
           start_timeout_s: float, as_json: bool, run_dir: str | None) -> None:
    """Open a reverse SSH tunnel from the node serving JOBID's API to a fixed loopback port on a
    gateway host, as a step of the job (it ends with the job). Prints the gateway route entry.

    \b
    Exit 0 once the gateway accepted the forward; 1 when it did not (e.g. the port is still held
    by an earlier forward: the commands to clear it are printed); 2 on bad input."""
    from ..access.gateway import (Gateway, check_destination, check_identity, check_options, check_port,
                                  check_remote_bind)
    from ..access.job import open_job
    from ..access.tunnel import TunnelFailed, TunnelSpec, api_target, open_tunnel

    bind = check_remote_bind(remote_bind)
    gateway = Gateway(check_destination(destination),
                      check_port(ssh_port, "--ssh-port") if ssh_port is not None else None,
                      check_identity(identity), check_options(options))
    check_port(remote_port, "--remote-port")
    acc = open_job(job_id, run_dir=run_dir)
    acc.require_live("tunnel")
    node, port = api_target(acc, replica)
    from ..access.handover import follows, start_follower

    spec = TunnelSpec(acc.job_id, node, port, gateway, bind, remote_port, keep_alive, restarts, control=follows(acc))
    try:
        result = open_tunnel(acc, spec, start_timeout_s=start_timeout_s, replica=replica)
    except TunnelFailed as err:
        click.echo(f"env_layers: error: {err}", err=True)
        for line in err.lines:
            click.echo(f"  {line}", err=True)
        ctx.exit(err.exit_code)
    if spec.control:  # a chain of successors: the tunnel follows it (access.handover)
        start_follower(acc, result.record)
    if as_json:
        _dump(result.to_dict())
        return
    rec = result.record
    click.echo(f"tunnel: up: {node} 127.0.0.1:{port} -> {gateway.destination} {bind}:{remote_port} "
               f"(step {rec.step_id}, srun pid {rec.srun_pid}, node pid {rec.node_pid})")
    if spec.control:
        click.echo(f"tunnel: follows the chain of successors: when job {acc.job_id}'s successor is live, its tunnel "
                   f"takes over {bind}:{remote_port} before this job drains (chain follower pid "
                   f"{rec.follower['pid']}; tunnel.log of each job says each handover)")
    if keep_alive:
        click.echo(f"tunnel: --keep-alive: ssh is restarted when it drops while the job runs, up to {restarts} times "
                   "in a row, 2 s to 60 s apart; tunnel.log says each restart")
    check = result.gateway_check
    if check and check["state"] == "answers":
        click.echo(f"gateway: {bind}:{remote_port} answers on the gateway host ({check['detail']})")
    elif check:
        click.echo(f"gateway: not confirmed from here ({check['detail']}); on the gateway host: "
                   f"curl -s http://{bind}:{remote_port}/v1/models")
    click.echo("gateway route entry:")
    click.echo(f"  base_url: {rec.route['base_url']}")
    click.echo(f"  provider_model_id: {rec.route['provider_model_id']}")
    if acc.key_required:
        click.echo(f"  api key: required; it is in {acc.key_file or 'the job key file'}")
    click.echo(f"recorded: {rec.log.rsplit('/', 1)[0]}/tunnel.json (log: tunnel.log)")
    ends = "the chain" if spec.control else f"job {acc.job_id}"
    click.echo(f"the tunnel ends with {ends}; release everything: env_layers release {acc.job_id}")


@click.command()
@click.argument("job_id", metavar="JOBID")
@click.option("--json", "as_json", is_flag=True, help="Print the steps as JSON.")
@click.option("--timeout-s", "--timeout", "timeout_s", type=Seconds(zero_ok=True), default=60.0, show_default=True, metavar="S",
              help="How long to wait for Slurm to say the job ended.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None, help=_RUN_DIR_HELP)
@click.pass_context
def release(ctx: click.Context, job_id: str, as_json: bool, timeout_s: float, run_dir: str | None) -> None:
    """Release JOBID in order: remove the gateway route (reminder), close the tunnel (by its recorded
    PID, checked), stop the server and cancel the allocation, confirm the gateway port is closed.

    Exit 0 when everything is released (a second run says so), 1 when a step failed, 2 when there is no
    such job or it is not yours."""
    from ..access.job import open_job
    from ..access.release import release as do_release
    from .access_format import format_release

    result = do_release(open_job(job_id, run_dir=run_dir), stop_timeout_s=timeout_s)
    if as_json:
        _dump(result.to_dict())
    else:
        click.echo(format_release(result), nl=False)
    ctx.exit(0 if result.ok else 1)
