"""The in-job launcher without Slurm for the tests: launch keys of each shape, an allocation of fake nodes,
the supervision loop on the fake clock (clocktools.Clock) with fake steps and rank files written as ranks
would, and the job script's run-directory block as a script of its own."""

from __future__ import annotations

import os
from pathlib import Path

from envlayers.launch.prepare import Allocation, Node, prepare
from envlayers.launch.replicas import Survivors
from envlayers.launch.supervise import Supervisor
from envlayers.readiness import Probe
from envlayers.rundir import EndpointRecord

PIPELINE = {"INFERENCE_ENGINE": "sglang", "INFERENCE_MODEL": "zai-org/GLM-5.3", "VLLM_SERVED_MODEL": "s",
            "INFERENCE_NODES": "2", "PIPELINE_PARALLEL_SIZE": "2", "NCCL_NET_GDR_LEVEL": "LOC"}
SINGLE_VLLM = {"INFERENCE_ENGINE": "vllm", "INFERENCE_MODEL": "Qwen/Qwen3-8B", "VLLM_SERVED_MODEL": "q"}
SINGLE_SGLANG = {**SINGLE_VLLM, "INFERENCE_ENGINE": "sglang"}
N1, N2 = Node("n1", "10.0.0.1", True), Node("n2", "10.0.0.2", True)



def alloc(tmp_path: Path, nodes=(N1, N2), **kw) -> Allocation:
    return Allocation(job_id="42", run_dir=tmp_path, nodes=tuple(nodes), cpus_on_node="192", **kw)


# --------------------------------------------------------------------------- the supervision loop


class Step:
    """The srun step of the ranks: ``code`` is what its poll returns (None while it runs)."""

    def __init__(self):
        self.code = None

    def poll(self):
        return self.code


class Stop(BaseException):
    """Raised by a clock event to end a loop that would run on."""


def stop():
    raise Stop


def started(run_dir: Path, rank: int) -> None:
    (run_dir / f"server-{rank}.log").write_text(f"ENVLAYERS-STAGE: rank {rank} up on n{rank + 1}\n")


def exited(run_dir: Path, rank: int, code: int, mtime_s: float) -> None:
    path = run_dir / f"rank-{rank}.exit"
    path.write_text(f"{code}\n")
    os.utime(path, ns=(int(mtime_s * 1e9), int(mtime_s * 1e9)))


def supervisor(tmp_path, clock, step, *, probe_ok=lambda url: False, budget=100, rank_start=30, said=None, live=None,
               generate=None, diag=None, **keys):
    keys = {**PIPELINE, "ENVLAYERS_READY_TIMEOUT_S": str(budget), "ENVLAYERS_RANK_START_TIMEOUT": str(rank_start),
            **keys}
    lp = prepare(keys, alloc(tmp_path, ifaces={"hsn0": "1.2.3.4"}))
    said = [] if said is None else said

    def probe(url, served, key, timeout_s):
        ok = probe_ok(url)
        return Probe(url, ok, 200 if ok else None, "ok" if ok else "no answer: [Errno 111] Connection refused")

    def on_live(elapsed):
        (live if live is not None else []).append(elapsed)

    return Supervisor(lp, step, probe=probe, on_live=on_live, say=said.append, clock=clock, sleep=clock.sleep,
                      generate=generate, background=False, diag=diag)


def grow(run_dir: Path, rank: int, line: str) -> None:
    with open(run_dir / f"server-{rank}.log", "a") as fh:
        fh.write(line + "\n")


# --------------------------------------------------------------------------- replicas


N3 = Node("n3", "10.0.0.3", True)
REPLICAS = {**SINGLE_VLLM, "INFERENCE_NODES": "3", "INFERENCE_MODE": "replicas"}
NODES3 = (Node("n1", "10.0.0.1", True), Node("n2", "10.0.0.2", True), N3)


class Steps(Step):
    """One step per replica: ``ended`` lists the ranks whose step was ended."""

    def __init__(self):
        super().__init__()
        self.ended: list[int] = []
        self.survive = False

    def end(self, rank):
        self.ended.append(rank)


def replicas_loop(tmp_path, clock, *, minimum=1, health=None, said=None):
    keys = {**REPLICAS, "ENVLAYERS_READY_TIMEOUT_S": "100"}
    lp = prepare(keys, alloc(tmp_path, nodes=NODES3))
    said = [] if said is None else said
    steps, released = Steps(), []

    def release(keep):
        released.append(list(keep))
        return None

    surv = Survivors(lp, steps, minimum, say=said.append, tail=lambda p: ["last words"], release=release,
                     background=lambda fn: fn())

    def probe(url, served, key, timeout_s):
        return Probe(url, True, 200, "ok")

    def on_live(elapsed):
        surv.went_live(EndpointRecord(base_urls=[t.url for t in lp.targets], addresses=[t.address for t in lp.targets]))

    sup = Supervisor(lp, steps, probe=probe, on_live=on_live, say=said.append, clock=clock, sleep=clock.sleep,
                     survivors=surv, health=health)
    for r in range(3):
        started(tmp_path, r)
    return sup, steps, released, said


# --------------------------------------------------------------------------- Ray and its gateway


RAY_BASE = {"INFERENCE_ENGINE": "vllm", "INFERENCE_MODEL": "org/m", "VLLM_SERVED_MODEL": "served"}
RAY = {**RAY_BASE, "INFERENCE_NODES": "2", "GPUS_PER_NODE": "4", "TENSOR_PARALLEL_SIZE": "8"}
GATEWAY = {**RAY_BASE, "INFERENCE_NODES": "2", "GPUS_PER_NODE": "4", "TENSOR_PARALLEL_SIZE": "4",
           "NUMBER_OF_INSTANCES": "2", "USE_RAY_SERVE": "true"}
RAY_NODES = (Node("n1", "10.9.0.1", True), Node("n2", "10.9.0.2", True))


def ray_alloc(tmp_path: Path, nodes=RAY_NODES) -> Allocation:
    return Allocation("77", tmp_path, nodes, ifaces={"hsn0": "10.9.0.1"})


# --------------------------------------------------------------------------- the job script's run folder


def run_dir_block(tmp_path: Path) -> Path:
    """The job script from RUN_DIR= to the run_dir= line, cut from a real rendered job, as a script file."""
    from envlayers.jobscript import prepare as prepare_job

    mine = tmp_path / "mine.env"
    mine.write_text("CONTAINER_RUNTIME=none\n")
    script = prepare_job(Path(__file__).resolve().parents[1], "qwen38", env_file=mine, python="python3").script
    last = 'echo "ENVLAYERS-STAGE: run_dir=$RUN_DIR"\n'
    block = tmp_path / "block.sh"
    block.write_text("set -euo pipefail\ntrap '' XFSZ\n[ -z \"${LIMIT_KB:-}\" ] || ulimit -f \"$LIMIT_KB\"\n"
                     + script[script.index('RUN_DIR="${RUN_ROOT'):script.index(last) + len(last)])
    return block

