"""The serve-only job: everything decided on the login node, before anything is submitted.

:func:`prepare` reads the catalog, the layer files and the key file and is otherwise pure:
target + options -> a :class:`JobSubmission` holding the sbatch arguments, the exact job script,
the plan and the per-rank commands. The dry run prints a JobSubmission; a submission sends the
same one's script to sbatch.

The job script is built so that no text a user typed runs as code: its text is the jinja2 template
templates/serve-only.sh.j2, rendered by :mod:`envlayers.scripttext`, where every value goes through a
filter (``sh`` quotes a shell word, ``comment`` refuses a control character in a ``#`` line, ``num`` takes
only an int, ``code`` takes only shell text this module built from checked names), and a value placed
without one stops the render.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, NamedTuple

from . import shell
from .defaults import DEFAULT_EXPERIMENT, DEFAULT_READY_TIMEOUT_S, DEFAULT_TIME, JOB_NAME
from .errors import EnvLayersError
from .joblines import RUN_DIR as _RUN_DIR_LINE, RUN_DIR_UNWRITABLE as _UNWRITABLE_LINE, TOPOLOGY
from .scripttext import CONTROL_RE as _CONTROL_RE, Code as _Code, ScriptTextError, dq as _dq, render as _render, shown as _shown
from .layers import Env, Unbound
from .rundir import SCRIPT_NAMES
from .topology import Plan

READY_KEYS = ("AGENT_READY_TIMEOUT_SECONDS", "VLLM_READY_TIMEOUT_SECONDS")
MASTER_REF = "${ENVLAYERS_MASTER_ADDR}"
_TIME_RE = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$|^\d+$")
MAX_SERVE_TIME_S = 365 * 86400  # SERVE_TIME's bound where Slurm cannot be asked for the partition's MaxTime
# Slurm partition names, a comma-separated list of them allowed (sbatch -p a,b)
_PARTITION_RE = re.compile(r"[A-Za-z0-9._-]+(,[A-Za-z0-9._-]+)*\Z")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class JobSubmission:
    """One prepared job: the sbatch arguments, the script, the plan, the rank lines and what to tell the user.

    ``warnings``, ``blockers`` (shown by a dry run, refuse a real submission) and ``reasons`` (why the
    shape, topology.reason_lines, then whether the weights fit: weights.fit).
    """

    target: str
    sbatch_args: list[str]
    script: str
    plan: Plan
    rank_lines: list[str]
    topology: list[str]
    edf: str
    ready_timeout_s: int
    warnings: list[str] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    router_line: str | None = None  # ROUTER=smg: the router's command line (engines/router.py)
    site: str = ""  # the site layer's name (experiments/sites/<site>.env) or file, "" without one
    container: list[str] = field(default_factory=list)  # CONTAINER_RUNTIME=pyxis: the ranks' step's options

    def submit_command(self) -> str:
        return shell.words(self.sbatch_argv())

    def sbatch_argv(self) -> list[str]:
        """The sbatch line that submits :attr:`script` (on stdin)."""
        from .slurm import sbatch_argv

        return sbatch_argv(self.sbatch_args)

    def dry_run_text(self) -> str:
        delim = _delimiter(self.script, "ENVLAYERS_JOB")
        c = comment_text
        out = [
            "# envlayers dry run: nothing was submitted. Run the lines below to submit this exact job.",
            f"# target {c(self.target)}{' on site ' + c(self.site) if self.site else ''}: "
            f"{', '.join(c(t.removeprefix(TOPOLOGY.prefix)) for t in self.topology[:1])}",
            *(f"# {c(line)}" for line in self.reasons),
            *(f"# warning: {c(w)}" for w in self.warnings),
            *(f"# would refuse to submit: {c(b)}" for b in self.blockers),
            f"{self.submit_command()} <<'{delim}'",
            self.script + delim,
            "",
            "# Per-rank server commands, as the job writes them to ranks.sh (${ENVLAYERS_MASTER_ADDR} stands for the",
            "# allocation's first node and ${ENVLAYERS_NODE_ADDR} for the rank's own node, which the job fills in;",
            "# other ${...} expand in the job's shell):",
            *(f"#   rank {i}: {c(line)}" for i, line in enumerate(self.rank_lines)),
            "# The srun step that starts them, one rank per node (the job fills in the ${...}):",
            f"#   {c(srun_dry_line(self.plan.nodes, self.edf, self.container))}",
        ]
        if self.router_line is not None:
            out += ["# The router the launcher starts on node 0, outside the container, once every replica is live",
                    "# (NODE<i> stands for replica i's node address, which the launcher fills in):",
                    f"#   {c(self.router_line)}"]
        return "\n".join(out) + "\n"

    def to_json(self) -> dict:
        return {
            "target": self.target, "site": self.site or None, "sbatch": self.sbatch_argv(), "script": self.script,
            "edf": self.edf, "ready_timeout_s": self.ready_timeout_s, "topology": self.topology, "why": self.reasons,
            "ranks": self.rank_lines, "warnings": self.warnings, "blockers": self.blockers,
            **({"router": self.router_line} if self.router_line is not None else {}),
        }


def job_script(*, job_name: str, target: str, nodes: int, partition: str, gpus_per_node: int, shape: str,
               sources, delimiter: _Code, env_text: str, edf: str, unbound: list, ready_timeout_s: int,
               python: str, keys: str, image: str, devices: str, group_read: bool = False, site: str = "",
               runtime: str = "") -> str:
    """The job script: the sbatch header, the merged environment as a here-document, the checks of the
    references the layers leave for the job, the launch keys, the run folder, and the launcher."""
    return _render("serve-only.sh.j2", job_name=job_name, target=target, nodes=nodes, partition=partition,
                   gpus_per_node=gpus_per_node, shape=shape, sources=list(sources), delimiter=delimiter,
                   env_text=env_text, edf=edf, unbound=unbound, ready_timeout_s=ready_timeout_s, python=python,
                   keys=keys, image=image, devices=devices, group_read=group_read, files=SCRIPT_NAMES, site=site,
                   runtime=runtime, lines=_SCRIPT_LINES)


# the job output's lines the job script prints itself (joblines.py declares them; the shell fills the fields)
_SCRIPT_LINES = {
    "run_dir": _Code(_RUN_DIR_LINE.shell({"path": "$RUN_DIR"}, _dq)),
    "unwritable": _Code(_UNWRITABLE_LINE.shell({"path": "$RUN_DIR", "error": "${said##*: }", "doing": "$1"}, _dq)),
}


def comment_text(text: str) -> str:
    """``text`` for one ``#`` line of a dry run: control characters shown escaped (a newline as ``\\n``),
    so pasting the dry run into a shell never runs what a value hides after a newline."""
    return _CONTROL_RE.sub(lambda m: repr(m.group(0))[1:-1], text)


def _delimiter(text: str, base: str) -> str:
    delim, n = base, 0
    lines = set(text.splitlines())
    while delim in lines:
        n += 1
        delim = f"{base}_{n}"
    return delim


def check_time(value: str) -> str:
    """SERVE_TIME as sbatch's ``--time``: a Slurm time, not 0 (which Slurm reads as no limit at all) and at most
    ``MAX_SERVE_TIME_S`` (a bound that holds where Slurm cannot be asked; the partition's own MaxTime is
    checked before submission, :func:`check_partition_time`)."""
    from .durations import parse_duration

    if not _TIME_RE.match(value.strip()):
        raise EnvLayersError(f"time limit {value!r} is not a Slurm time", where="SERVE_TIME",
                             hint="use HH:MM:SS, D-HH:MM:SS or minutes, e.g. SERVE_TIME=08:00:00")
    limit_s = parse_duration(value.strip())
    if not limit_s:
        raise EnvLayersError(f"time limit {value!r} is 0, which Slurm reads as no limit at all", where="SERVE_TIME",
                             hint="give the time the endpoint should serve, e.g. SERVE_TIME=08:00:00; the job "
                                  "ends at its limit, `env_layers stop JOBID` ends it sooner")
    if limit_s > MAX_SERVE_TIME_S:
        raise EnvLayersError(f"time limit {value!r} is {_days(limit_s)}, more than the {_days(MAX_SERVE_TIME_S)} "
                             "any endpoint job may ask for", where="SERVE_TIME",
                             hint="a bare number is minutes; use HH:MM:SS or D-HH:MM:SS, e.g. SERVE_TIME=2-00:00:00")
    return value.strip()


def _days(seconds: int) -> str:
    return f"{seconds / 86400:,.0f} days" if seconds >= 86400 else f"{seconds // 3600} h"


def check_partition_time(job: JobSubmission, environ: Mapping[str, str], run) -> None:
    """Refuse, before submitting, a time limit longer than the MaxTime Slurm says the job's partition has
    (``scontrol show partition -o``): Slurm would otherwise refuse the job or take it and leave it pending
    for ever (``PartitionTimeLimit``), as the site's EnforcePartLimits says. The partition is ``--partition`` of the job, else the
    submitting shell's SBATCH_PARTITION, else Slurm's default one. With a list of partitions the longest
    MaxTime bounds it (the job may run in that one). Nothing is checked when Slurm cannot be asked or says
    no MaxTime (``UNLIMITED``): sbatch then has the last word. ``run``: the caller's Slurm runner (``slurm.run``
    on the login node): this module asks Slurm nothing itself."""
    from . import slurm
    from .durations import format_duration, parse_duration

    args = dict(a[2:].split("=", 1) for a in job.sbatch_args if a.startswith("--") and "=" in a)
    time_text = args.get("time")
    if time_text is None:
        return
    wanted = args.get("partition") or environ.get("SBATCH_PARTITION") or ""
    try:
        limits = slurm.partition_max_times([p for p in wanted.split(",") if p], run=run)
    except slurm.SlurmError:
        return  # Slurm cannot be asked: sbatch answers for itself
    if not limits or any(limit is None for limit in limits.values()):
        return
    name, longest = max(limits.items(), key=lambda item: item[1])
    limit_s = parse_duration(time_text)
    if limit_s is None or limit_s <= longest:
        return
    allowed = format_duration(longest)
    which = (f"partition {name}'s MaxTime" if len(limits) == 1
             else f"the longest MaxTime of partitions {', '.join(sorted(limits))} ({name})")
    raise EnvLayersError(f"time limit {time_text} is longer than {which}, {allowed}; Slurm would refuse the job "
                         "or keep it pending (PartitionTimeLimit)", where="SERVE_TIME",
                         hint=f"ask for at most SERVE_TIME={allowed}, or choose a partition that allows longer "
                              "(`sinfo -o '%P %l'` lists each one's MaxTime)")


def _short_time_warning(time: str, limit_s: int, budget: int) -> str:
    """A time limit shorter than the readiness budget, in words: Slurm reads ``4:00`` as four minutes."""
    from .durations import spoken

    mm_ss = re.fullmatch(r"\s*(\d+):(\d+)\s*", time)
    reading = (f" (Slurm reads MM:SS as minutes and seconds: {int(mm_ss.group(1))} h is "
               f"{int(mm_ss.group(1)):02d}:{int(mm_ss.group(2)):02d}:00)") if mm_ss else ""
    return (f"time limit SERVE_TIME={time} is {spoken(limit_s)}{reading}, less than the {spoken(budget)} the "
            f"readiness budget gives the server to start ({budget}s); the job clamps the budget to 90% of the time "
            "left and may end before it serves: ask for more, e.g. SERVE_TIME=08:00:00")


def ready_timeout_s(env: Mapping[str, str]) -> int:
    """AGENT_READY_TIMEOUT_SECONDS, else VLLM_READY_TIMEOUT_SECONDS, else the default (empty counts as unset)."""
    from . import keys

    for key in READY_KEYS:
        value = keys.value(env, key)
        if value is not None:
            return value
    return DEFAULT_READY_TIMEOUT_S


def _engine_choices(env, text: Mapping[str, str], commands, blockers: list[str], warnings: list[str],
                    image: str | None = None) -> None:
    """A value the engine would refuse for a flag with fixed choices (a parser name, an executor, an
    attention backend) is a blocker naming its layer line; a SERVER_EXTRA_ARGS flag its parser lacks, a
    warning (each said once for all ranks)."""
    from .engines import engine_name, extra_args
    from .engines.choices import for_image, messages, table
    from .engines.owned import refusals

    engine = engine_name(text)
    data = table(for_image(engine, image))
    where = {k: str(b.origin) for k, b in env.bindings.items()}
    extra = extra_args(text)
    # a flag the plan or the exposure check decides, given again, would override it (engines/owned.py)
    blockers += refusals(extra, engine, data.get("options", ()), where.get("SERVER_EXTRA_ARGS", "?"))
    for cmd in commands:
        if "serve" not in cmd.argv[:2] and "sglang.launch_server" not in cmd.argv[:3]:
            continue  # a Ray worker's `ray start`
        found_blockers, found_warnings = messages(cmd.argv, extra, where, data, image)
        blockers += [b for b in found_blockers if b not in blockers]
        warnings += [w for w in found_warnings if w not in warnings]


BASE_ENV_LABEL = "base-env:"  # the target of a SERVE_BASE_ENV job: base-env:<file name>


def prepare(root: Path, model: str, experiment: str = DEFAULT_EXPERIMENT, *, time: str = DEFAULT_TIME,
            base_env: Path | None = None, env_file: Path | None = None, python: str | None = None,
            environ: Mapping[str, str] | None = None, site: str | None = None) -> JobSubmission:
    from . import engines, keys, topology
    from .layers import LaunchSources, merge, refuse_secrets, stack_sources
    from .shell import render
    from .durations import parse_duration  # not .slurm: a dry run does not need subprocess

    environ = os.environ if environ is None else environ
    target = f"{experiment}:{model}"
    # what the job says it serves: the catalog target, or for SERVE_BASE_ENV the file (not the default target,
    # which it does not serve)
    label = target if base_env is None else f"{BASE_ENV_LABEL}{Path(base_env).name}"
    sources = stack_sources(root, target, launch=LaunchSources(base_env, env_file), site=site)
    env = merge(sources, target)
    refuse_secrets(env)  # SERVER_API_KEY in a layer: before anything reads the stack
    try:
        plan = topology.plan(keys.located(env), topology.stacking(sources, env))
    except EnvLayersError as err:  # name the line of each key the refusal is about
        err.where = _with_origins(err.where, env)
        raise
    env = with_plan_parallelism(env, plan)  # a PP the plan derived is the job's PP too
    env_text = render(env, "sh", with_header=False)
    text = keys.located(env)  # key -> text, and the file:line each key's errors name
    keys.check(text)  # a bad value of a key the job reads is refused here, not after the allocation
    _refuse_role_reference(env)
    _refuse_huge_values(env)
    build_env = dict(text)
    warnings = (shell_overridden_warnings(env, environ) + shell_dropped_warnings(env, environ)
                + unresolved_warnings(env, environ))
    warnings += [f"{b.origin}: {said}" for key, b in env.bindings.items() if (said := keys.unknown_key(key))]
    if text.get("SERVER_API_KEY_FILE"):
        build_env["SERVER_API_KEY"] = "${SERVER_API_KEY}"
        warnings += _key_file_warnings(env, environ)
    try:
        commands = engines.build_commands(plan, build_env, MASTER_REF)
    except EnvLayersError as err:  # an engine key's refusal names its line
        err.where = _with_origins(err.where, env)
        raise
    rank_lines = [engines.shell_line(c) for c in commands]
    if plan.backend == "ray":  # node 0 starts the Ray head first (launch/raynode.py)
        rank_lines[0] = _ray_head_line(plan, build_env, rank_lines[0])
    budget = ready_timeout_s(text)
    blockers: list[str] = []
    role_src = _role_source(root, text)  # the role's validated source, read once for every check below
    wrapped = _wrapped(env, text, plan, environ, blockers, role_src)  # -- podman, apptainer, charliecloud (runtimes/)
    if wrapped is not None:
        rank_lines = _wrapped_lines(wrapped, text, plan, commands)
    container = _pyxis(env, text, plan, commands, environ, blockers, warnings, role_src)  # -- the step's container
    # -- the site (sites.py): a setting for the other vendor's GPUs would fail at the engine's start
    from . import sites
    from .layers import site_source

    site_layer = site_source(sources)
    site_name = sites.name_of(site_layer.label) if site_layer else ""
    blockers += sites.foreign_settings(env, keys.value(text, "GPU_VENDOR"), site_layer.label if site_layer else None)
    edf_name, role_source = _edf(root, text, plan, blockers, environ, role_src)
    # the engine's own choices (engines/choices.py), against the release the image pins
    _engine_choices(env, text, commands, blockers, warnings, _pinned_image(text, role_src))
    blockers += _role_engine(env, text, role_src)
    # the job would refuse it: a link, another user's folder (filetrust.unsafe_folder)
    _run_root(env, environ, blockers)
    # -- the public-bind refusal (exposure.py): keyless on every interface needs an acknowledgement
    from .exposure import KEY as HOST_KEY, loopback_unreachable, public_keyless

    try:
        public = public_keyless(text)
        unreachable = loopback_unreachable(text, [r.node_index for r in plan.readiness_ranks()])
    except EnvLayersError as err:  # a SERVER_HOST that is no address: name the layer line that set it
        if err.where == HOST_KEY and HOST_KEY in env.bindings:
            err.where = f"{env.bindings[HOST_KEY].origin}: {HOST_KEY}"
        raise
    if public:
        emptied = env.bindings.get("SERVER_API_KEY_FILE")  # the line that took the default per-job key away
        if emptied is not None and not text.get("SERVER_API_KEY_FILE"):
            public += f"; the key is emptied at {emptied.origin} (SERVER_API_KEY_FILE=)"
        blockers.append(public)
    if unreachable:
        origin = env.bindings[HOST_KEY].origin if HOST_KEY in env.bindings else None
        blockers.append(f"{origin}: {unreachable}" if origin else unreachable)
    # -- end of the public-bind refusal
    from . import weights  # a hub id must be in the job's HF cache, and fit the GPUs' memory (weights.py)

    # CHECK_WEIGHTS is a check of the submission, not a setting of the job: the shell's counts (SHELL_OPTIONS)
    check_text = text if weights.KEY in text or weights.KEY not in environ else {**text, weights.KEY: environ[weights.KEY]}
    found = weights.locate(root, env, check_text, environ, role_source=role_source)
    fit_lines, fit_warnings, fit_blockers = weights.fit(found, plan, env, text)
    warnings += found.warnings + fit_warnings
    blockers += found.blockers + fit_blockers
    time = check_time(time)
    limit_s = parse_duration(time)
    if limit_s and budget > limit_s:
        warnings.append(_short_time_warning(time, limit_s, budget))
    partition = _partition(text)
    script = job_script(
        job_name=JOB_NAME, target=label, nodes=plan.nodes, partition=partition,
        gpus_per_node=plan.gpus_per_node, shape=plan.shape, sources=env.sources,
        delimiter=_Code(_delimiter(env_text, "ENVLAYERS_ENV")), env_text=env_text, edf=edf_name,
        unbound=[_unbound_check(u) for u in _unbound(env)], ready_timeout_s=budget,
        python=python or sys.executable, keys=" ".join(env.bindings),
        image=wrapped.image if wrapped else container[0].split("=", 1)[1] if container else "",
        devices=wrapped.devices if wrapped else "",
        runtime=wrapped.runtime if wrapped else "pyxis" if container else "",
        group_read=bool(keys.value(text, "RUN_DIR_GROUP_READ")), site=site_name,
    )
    # On the command line, because SBATCH_* variables in the submitting shell beat #SBATCH lines and
    # these are the recipe: a stray SBATCH_MEM_PER_NODE or SBATCH_PARTITION would break it. The
    # account stays out: Slurm reads SBATCH_ACCOUNT.
    sbatch_args = [f"--nodes={plan.nodes}", f"--time={time}"]
    if partition:
        sbatch_args.append(f"--partition={partition}")
    sbatch_args += ["--mem=0", f"--gpus-per-node={plan.gpus_per_node}", "--ntasks-per-node=1", "--exclusive"]
    warnings += sbatch_overridden_warnings(sbatch_args, env, environ)
    router_line = _router_line(env, text, plan)
    if router_line is not None and (python or sys.executable) == sys.executable:
        import importlib.util

        if importlib.util.find_spec("smg") is None:  # the launcher starts it from the job's Python, this one
            warnings.append(f"ROUTER=smg: smg is not installed in {sys.executable}, which runs the launcher; "
                            "the job would end when the router cannot start: pip install 'envlayers[router]'")
    return JobSubmission(label, sbatch_args, script, plan, rank_lines, topology.topology_lines(plan), edf_name,
                         budget, warnings, blockers, topology.reason_lines(plan) + fit_lines, router_line, site_name,
                         container)


def _router_line(env: Env, text: Mapping[str, str], plan: Plan) -> str | None:
    """ROUTER=smg: the router's command line in front of every replica (``NODE<i>`` for replica i's node
    address); a ROUTER the plan cannot have is refused naming the layer line."""
    if "ROUTER" not in text:
        return None  # absent: no router (engines/router.py, router_choice), and nothing of it to import
    from .engines.router import plan_router

    try:
        router = plan_router(text, plan.shape, plan.api_port,
                             [f"http://NODE{r.node_index}:{r.port}" for r in plan.readiness_ranks()],
                             bool(text.get("SERVER_API_KEY_FILE")))
    except EnvLayersError as err:
        if err.where in env.bindings:
            err.where = f"{env.bindings[err.where].origin}: {err.where}"
        raise
    return None if router is None else router.line()


def with_plan_parallelism(env: Env, plan: Plan) -> Env:
    """``env`` with ``PIPELINE_PARALLEL_SIZE`` set to the plan's when the plan derived it over a lower
    layer's value (docs/topology.md): the job plans again from its environment and must find the same."""
    b = env.bindings.get("PIPELINE_PARALLEL_SIZE")
    if b is None or env.text()["PIPELINE_PARALLEL_SIZE"].strip() == str(plan.pp):
        return env
    from .layers import Env

    bindings = dict(env.bindings)
    bindings[b.key] = b._replace(value=(str(plan.pp),), overridden=(*b.overridden, (b.value, b.origin)))
    return Env(env.target, env.sources, bindings)


def _partition(text: Mapping[str, str]) -> str:
    """``SLURM_PARTITION``: absent or empty -> "" (no ``--partition``), else a checked list of names."""
    from . import keys

    value = text.get("SLURM_PARTITION", "")
    if value and not _PARTITION_RE.match(value):
        raise keys.error(text, "SLURM_PARTITION", f"{_shown(value)} is not a partition name",
                         hint="letters, digits, '.', '_' and '-', several separated by commas (no $ or spaces)")
    return value


# -- references the job's shell expands ------------------------------------------------------

# Slurm sets these in the job, so the login node cannot know them
_JOB_ONLY_PREFIXES = ("SLURM_",)


MAX_ENV_STRING = 32 * 4096  # Linux's MAX_ARG_STRLEN: one KEY=value string of a program's environment, NUL included


def _refuse_huge_values(env: Env) -> None:
    """Every key is exported to the job's programs; a KEY=value longer than Linux takes for one environment
    string makes every program the job starts fail with E2BIG ("Argument list too long")."""
    from .layers import StackError
    from .shell import value_text

    for key, b in env.bindings.items():
        size = len(key.encode()) + 1 + len(value_text(b.value).encode()) + 1
        if size > MAX_ENV_STRING:
            raise StackError(f"{key} is {size} bytes as an environment string, more than the {MAX_ENV_STRING} Linux "
                             "allows for one (every program the job starts would fail: Argument list too long)",
                             where=str(b.origin), hint="keep long values in a file and name the file in the layer")


def _run_root(env: Env, environ: Mapping[str, str], blockers: list[str]) -> None:
    """RUN_ROOT as the job will read it, held to the rule the job script applies to it before writing."""
    from .filetrust import unsafe_folder
    from .layers import expand

    b = env.bindings.get("RUN_ROOT")
    value = None if b is None else expand(b.value, environ)
    if not value:
        return  # it reads what only the job's environment has: the job checks it itself
    why = unsafe_folder(Path(value), os.getuid())
    if why is not None:
        blockers.append(f"RUN_ROOT ({b.origin}) is {value}: {why}; the job would end before writing there: point "
                        "RUN_ROOT (or SCRATCH) at a folder of your own that nobody else can write")


def _unbound(env: Env) -> list[Unbound]:
    from .layers import unbound_refs

    return unbound_refs(env)


def _read_in(u: Unbound, environ: Mapping[str, str]) -> bool:
    """Whether bash reads ``u.name`` at all with ``environ``: each enclosing default is taken."""
    return all((environ.get(g) is None) if op == "-" else not environ.get(g) for g, op in u.guards)


def shell_overridden_warnings(env: Env, environ: Mapping[str, str]) -> list[str]:
    """One warning for every launch key the submitting shell sets and a layer overwrites (the layers are
    sourced after it): the layer line that wins and the way that works. The shell's value is not shown
    (it may be a secret); the layer's is in the render already."""
    from .layers import shell_overridden
    from .shell import value_text

    return [f"{b.key} from the submitting shell is ignored: {b.origin} sets {b.key}="
            f"{shell.word(value_text(b.value))}, and the layers are sourced after the command line; to set it "
            f"for a run, put {b.key}=<value> in a SERVE_ENV_FILE layer (sourced last, docs/keys.md)"
            for b in shell_overridden(env, environ)]


# launch keys the submitting shell may set for the login node's own checks: they change what is checked before
# submission, not the job (docs/layers.md, "The submitting shell")
SHELL_OPTIONS = ("CHECK_WEIGHTS",)


def shell_dropped_warnings(env: Env, environ: Mapping[str, str]) -> list[str]:
    """One warning for every launch key the submitting shell sets and no layer does: the job's launch keys
    are exactly the layers' (ENVLAYERS_KEYS), so the shell's value never reaches the launcher. Not the
    shell options the login node reads itself (SHELL_OPTIONS), nor the shell's basics; the value is not
    shown (it may be a secret)."""
    from . import keys
    from .layers import SECRET_KEYS, SHELL_BASICS

    in_job = "SLURM_JOB_ID" in environ
    out = []
    for key in keys.BY_NAME:
        if (key not in environ or key in env.bindings or key in SHELL_OPTIONS or key in SHELL_BASICS
                or key in SECRET_KEYS  # a client's key in the shell: the job makes or reads its own
                or in_job and key.startswith("SLURM_")):
            continue
        out.append(f"{key} from the submitting shell does not reach the job: its launch keys are the layers' and "
                   f"no layer sets {key}; to set it for a run, put {key}=<value> in a SERVE_ENV_FILE layer "
                   "(sourced last, docs/layers.md)")
    return out


# sbatch reads these from its environment; the job's command line sets each, so the shell's is overridden
SBATCH_OVERRIDDEN = {"SBATCH_PARTITION": ("--partition", "SLURM_PARTITION"), "SBATCH_TIMELIMIT": ("--time", "SERVE_TIME"),
                     "SBATCH_MEM_PER_NODE": ("--mem", None), "SBATCH_GPUS_PER_NODE": ("--gpus-per-node", "GPUS_PER_NODE"),
                     "SBATCH_EXCLUSIVE": ("--exclusive", None)}


def sbatch_overridden_warnings(sbatch_args: list[str], env: Env, environ: Mapping[str, str]) -> list[str]:
    """A warning for every SBATCH_* variable of the submitting shell that the job's own command line
    overrides (sbatch takes the command line over its environment), naming the key that sets it instead."""
    out = []
    for var, (flag, key) in SBATCH_OVERRIDDEN.items():
        given = environ.get(var)
        if given is None:
            continue
        ours = next((a for a in sbatch_args if a == flag or a.startswith(flag + "=")), None)
        if ours is None or ours.partition("=")[2] == given.strip():
            continue
        if key == "SERVE_TIME":
            how = "set SERVE_TIME (or --time) instead"
        elif key is not None:
            b = env.bindings.get(key)
            how = f"set {key} in a SERVE_ENV_FILE layer instead" + (f" ({b.origin} sets it now)" if b else "")
        else:
            how = "the job needs it (docs/keys.md)"
        out.append(f"{var} from the submitting shell is overridden by the job's {ours}: {how}")
    return out


def unresolved_warnings(env: Env, environ: Mapping[str, str]) -> list[str]:
    """A warning for every reference the login node cannot resolve: unset here, the job stops on it
    before srun unless Slurm or the job's environment sets it."""
    out = []
    for u in _unbound(env):
        if u.name in environ or u.name.startswith(_JOB_ONLY_PREFIXES) or not _read_in(u, environ):
            continue
        out.append(f"{u.key} ({u.origin}) references ${u.name}, which is not set here; the job stops before "
                   f"srun unless it is set there (export it before submitting, assign it in a layer, or write "
                   f"${{{u.name}-default}})")
    return out


def _unbound_check(u: Unbound) -> _Code:
    """One line of the job script: when bash would read ``u.name`` and it is unset, say so (ENVLAYERS-ERROR)."""
    names = [u.name, *(g for g, _ in u.guards)]
    if not all(_IDENT_RE.match(n) for n in names):  # the parser only makes names; checked all the same
        raise EnvLayersError(f"not a variable name in a reference of {u.key}", where=str(u.origin))
    tests = [f'[ -n "${{{g}+x}}" ]' if op == "-" else f'[ -n "${{{g}:-}}" ]' for g, op in u.guards]
    tests.append(f'[ -n "${{{u.name}+x}}" ]')
    message = (f"{u.key} ({u.origin}) references ${u.name}, which is not set in the job; fix: export "
               f"{u.name} before submitting (sbatch passes your environment on), assign it in a layer, or "
               f"write ${{{u.name}-default}}")
    return _Code(" || ".join(tests) + " || envlayers_unset_ref " + shell.word(message))


def _key_file_warnings(env: Env, environ: Mapping[str, str]) -> list[str]:
    from .apikey import check_key_file, wants_generated
    from .layers import expand

    b = env.bindings["SERVER_API_KEY_FILE"]
    path = expand(b.value, environ)
    if wants_generated(path):  # a per-job key, made in the job: nothing to check here
        return []
    if path is None:
        return [f"SERVER_API_KEY_FILE ({b.origin}) cannot be checked here: it reads a variable this shell "
                "does not set"]
    return check_key_file(path, where=str(b.origin))


# -- a wrapping runtime (podman, apptainer): the image and devices, decided here (runtimes/) ---------

class _Wrapped(NamedTuple):
    runtime: str  # podman, apptainer, singularity
    settings: object  # runtimes.podman.Settings or runtimes.apptainer.Settings
    image: str  # ENVLAYERS_IMAGE: podman's pinned image, apptainer's SIF file, charliecloud's image directory
    devices: str  # ENVLAYERS_GPU_DEVICES: podman's --device values (comma-separated), apptainer's --nv/--rocm
    # (charliecloud: none; ch-run keeps the node's /dev)


def _wrapped(env: Env, text: Mapping[str, str], plan: Plan, environ: Mapping[str, str], blockers: list[str],
             role_src) -> "_Wrapped | None":
    from .runtimes import PROGRAMS, WRAPPED, runtime_name

    runtime = runtime_name(text)
    if runtime not in WRAPPED:
        return None

    def where(key: str) -> str:
        b = env.bindings.get(key)
        return f"{b.origin}: {key}" if b else key

    role_image = role_src.remote_image if role_src is not None else None
    role_gpu = (str((role_src.edf.get("annotations") or {}).get("com.hooks.aws_ofi_nccl.variant") or "")
                if role_src is not None else None)
    _refuse_ray(runtime, plan, where)
    import shutil

    program = PROGRAMS[runtime]
    if shutil.which(program, path=environ.get("PATH")) is None:  # the login node's is the nodes' best guess
        blockers.append(f"{where('CONTAINER_RUNTIME')}: {program} ({runtime}) is not installed on this login node "
                        "(not on PATH); the job would fail at its first rank: install it, or name the runtime the "
                        "nodes have")
    if runtime == "docker":
        from . import keys
        from .runtimes import docker

        s = docker.settings(text, role_image, keys.value(text, "GPU_VENDOR"), where)
        return _Wrapped(runtime, s, s.image, ",".join(s.devices))
    if runtime == "podman":
        from . import keys
        from .runtimes import podman

        vendor = keys.value(text, "GPU_VENDOR")
        gpu = "rocm" if vendor == "amd" else "cuda" if vendor == "nvidia" else role_gpu
        s = podman.settings(text, role_image, gpu, where)
        return _Wrapped(runtime, s, s.image, ",".join(s.devices))
    from dataclasses import replace

    if runtime == "charliecloud":
        from .runtimes import charliecloud

        s = charliecloud.settings(text, role_image, where)
        s = replace(s, image=_shared_image_there(
            "image", s.image, lambda p: charliecloud.convert_command(replace(s, image=p)) if s.source else None,
            where("CONTAINER_IMAGE_DIR" if s.source else "CONTAINER_IMAGE"), environ, blockers))
        lacking = charliecloud.missing(s, text)
        if lacking:
            blockers.append(f"{where('CONTAINER_RUNTIME')}: the image {s.image} has no {', '.join(lacking)}, which "
                            "ch-run binds there and cannot create in a read-only image: create "
                            f"{'them' if len(lacking) > 1 else 'it'} in the image once (a folder with mkdir -p, "
                            f"an /etc file with touch), e.g. mkdir -p {shell.word(s.image + lacking[0])} "
                            "(docs/sites.md)")
        return _Wrapped(runtime, s, s.image, "")
    from .runtimes import apptainer

    s = apptainer.settings(text, runtime, role_image, where)
    s = replace(s, sif=_shared_image_there(
        "SIF", s.sif, lambda p: apptainer.pull_command(replace(s, sif=p)) if s.image else None,
        where("CONTAINER_IMAGE_DIR" if s.image else "CONTAINER_IMAGE"), environ, blockers))
    return _Wrapped(runtime, s, s.sif, s.gpu_flag)


def _refuse_ray(runtime: str, plan: Plan, where) -> None:
    """The Ray shapes under a container runtime: Ray would cross the container boundary (the job refuses it
    too, launch/prepare.py)."""
    if plan.shape in ("ray", "gateway"):
        raise EnvLayersError(f"{runtime} cannot run the {plan.shape} shape (Ray across the container boundary)",
                             where=where("CONTAINER_RUNTIME"), hint="use CONTAINER_RUNTIME=ce or none for it")


def _shared_image_there(kind: str, path: str, make, where: str, environ: Mapping[str, str],
                        blockers: list[str]) -> str:
    """``path`` as the job will read it (its references expanded from this shell), and a blocker when a
    reference is unset here or nothing is there; ``make(expanded)`` is the command that puts it there (None
    when CONTAINER_IMAGE names it)."""
    expanded = _expanded(path, environ)
    if expanded is None:
        blockers.append(f"{where}: the {kind} {path} reads a variable this shell does not set, so it cannot be "
                        "checked here")
        return path
    if not os.path.exists(expanded):
        command = make(expanded)
        how = f"`{command}` makes it" if command else "CONTAINER_IMAGE names it"
        blockers.append(f"{where}: the {kind} {expanded} is not there; every rank would fail at its start: {how} "
                        "(docs/sites.md)")
    return expanded


def _pyxis(env: Env, text: Mapping[str, str], plan: Plan, commands, environ: Mapping[str, str],
           blockers: list[str], warnings: list[str], role_src) -> list[str]:
    """CONTAINER_RUNTIME=pyxis: the ranks' srun step's ``--container-*`` options (``${RUN_DIR}`` for the job to
    fill in), checked here; ``[]`` for another runtime."""
    from .runtimes import runtime_name

    if runtime_name(text) != "pyxis":
        return []
    from dataclasses import replace

    from .runtimes import pyxis

    def where(key: str) -> str:
        b = env.bindings.get(key)
        return f"{b.origin}: {key}" if b else key

    _refuse_ray("pyxis", plan, where)
    s = pyxis.settings(text, role_src.remote_image if role_src is not None else None, where)
    if not pyxis.plugin_enabled():
        blockers.append(f"{where('CONTAINER_RUNTIME')}: this host's Slurm does not load Pyxis (no spank_pyxis line "
                        f"in {' or '.join(pyxis.PLUGSTACK)}); srun would refuse --container-image: run where the "
                        "site's Slurm has Pyxis, or name the runtime it has")
    if s.image.startswith(("/", "$")):
        s = replace(s, image=_shared_image_there(
            "image", s.image, lambda p: pyxis.import_command(replace(s, image=p)) if s.source else None,
            where("CONTAINER_IMAGE_DIR" if s.source else "CONTAINER_IMAGE"), environ, blockers))
    else:
        warnings.append(f"{where('CONTAINER_RUNTIME')}: pyxis imports {s.image} from the registry on every node at "
                        "every job start; set CONTAINER_IMAGE_DIR to a shared folder and import it once with "
                        f"`enroot import -o DIR/{pyxis.sqsh_name(s.image)} docker://{s.image}` (docs/sites.md)")
    return pyxis.step_args(s, text, "${RUN_DIR}", pyxis.passed(text, commands))


def _expanded(value: str, environ: Mapping[str, str]) -> "str | None":
    """``value`` with its ``${NAME}`` references expanded from ``environ``; None when one is not set."""
    missing = []

    def one(m) -> str:
        name = m.group(1) or m.group(2)
        if name not in environ:
            missing.append(name)
            return ""
        return environ[name]

    out = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", one, value)
    return None if missing else out


def _with_origins(where: "str | None", env: Env) -> "str | None":
    """``TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE`` -> each key with the ``file:line`` that set it, as
    every other refusal names its line; a key no layer sets (its default) stays as it is."""
    if not where or ":" in where:
        return where
    names = [n.strip() for n in where.split(",")]
    if not all(n.isidentifier() for n in names):
        return where
    if len(names) == 1:  # one key: as every key refusal names it, "file:line: KEY"
        return f"{env.bindings[where].origin}: {where}" if where in env.bindings else where
    return ", ".join(f"{n} ({env.bindings[n].origin})" if n in env.bindings else n for n in names)


def _refuse_role_reference(env: Env) -> None:
    """A CONTAINER_ROLE that reads a name no layer sets (``sglang-${GPU_NAME}`` on a site file without
    GPU_NAME): the role is the image, and the login node must know it."""
    from .layers import deferred_in

    b = env.bindings.get("CONTAINER_ROLE")
    names = sorted({d.name for d in deferred_in(b.value)}) if b is not None else []
    if names:
        raise EnvLayersError(f"CONTAINER_ROLE reads {', '.join('$' + n for n in names)}, which no layer sets, so the "
                             "image cannot be known before submission", where=str(b.origin),
                             hint=f"the site file names its GPUs: set {names[0]} there (mi300, h100: the roles of "
                                  "containers/edfs/ are <engine>-<GPU_NAME>; docs/sites.md)")


def _role_source(root: Path, text: Mapping[str, str]):
    """CONTAINER_ROLE's validated source (edf.RoleSource), read once for every check of the dry run; None
    without a role or for one containers/edfs/ lacks (the Container Engine refuses that in :func:`_edf`)."""
    role = text.get("CONTAINER_ROLE")
    if not role:
        return None
    from . import edf

    return edf.load_catalog(root).get(role)


def _role_engine(env: Env, text: Mapping[str, str], src) -> list[str]:
    """A refusal when the image the role names runs another engine than INFERENCE_ENGINE (a model switched to
    vLLM that kept its SGLang role): the rank would start `vllm serve` in an image without it."""
    from .engines import engine_name

    if src is None or (text.get("CONTAINER_IMAGE") or "").strip():
        return []
    engine = engine_name(text)
    if src.engine == engine:
        return []
    role = src.role
    where = {k: str(b.origin) for k, b in env.bindings.items()}
    suggested = role.replace(src.engine, engine, 1) if role.startswith(src.engine) else f"{engine}-<GPU_NAME>"
    return [f"INFERENCE_ENGINE={engine} ({where.get('INFERENCE_ENGINE', '?')}), but CONTAINER_ROLE={role} "
            f"({where.get('CONTAINER_ROLE', '?')}) is an image of {src.engine} ({src.file}); the ranks would start "
            f"{engine} where it is not installed: set CONTAINER_ROLE={suggested} with it"]


def _pinned_image(text: Mapping[str, str], role_src) -> str | None:
    """The registry reference of the image the job runs (CONTAINER_IMAGE when it is one, else the role's),
    None when the job names a file or nothing."""
    given = (text.get("CONTAINER_IMAGE") or "").strip()
    if given:
        return None if given.startswith(("/", "$")) else given
    return role_src.remote_image if role_src is not None else None


def _ray_head_line(plan: Plan, env: Mapping[str, str], server: str) -> str:
    """Rank 0 of a Ray plan as the job runs it: the head, then (once every node joined) the server, or
    the Ray Serve gateway whose replicas each run it."""
    from .engines.vllm import ray_head_command

    head = shell.words(ray_head_command(plan, env))
    then = f"{head} (the Ray head, kept running); once all {plan.nodes} node(s) joined: "
    if plan.shape == "gateway":
        then += (f"the Ray Serve gateway on port {plan.api_port} with {plan.replicas} replica(s), each running this "
                 "server on a free 127.0.0.1 port in place of --host/--port: ")
    return then + server


def _wrapped_lines(w: _Wrapped, text: Mapping[str, str], plan: Plan, commands) -> list[str]:
    """The dry run's rank lines: the command's own variables, then the full wrapper (``podman run ...``,
    ``apptainer exec ...``, ``ch-run ... --``) and the engine's command."""
    from . import engines
    from .runtimes import apptainer, charliecloud, docker, podman

    out = []
    for rank, cmd in enumerate(commands):
        if w.runtime == "podman":
            port = next((r.port for r in plan.ranks if r.rank == rank and r.port), plan.api_port)
            words = podman.run_argv(w.settings, "${SLURM_JOB_ID}", rank, port,
                                    podman.passed_names(text, cmd.env, cmd.key_env), text, plan.nodes)
        elif w.runtime == "docker":
            words = docker.run_argv(w.settings, "${SLURM_JOB_ID}", rank, podman.passed_names(text, cmd.env, cmd.key_env),
                                    text)
        elif w.runtime == "charliecloud":
            words = charliecloud.run_argv(w.settings, text)
        else:
            words = apptainer.run_argv(w.settings, text)
        assigned = " ".join(f"{k}={shell.word_with_refs(v)}" for k, v in sorted(cmd.env.items()))
        if cmd.key_env:
            assigned += f" {cmd.key_env}='***'"
        engine_only = engines.shell_line(cmd._replace(env={}, key_env=None))
        wrapper = " ".join(shell.word_with_refs(x) for x in words)
        out.append(" ".join(x for x in (assigned.strip(), wrapper, engine_only) if x))
    return out


def _edf(root: Path, text: dict[str, str], plan: Plan, blockers: list[str],
         environ: Mapping[str, str], src) -> tuple[str, "edf.RoleSource | None"]:
    """The EDF the ranks run with (``""`` without the Container Engine) and its role's validated source,
    read once for the job script and the weights check."""
    from .runtimes import runtime_name

    runtime = runtime_name(text)
    if runtime != "ce":
        return "", None
    from . import edf

    role = text.get("CONTAINER_ROLE")
    if not role:
        raise EnvLayersError("is not set; runtime ce needs the EDF role", where="CONTAINER_ROLE",
                             hint="one of: " + ", ".join(edf.roles(root)))
    if src is None:
        import difflib

        origin = getattr(text, "origins", {}).get("CONTAINER_ROLE")
        near = difflib.get_close_matches(role, edf.roles(root), n=1)
        raise EnvLayersError(f"unknown EDF role {role!r} (valid: {', '.join(edf.roles(root))})",
                             where=f"{origin}: CONTAINER_ROLE" if origin else "CONTAINER_ROLE",
                             hint=(f"did you mean {near[0]}? " if near else "")
                             + "the roles are the files of containers/edfs/")
    if not src.edf:
        origin = getattr(text, "origins", {}).get("CONTAINER_ROLE")
        raise EnvLayersError(f"role {role} has no EDF (no edf: table in {src.file}): the Container Engine cannot "
                             "run it", where=f"{origin}: CONTAINER_ROLE" if origin else "CONTAINER_ROLE",
                             hint="name a runtime for its image (CONTAINER_RUNTIME=apptainer, podman, charliecloud or "
                                  "pyxis), or add an edf: table to the source (docs/containers.md)")
    name = src.edf_name(edf.variant_for(plan.edf_topology))
    installed = edf.edf_search_dir(environ) / f"{name}.toml"
    if not installed.is_file():
        blockers.append(f"EDF {name} is not installed in {installed.parent}; run `env_layers install-edfs` "
                        "(the job would fail at its first srun)")
    else:
        differs = _installed_edf_differs(installed, src, plan.edf_topology, environ)
        if differs:
            blockers.append(f"EDF {name} installed in {installed.parent} is not what the catalog renders ({differs}); "
                            "the job would run the installed one: run `env_layers install-edfs` (its report shows "
                            "the whole diff; --force replaces a file env_layers did not write)")
        for source in _missing_mount_sources(installed, environ):
            real = os.path.realpath(source)
            where_to = "" if real == source else f" (a link to {real}: a bind is made from where the link points)"
            blockers.append(f"EDF {name} binds {source}, which does not exist{where_to}; the Container Engine would "
                            f"stop at the first srun: mkdir -p {shell.word(real)}")
    try:
        image = Path(edf.expand_vars(src.edf["image"], environ))
    except EnvLayersError:
        image = None  # a variable this shell does not set: install-edfs says the same
    if image is not None and not image.is_file():
        blockers.append(f"the image of EDF {name}, {image}, is missing; every rank would fail at its first srun: "
                        f"`{edf.fetch_command(role, root)}` imports it")
    return name, src


def _missing_mount_sources(installed: Path, environ: Mapping[str, str]) -> list[str]:
    """The host side of each ``mounts`` entry of the installed EDF that is not there (a ``${VAR}`` this shell
    does not set is left out: it cannot be checked here)."""
    import tomllib

    try:
        data = tomllib.loads(installed.read_text(encoding="utf-8", errors="replace"))
    except (OSError, tomllib.TOMLDecodeError):
        return []
    out = []
    for mount in data.get("mounts") or []:
        if not isinstance(mount, str):
            continue
        source = _expanded(mount.split(":", 1)[0], environ)
        if source and source.startswith("/") and not os.path.exists(source) and source not in out:
            out.append(source)
    return out


def _installed_edf_differs(installed: Path, src, topology: str, environ: Mapping[str, str]) -> str | None:
    """The first line where the installed EDF and the catalog's render of it part ("installed: X, rendered:
    Y"), or None when they are the same bytes."""
    from . import edf

    try:
        want = edf.render_source(src, topology, environ)
        have = installed.read_bytes().decode("utf-8", errors="replace")
    except (OSError, EnvLayersError):
        return None  # the render or the file cannot be read here: install-edfs says why
    if have == want:
        return None
    for a, b in zip(have.splitlines() + [""], want.splitlines() + [""]):
        if a != b:
            return f"installed: {a.strip()[:120]!r}, rendered: {b.strip()[:120]!r}"
    return "the installed file has more lines"


def srun_dry_line(nodes: int, edf: str | None, container: "list[str] | tuple[str, ...]" = ()) -> str:
    """The srun step that starts the ranks (:func:`envlayers.slurm.ranks_step_argv`) as the dry run prints it:
    the CPU count and the run directory are what the job fills in (``${SLURM_CPUS_ON_NODE}``, ``${RUN_DIR}``)."""
    from .slurm import ranks_step_argv

    argv = ranks_step_argv(nodes, "${SLURM_CPUS_ON_NODE}", edf, "${RUN_DIR}/ranks.sh", container)
    return " ".join(shell.word_with_refs(w) for w in argv)
