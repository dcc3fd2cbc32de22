"""The serve-only job: everything decided on the login node, before anything is submitted.

:func:`prepare` is pure apart from reading the catalog: target + options -> a :class:`Job`
holding the sbatch arguments, the exact job script, the plan and the per-rank commands.
The dry run prints a Job; a submission sends the same Job's script to sbatch.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .errors import EnvLayersError

DEFAULT_TIME = "04:00:00"
DEFAULT_READY_TIMEOUT_S = 7200
READY_KEYS = ("AGENT_READY_TIMEOUT_SECONDS", "VLLM_READY_TIMEOUT_SECONDS")
SERVE_ENV = Path("experiments") / "serve-only.env"
MASTER_REF = "${ENVLAYERS_MASTER_ADDR}"
_TIME_RE = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$|^\d+$")


@dataclass
class Job:
    target: str
    sbatch_args: list[str]
    script: str
    plan: object
    rank_lines: list[str]
    topology: list[str]
    edf: str
    ready_timeout_s: int
    warnings: list[str] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)  # shown by a dry run, refuse a real submission

    def submit_command(self) -> str:
        return shlex.join(["sbatch", "--parsable", *self.sbatch_args])

    def dry_run_text(self) -> str:
        from .launch.prepare import srun_dry_line

        delim = _delimiter(self.script, "ENVLAYERS_JOB")
        out = [
            "# envlayers dry run: nothing was submitted. Run the lines below to submit this exact job.",
            f"# target {self.target}: {', '.join(t.removeprefix('ENVLAYERS-TOPOLOGY: ') for t in self.topology[:1])}",
            *(f"# warning: {w}" for w in self.warnings),
            *(f"# would refuse to submit: {b}" for b in self.blockers),
            f"{self.submit_command()} <<'{delim}'",
            self.script + delim,
            "",
            "# Per-rank server commands, as the job writes them to ranks.sh (${ENVLAYERS_MASTER_ADDR} stands for the",
            "# allocation's first node, which the job fills in; other ${...} expand in the job's shell):",
            *(f"#   rank {i}: {line}" for i, line in enumerate(self.rank_lines)),
            "# The srun step that starts them, one rank per node (the job fills in the ${...}):",
            f"#   {srun_dry_line(self.plan.nodes, self.edf)}",
        ]
        return "\n".join(out) + "\n"

    def to_json(self) -> dict:
        return {
            "target": self.target, "sbatch": ["sbatch", "--parsable", *self.sbatch_args], "script": self.script,
            "edf": self.edf, "ready_timeout_s": self.ready_timeout_s, "topology": self.topology,
            "ranks": self.rank_lines, "warnings": self.warnings, "blockers": self.blockers,
        }


def _delimiter(text: str, base: str) -> str:
    delim, n = base, 0
    lines = set(text.splitlines())
    while delim in lines:
        n += 1
        delim = f"{base}_{n}"
    return delim


def check_time(value: str) -> str:
    if not _TIME_RE.match(value.strip()):
        raise EnvLayersError(f"time limit '{value}' is not a Slurm time", where="SERVE_TIME",
                             hint="use HH:MM:SS, D-HH:MM:SS or minutes, e.g. SERVE_TIME=08:00:00")
    return value.strip()


def ready_timeout_s(env: dict[str, str]) -> int:
    """AGENT_READY_TIMEOUT_SECONDS, else VLLM_READY_TIMEOUT_SECONDS, else 7200 (empty counts as unset)."""
    for key in READY_KEYS:
        value = env.get(key)
        if value:
            if not value.strip().isdigit() or int(value) <= 0:
                raise EnvLayersError(f"must be a positive number of seconds, got '{value}'", where=key,
                                     hint="e.g. 7200")
            return int(value)
    return DEFAULT_READY_TIMEOUT_S


def secret_checks(env: dict[str, str]) -> None:
    if env.get("SERVER_API_KEY"):
        raise EnvLayersError(
            "an API key in a layer would be written into the job script and its logs",
            where="SERVER_API_KEY",
            hint="put the key in a file readable only by you and set SERVER_API_KEY_FILE=<path> instead",
        )


def prepare(root: Path, model: str, experiment: str = "experiment", *, time: str = DEFAULT_TIME,
            base_env: Path | None = None, env_file: Path | None = None, python: str | None = None,
            environ: dict[str, str] | None = None) -> Job:
    from . import engines, topology
    from .layers import Source, load_env, merge
    from .envfile import parse_file
    from .shell import render

    target = f"{experiment}:{model}"
    extra = [root / SERVE_ENV] + ([env_file] if env_file else [])
    if base_env is not None:
        sources = [Source(str(base_env), tuple(parse_file(base_env, str(base_env))))]
        for p in extra:
            sources.append(Source(_rel(root, p), tuple(parse_file(p, _rel(root, p)))))
        env = merge(sources, target)
    else:
        env = load_env(root, target, tuple(extra))
    text = env.text()
    secret_checks(text)
    plan = topology.plan(text)
    build_env = dict(text)
    if text.get("SERVER_API_KEY_FILE"):
        build_env["SERVER_API_KEY"] = "${SERVER_API_KEY}"
    commands = engines.build_commands(plan, build_env, MASTER_REF)
    rank_lines = [engines.shell_line(c) for c in commands]
    budget = ready_timeout_s(text)
    warnings: list[str] = []
    blockers: list[str] = []
    edf_name = _edf(root, text, plan, blockers, environ)
    from .slurm import parse_duration

    time = check_time(time)
    limit_s = parse_duration(time)
    if limit_s and budget > limit_s:
        warnings.append(f"readiness budget {budget}s exceeds the time limit {time}; the job clamps it to 90% "
                        "of the time left")
    env_text = render(env, "sh", with_header=False)
    script = _template().render(
        target=target, nodes=plan.nodes, partition=text.get("SLURM_PARTITION") or "",
        gpus_per_node=plan.gpus_per_node, shape=plan.shape, sources=env.sources,
        delimiter=_delimiter(env_text, "ENVLAYERS_ENV"), env_text=env_text, edf=edf_name,
        ready_timeout_s=budget, python=python or sys.executable, keys=" ".join(env.bindings),
    )
    # On the command line, because SBATCH_* variables in the submitting shell beat #SBATCH lines and
    # these are the recipe: a stray SBATCH_MEM_PER_NODE or SBATCH_PARTITION would break it. The
    # account stays out: Slurm reads SBATCH_ACCOUNT.
    sbatch_args = [f"--nodes={plan.nodes}", f"--time={time}"]
    if text.get("SLURM_PARTITION"):
        sbatch_args.append(f"--partition={text['SLURM_PARTITION']}")
    sbatch_args += ["--mem=0", f"--gpus-per-node={plan.gpus_per_node}", "--ntasks-per-node=1", "--exclusive"]
    return Job(target, sbatch_args, script, plan, rank_lines, topology.topology_lines(plan), edf_name, budget,
               warnings, blockers)


def _rel(root: Path, path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def _edf(root: Path, text: dict[str, str], plan, blockers: list[str], environ) -> str:
    runtime = text.get("CONTAINER_RUNTIME") or "ce"
    if runtime == "none":
        return ""
    if runtime != "ce":
        raise EnvLayersError(f"unknown container runtime '{runtime}' (valid: ce, none)", where="CONTAINER_RUNTIME",
                             hint="ce runs the registered EDF; none runs the engine from the host's PATH")
    from . import edf

    role = text.get("CONTAINER_ROLE")
    if not role:
        raise EnvLayersError("is not set; runtime ce needs the EDF role", where="CONTAINER_ROLE",
                             hint="one of: " + ", ".join(edf.roles(root)))
    if role not in edf.roles(root):
        raise EnvLayersError(f"unknown EDF role '{role}' (valid: {', '.join(edf.roles(root))})",
                             where="CONTAINER_ROLE", hint="see containers/edfs/")
    name = edf.edf_name(role, plan.shape, root)
    installed = edf.edf_search_dir(environ) / f"{name}.toml"
    if not installed.is_file():
        blockers.append(f"EDF {name} is not installed in {installed.parent}; run `env_layers install-edfs` "
                        "(the job would fail at its first srun)")
    return name


def _template():
    import jinja2

    loader = jinja2.PackageLoader("envlayers", "templates")
    env = jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False)
    env.filters["q"] = lambda v: shlex.quote(str(v))
    return env.get_template("serve-only.sh.j2")
