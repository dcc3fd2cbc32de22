"""Jobs on the lab for the end-to-end tests (tests/slurm): a serve-only job with the stand-in engine (``Run``,
and ``Job`` for the operator commands' tests), what a test asks of it (curl, the CLI, its engine's and launcher's
PIDs, its URL from this host), a batch against it, and a job with the real vLLM (``RealRun``, ``Meter``,
``answers_openai``; tests/realvllm.py and the openai client are imported when first used). Shared by the test
modules here, none of which imports another."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from labtools import TERMINAL_STATES, processes_mentioning


REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "cluster" / "serve-only.sbatch"
STANDIN = REPO / "tests" / "standin"
BIN = Path(sys.executable).parent  # this interpreter's console scripts (env_layers), activated venv or not
BANNER = "===== endpoint is live ====="

KEYLESS = "SERVER_API_KEY_FILE=\n"  # empties the per-job key experiments/serve-only.env sets: a keyless server


# --------------------------------------------------------------------------- a job with the stand-in engine


def lab_ack(layer: str) -> str:
    """A test whose layer empties the key (KEYLESS) serves keyless on every interface of the lab's private
    namespaces: acknowledged, as an operator must (docs/keys.md). Any other layer keeps a key: the
    per-job one of experiments/serve-only.env unless the layer names its own file."""
    return "ALLOW_PUBLIC_UNAUTHENTICATED=1\n" if re.search(r"^SERVER_API_KEY_FILE=$", layer, re.M) else ""


class Run:
    def __init__(self, lab, tmp_path: Path, model: str = "qwen38", layer: str = "", **env: str):
        self.lab, self.dir = lab, tmp_path
        (tmp_path / "mine.env").write_text("CONTAINER_RUNTIME=none\n" + layer + lab_ack(layer))
        self.env = {**os.environ, **lab.env, "SCRATCH": str(tmp_path / "scratch"), "MODEL": model,
                    "SERVE_ENV_FILE": str(tmp_path / "mine.env"), "STANDIN_LOAD_SECONDS": "1",
                    "PATH": f"{STANDIN / 'bin'}:{lab.env.get('PATH', os.environ['PATH'])}",
                    "PYTHONPATH": os.pathsep.join([str(STANDIN / "pypath"), str(REPO / "src")]),
                    "STANDIN_RECORD": str(tmp_path / "engines.jsonl"),
                    **env}
        self.env.pop("ENVLAYERS_ROOT", None)
        self.job_id: str | None = None

    def sbatch(self, *args: str, submit: bool = True) -> subprocess.CompletedProcess:
        env = dict(self.env, SUBMIT="1" if submit else "0")
        proc = subprocess.run([str(SBATCH), *args], cwd=self.dir, env=env, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc

    def submit(self) -> str:
        self.job_id = json.loads(self.sbatch("--json").stdout)["job_id"]
        self.lab._submitted.append(self.job_id)  # cancelled at teardown if a test fails midway
        return self.job_id

    @property
    def out(self) -> Path:
        return self.dir / f"serve-only-{self.job_id}.out"

    @property
    def run_dir(self) -> Path:
        return self.dir / "scratch" / "inference-server" / str(self.job_id)

    def wait_for(self, pattern: str, timeout_s: float = 30) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.out.read_text(errors="replace") if self.out.exists() else ""
            if re.search(pattern, text, re.M):
                return text
            time.sleep(0.1)
        job = self.lab.job_info(self.job_id) if getattr(self, "job_id", None) else None
        seen = {k: job.get(k) for k in ("JobState", "Reason", "Restarts", "NodeList")} if job else None
        raise AssertionError(f"no /{pattern}/ in {self.out} after {timeout_s}s (Slurm: {seen}):\n{text}")

    def endpoint(self) -> dict:
        return json.loads((self.run_dir / "endpoint.json").read_text())

    def state(self, timeout_s: float = 30) -> str:
        return self.lab.wait_job(self.job_id, timeout_s=timeout_s)

    def engine_pids(self) -> list[int]:
        record = self.dir / "engines.jsonl"
        lines = record.read_text().splitlines() if record.exists() else []
        return [json.loads(line)["pid"] for line in lines]

    def assert_nothing_left(self, timeout_s: float = 15) -> None:
        """No launcher, rank wrapper or engine process of this job is alive."""
        assert self.engine_pids(), "the stand-in recorded no engine start"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            alive = [p for p in self.engine_pids() if Path(f"/proc/{p}").exists()]
            alive += processes_mentioning(str(self.run_dir))
            if not alive:
                return
            time.sleep(0.2)
        raise AssertionError(f"processes of job {self.job_id} still alive: {alive}")


def curl(url: str, body: dict | None = None, timeout_s: float = 5) -> subprocess.CompletedProcess:
    argv = ["curl", "-s", "-m", str(timeout_s), "-o", "-", "-w", "\n%{http_code}", url]
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 5)


def engine_pid(run: Run, node: str) -> int:
    """The stand-in engine's PID on ``node`` (its STANDIN_RECORD line), alive."""
    for line in (run.dir / "engines.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("env", {}).get("SLURMD_NODENAME") == node or rec.get("host") == node:
            assert os.path.exists(f"/proc/{rec['pid']}"), rec
            return rec["pid"]
    raise AssertionError(f"no engine recorded on {node}: {(run.dir / 'engines.jsonl').read_text()}")


def env_layers(run: Run, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    env = dict(run.env, PYTHONPATH=str(REPO / "src"))
    return subprocess.run([sys.executable, "-m", "envlayers", *args], cwd=run.dir, env=env, capture_output=True,
                          text=True, timeout=timeout_s)


def reachable(url: str, lab) -> str:
    return re.sub(r"http://(n\d+):", lambda m: f"http://{lab.nodes[m.group(1)]}:", url)


# --------------------------------------------------------------------------- the operator commands on a job


class Job:
    """One serve-only submission in ``tmp_path`` (the submit directory; SCRATCH under it)."""

    def __init__(self, lab, tmp_path: Path, layer: str = "", model: str = "qwen38", **env: str):
        self.lab, self.dir = lab, tmp_path
        (tmp_path / "mine.env").write_text("CONTAINER_RUNTIME=none\n" + layer + lab_ack(layer))
        self.env = {**os.environ, **lab.env, "SCRATCH": str(tmp_path / "scratch"), "MODEL": model,
                    "SERVE_ENV_FILE": str(tmp_path / "mine.env"), "SERVE_TIME": "00:10:00",
                    "STANDIN_LOAD_SECONDS": "1",
                    "PATH": f"{STANDIN / 'bin'}:{BIN}:{lab.env.get('PATH', os.environ['PATH'])}",
                    "PYTHON": sys.executable,
                    "PYTHONPATH": os.pathsep.join([str(STANDIN / "pypath"), str(REPO / "src")]), **env}
        for key in ("ENVLAYERS_ROOT", "RUN_ROOT", "ENVLAYERS_RUN_ROOT"):
            self.env.pop(key, None)
        proc = subprocess.run([str(SBATCH), "--json"], cwd=self.dir, env=self.env, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        self.job_id = json.loads(proc.stdout)["job_id"]
        lab._submitted.append(self.job_id)  # cancelled at teardown if a test fails midway

    @property
    def run_dir(self) -> Path:
        return self.dir / "scratch" / "inference-server" / self.job_id

    def cli(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "envlayers", *args], cwd=self.dir, env=self.env,
                              capture_output=True, text=True, timeout=timeout_s)


def launcher_pid(run_dir: Path) -> int | None:
    """The PID of the job's launcher: ``-m envlayers launch --run-dir <run_dir>``, a child of slurmstepd."""
    needle = b"envlayers\0launch\0--run-dir\0" + str(run_dir).encode() + b"\0"
    for pid in processes_mentioning(str(run_dir)):
        try:
            if needle not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            if Path(f"/proc/{ppid}/comm").read_text().strip() == "slurmstepd":
                return pid
        except OSError:
            continue
    return None


# --------------------------------------------------------------------------- a batch against a job


def write_input(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 4}}) + "\n")
    return path


def start_batch(run: Run, n: int, *args: str) -> tuple[subprocess.Popen, Path]:
    out = run.dir / "answers.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "envlayers", "batch", run.job_id,
                             str(write_input(run.dir / "in.jsonl", n)), "-o", str(out), "--json", *args],
                            cwd=run.dir, env=dict(run.env, PYTHONPATH=str(REPO / "src")), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, out


def answered(out: Path) -> int:
    return len(out.read_text().splitlines()) if out.exists() else 0


def wait_answered(proc: subprocess.Popen, out: Path, n: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while answered(out) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{answered(out)} answers after {timeout_s}s"
        time.sleep(0.2)


def finish(proc: subprocess.Popen, out: Path, n: int, timeout_s: float = 600, echo: bool = True) -> dict:
    """The batch's end: exit 0, every custom_id answered once (with ``echo``, by an answer that quotes its own
    prompt, as the stand-in's do: no answer went to another line)."""
    stdout, stderr = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, stdout + stderr
    ids = [json.loads(line)["custom_id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(f"q{i}" for i in range(n)) and len(ids) == n  # every one, once
    for line in out.read_text().splitlines():
        record = json.loads(line)
        assert record["response"]["status_code"] == 200
        assert not echo or f"You said: {record['custom_id']}\"" in json.dumps(record["response"]), record
    summary = json.loads(stdout)
    assert (summary["answered"], summary["failed"]) == (n, 0), summary
    assert summary["gpus"] and summary["gpu_hours"] > 0, summary  # from the job's accounting record
    return summary


# --------------------------------------------------------------------------- a job with the real vLLM


LIVE_TIMEOUT_S = 900  # the real engine on two shared cores: a minute alone, several when the machine is busy
END_TIMEOUT_S = 240
CORE_RE = re.compile(r"^\(EngineCore(?:_DP\d+)? pid=(\d+)\)", re.M)


class Meter:
    """Per-job times, and the machine's memory in use (MemTotal - MemAvailable) sampled every second."""

    def __init__(self):
        self.jobs: list[tuple[str, str, float]] = []
        self.peak_mib = self.base_mib = used_mib()
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True, name="memory-sampler")
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            self.peak_mib = max(self.peak_mib, used_mib())

    def job(self, name: str, job_id: str, seconds: float) -> None:
        self.jobs.append((name, job_id, seconds))
        print(f"\n[real-vllm] job {job_id} ({name}): {seconds:.0f}s from submission to its end", flush=True)

    def close(self) -> str:
        self._stop.set()
        self._thread.join(timeout=5)
        lines = [f"[real-vllm] {name}: job {job_id}, {seconds:.0f}s" for name, job_id, seconds in self.jobs]
        lines.append(f"[real-vllm] this file: {time.monotonic() - self.t0:.0f}s wall; memory in use peaked at "
                     f"{self.peak_mib} MiB ({self.peak_mib - self.base_mib:+d} MiB over the {self.base_mib} MiB "
                     f"at its start)")
        return "\n".join(lines)


def used_mib() -> int:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) // 1024


def real_layer(model_dir: Path, layer: str = "") -> str:
    """The operator's layer that points a vLLM catalog model at the real engine on the lab's CPUs."""
    import realvllm  # tests/realvllm.py: the real engine's virtual environment and the tiny model

    return (f"INFERENCE_MODEL={model_dir}\n"
            "GPUS_PER_NODE=1\nTENSOR_PARALLEL_SIZE=1\n"
            "REASONING_PARSER=qwen3\nTOOL_CALL_PARSER=hermes\n"
            # assigned empty: the flag is omitted (the CPU build takes --gpu-memory-utilization and ignores it:
            # its KV cache is the next key's size)
            "GPU_MEMORY_UTILIZATION=\n"
            f"SERVER_EXTRA_ARGS='--enforce-eager --max-model-len 512 --dtype {realvllm.DTYPE}'\n"
            # a layer value reaches the engine's environment: the job exports every launch key
            "VLLM_CPU_KVCACHE_SPACE=1\n"
            # keyless (acknowledged by lab_ack) unless the test names a key
            + ("" if "SERVER_API_KEY_FILE" in layer else KEYLESS) + layer)


class RealRun(Run):
    """A serve-only job whose ranks run the real ``vllm`` (first on PATH), not the stand-in."""

    def __init__(self, lab, tmp_path: Path, meter: Meter, name: str, *, model: str = "oss120b", layer: str = "",
                 path_first: str | None = None, **env: str):
        import realvllm

        super().__init__(lab, tmp_path, model=model, layer=real_layer(realvllm.model_dir(), layer),
                         SERVE_TIME="00:25:00", **env)
        first = path_first or str(realvllm.bin_dir())
        self.env["PATH"] = f"{first}:{lab.env.get('PATH', os.environ['PATH'])}"
        self.env["PYTHONPATH"] = str(REPO / "src")
        self.env.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
        for key in [k for k in self.env if k.startswith("STANDIN_")]:
            del self.env[key]
        self.meter, self.name = meter, name
        self.t_submit: float | None = None

    def submit(self) -> str:
        self.t_submit = time.monotonic()
        return super().submit()

    def text(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def ended(self) -> bool:
        info = self.lab.job_info(self.job_id)
        return info is None or info.get("JobState") in TERMINAL_STATES

    def wait_live(self, timeout_s: float = LIVE_TIMEOUT_S) -> str:
        """The job output once the endpoint block is in it; fails at once, with the output, if the job ends
        first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.text()
            if re.search("^" + re.escape(BANNER), text, re.M):
                print(f"\n[real-vllm] job {self.job_id} ({self.name}): live after "
                      f"{time.monotonic() - self.t_submit:.0f}s", flush=True)
                return text
            if self.ended():
                self.finish()
                raise AssertionError(f"job {self.job_id} ({self.name}) ended before it was live:\n{self.text()}")
            time.sleep(0.5)
        raise AssertionError(f"job {self.job_id} ({self.name}) not live after {timeout_s}s:\n{self.text()}")

    def wait_end(self, timeout_s: float = END_TIMEOUT_S) -> str:
        state = self.lab.wait_job(self.job_id, timeout_s=timeout_s, poll_interval_s=0.5)
        self.finish()
        return state

    def finish(self) -> None:
        if self.t_submit is not None:
            self.meter.job(self.name, self.job_id, time.monotonic() - self.t_submit)
            self.t_submit = None

    def cancel(self) -> None:
        self.lab.cancel(self.job_id)
        assert self.wait_end() == "CANCELLED"

    def log(self, rank: int = 0) -> str:
        path = self.run_dir / f"server-{rank}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def cli(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "envlayers", *args], cwd=self.dir, env=self.env,
                              capture_output=True, text=True, timeout=timeout_s)

    def block(self, text: str) -> tuple[list[str], str]:
        """The endpoint block's base URLs, with node names as their addresses (the host cannot resolve lab
        names), and its served name."""
        bases = re.findall(r"^base URL: (\S+)$", text, re.M)
        bases = [re.sub(r"http://(n\d+):", lambda m: f"http://{self.lab.nodes[m.group(1)]}:", b) for b in bases]
        served = re.search(r"^served name: (\S+)", text, re.M).group(1)
        return bases, served

    # -- this job's own processes, never another's ---------------------------------------------------
    def own(self, pid: int) -> bool:
        """Whether ``pid`` is a process of this Slurm job: its environment, or its nearest ancestor's, says so.
        (vLLM's EngineCore renames itself with setproctitle, which overwrites the process's own copy of
        its environment: /proc/PID/environ then holds its title, so its parent, the rank's ``vllm serve``,
        tells.)"""
        for _ in range(4):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                return False
            if any(e.startswith(b"SLURM_JOB_ID=") for e in environ):
                return f"SLURM_JOB_ID={self.job_id}".encode() in environ
            pid = int(re.search(r"^PPid:\s+(\d+)", status, re.M).group(1))
            if pid <= 1:
                return False
        return False

    def engine_core_pid(self, rank: int = 0) -> int:
        """The rank's EngineCore, as its log names it, checked in /proc to be an engine core of this job."""
        pids = [int(p) for p in CORE_RE.findall(self.log(rank))]
        assert pids, f"server-{rank}.log names no EngineCore pid:\n{self.log(rank)[-3000:]}"
        pid = pids[-1]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert cmdline.startswith(b"VLLM::EngineCore"), (pid, cmdline)
        assert self.own(pid), f"pid {pid} is not a process of job {self.job_id}"
        return pid

    def rank_pid(self, rank: int, needle: bytes) -> int:
        """The rank's own ``vllm serve`` process (the one ranks.sh started), found among this job's
        processes by its command line."""
        return self.serve_pid(f"SLURM_PROCID={rank}", needle, f"rank {rank}")

    def serve_pid(self, environ_entry: str, needle: bytes = b"", what: str = "") -> int:
        """The one ``vllm serve`` of this job whose environment holds ``environ_entry`` (``SLURM_PROCID=1``,
        a replica's ``ENVLAYERS_RANK=1``) and whose command line holds ``needle``."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
                environ = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if (b"/vllm\0serve\0" in cmdline and needle in cmdline
                    and f"SLURM_JOB_ID={self.job_id}".encode() in environ and environ_entry.encode() in environ):
                found.append(int(proc.name))
        assert len(found) == 1, f"{what or environ_entry}'s vllm serve of job {self.job_id}: {found}"
        return found[0]

    def kill_leftover(self, pid: int) -> None:
        """A process this test stopped, if the job's end did not take it (checked to be this job's first)."""
        if self.own(pid):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    return


def chat_text(message) -> str:
    """What a reply carried: the content, or the reasoning the qwen3 parser split off (a random model rarely
    closes its think block, so the real parser puts everything there)."""
    extra = getattr(message, "model_extra", None) or {}
    return (message.content or "") + (getattr(message, "reasoning", None) or extra.get("reasoning") or "") + \
        (extra.get("reasoning_content") or "")


def answers_openai(base_url: str, served: str, api_key: str = "EMPTY") -> None:
    """The official client at the printed base URL: the model list, a chat, and a streamed chat."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    assert [m.id for m in client.models.list()] == [served]
    reply = client.chat.completions.create(model=served, max_tokens=16,
                                           messages=[{"role": "user", "content": "Say hi."}])
    assert reply.model == served and reply.usage.completion_tokens >= 1
    assert reply.choices[0].finish_reason in ("stop", "length") and chat_text(reply.choices[0].message)
    pieces, finish = [], None
    with client.chat.completions.create(model=served, max_tokens=16, stream=True,
                                        messages=[{"role": "user", "content": "Say hi."}]) as stream:
        for chunk in stream:
            for choice in chunk.choices:
                pieces.append(chat_text(choice.delta))
                finish = choice.finish_reason or finish
    assert "".join(pieces) and finish in ("stop", "length"), (pieces, finish)
