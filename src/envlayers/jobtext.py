"""The text of the serve-only job script, safe by construction, in plain Python (no template engine).

:func:`job_script` fills the pieces below. A piece is text with ``{{ name|filter }}`` places, and every
place names its filter, which makes the value fit for its spot in the script:

- ``sh``: one shell word, single-quoted (a NUL byte is refused);
- ``comment``: the rest of a ``#`` line (a control character, which would end the comment, is refused);
- ``num``: an ``int`` and nothing else;
- ``code``: only a :class:`Code`, shell text envlayers built from checked names;
- ``heredoc(delimiter)``: the body of a quoted here-document (a line equal to its delimiter is refused).

A place without a filter, with an unknown filter, naming a value that is not given, or written in any other
form stops the render with :class:`ScriptTextError`; nothing a user typed can run as code in the job. The
pieces are filled in one pass, so a value that holds ``{{ ... }}`` is text like any other. Which pieces
appear (the partition line, the source lines, the unbound-reference checks, the podman exports) is decided
by :func:`job_script`; the text itself is all here.
"""

from __future__ import annotations

import re
import shlex

from .errors import EnvLayersError

CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_PLACE_RE = re.compile(r"\{\{(.*?)\}\}")
_FORM_RE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\|\s*([a-z]+)\s*(?:\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\))?)?\s*\Z")


class ScriptTextError(EnvLayersError):
    """A value that cannot be placed in the job script as it stands."""


class Code(str):
    """Shell text built by envlayers from checked names; the ``code`` filter passes only this type."""


def shown(text: str, limit: int = 80) -> str:
    """``text`` quoted for a one-line message: control characters escaped, bounded in length."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


# -- the filters --------------------------------------------------------------------------------------

def sh(value) -> str:
    text = str(value)
    if "\0" in text:
        raise ScriptTextError(f"a NUL byte cannot be written into the job script: {shown(text)}")
    return shlex.quote(text)


def comment(value) -> str:
    text = str(value)
    if CONTROL_RE.search(text):
        raise ScriptTextError(f"{shown(text)} holds a control character (a newline, ...) and would "
                              "break out of its comment line in the job script", hint="rename it")
    return text


def num(value) -> str:
    if type(value) is not int:
        raise ScriptTextError(f"expected a whole number for the job script, got {shown(repr(value))}")
    return str(value)


def code(value) -> str:
    if not isinstance(value, Code):
        raise ScriptTextError("only shell text built by envlayers itself may go into the job script unquoted")
    return str.__str__(value)


def heredoc(value, delimiter) -> str:
    text = str(value)
    if str(delimiter) in text.split("\n") or "\0" in text:
        raise ScriptTextError(f"the text holds its own end marker {delimiter} or a NUL byte")
    return text


FILTERS = {"sh": sh, "q": sh, "comment": comment, "num": num, "code": code, "heredoc": heredoc}


def fill(piece: str, values: dict) -> str:
    """``piece`` with each ``{{ name|filter }}`` (or ``{{ name|filter(other) }}``) replaced by the filtered
    value; anything else between ``{{ }}`` is an error."""

    def place(m: re.Match) -> str:
        form = _FORM_RE.match(m.group(1))
        if form is None:
            raise ScriptTextError(f"the job script template holds {shown(m.group(0))}, which is not "
                                  "{{ name|filter }}")
        name, how, arg = form.groups()
        if how is None:
            raise ScriptTextError(f"a job script template emits {name} without a filter "
                                  "(sh, comment, num, code, heredoc)")
        if how not in FILTERS:
            raise ScriptTextError(f"the job script template names an unknown filter {shown(how)}")
        for key in (name, arg):
            if key is not None and key not in values:
                raise ScriptTextError(f"the job script template uses {key}, which was not given")
        if (arg is None) != (how != "heredoc"):
            raise ScriptTextError(f"the filter {how} takes {'one value' if how == 'heredoc' else 'no value'}")
        return FILTERS[how](values[name]) if arg is None else FILTERS[how](values[name], values[arg])

    return _PLACE_RE.sub(place, piece)


# -- the pieces ---------------------------------------------------------------------------------------

HEAD = """\
#!/bin/bash
#SBATCH --job-name={{ job_name|comment }}
#SBATCH --output={{ job_name|comment }}-%j.out
#SBATCH --nodes={{ nodes|num }}
"""

PARTITION = "#SBATCH --partition={{ partition|comment }}\n"

SBATCH_REST = """\
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={{ gpus_per_node|num }}
#SBATCH --mem=0
#SBATCH --exclusive
#
# envlayers serve-only job for {{ target|comment }} ({{ shape|comment }}, {{ nodes|num }} node(s)).
# Rendered by `env_layers serve`; `SUBMIT=0 cluster/serve-only.sbatch` prints this exact script.
# No -A: Slurm reads SBATCH_ACCOUNT; naming an account here would split identical jobs across accounts.
# --mem=0: otherwise the step's memory cgroup follows its CPU share and the server dies in weight load.
set -euo pipefail
# A machine-global core_pattern drops multi-GB core files into the working directory.
ulimit -c 0
echo "ENVLAYERS-STAGE: job ${SLURM_JOB_ID} started on $(hostname) with nodes ${SLURM_JOB_NODELIST}"

# The merged launch environment, lowest precedence first:
"""

SOURCE = "#   {{ source|comment }}\n"

ENV = """\
IFS= read -r -d '' ENVLAYERS_SERVE_ENV <<'{{ delimiter|code }}' || true
{{ env_text|heredoc(delimiter) }}{{ delimiter|code }}
"""

UNBOUND_HEAD = """
# References the layers leave for the job: each must be set here, or `set -u` would end the job
# without saying which layer line needs it.
envlayers_missing=0
envlayers_unset_ref() { echo "ENVLAYERS-ERROR: $1"; envlayers_missing=1; }
"""

UNBOUND_CHECK = "{{ check|code }}\n"

UNBOUND_TAIL = '[ "$envlayers_missing" = 0 ] || exit 1\n'

EXPORTS = """
set -a
eval "$ENVLAYERS_SERVE_ENV"
set +a

# The launch keys are exactly these; anything else the submitting shell exported is not one.
export ENVLAYERS_KEYS={{ keys|sh }}
export ENVLAYERS_TARGET={{ target|sh }}
export ENVLAYERS_EDF={{ edf|sh }}
export ENVLAYERS_READY_TIMEOUT_S={{ ready_timeout_s|num }}
"""

PODMAN = """\
# CONTAINER_RUNTIME=podman: the pinned image and the GPU devices, decided on the login node
export ENVLAYERS_IMAGE={{ image|sh }}
export ENVLAYERS_GPU_DEVICES={{ devices|sh }}
"""

RUN = """\
RUN_DIR="${RUN_ROOT:?RUN_ROOT is not set: experiments/serve-only.env sets it}/${SLURM_JOB_ID}"
# A run folder the job cannot write (a full or read-only file system) ends the job here, before any rank
# starts, in one line: the folder, what the OS said, what to do. A file is written whole or not at all.
envlayers_unwritable() {
  local said="${2%$'\\n'}"
  said="${said##*$'\\n'}"
  echo "ENVLAYERS-ERROR: cannot write the run directory $RUN_DIR: ${said##*: } ($1); the job ends before any rank starts: free space there, or point SCRATCH (or RUN_ROOT) at a writable file system"
  exit 1
}
envlayers_try() { local err; err=$("${@:2}" 2>&1) || envlayers_unwritable "$1" "$err"; }
envlayers_write() {
  local err
  if ! err=$("${@:3}" 2>&1 > "$RUN_DIR/$1.tmp") || ! err=$(mv -f -- "$RUN_DIR/$1.tmp" "$RUN_DIR/$1" 2>&1); then
    rm -f -- "$RUN_DIR/$1.tmp"
    envlayers_unwritable "$2" "$err"
  fi
}
envlayers_try "creating it" mkdir -p -- "$RUN_DIR"
# A job Slurm requeued (a node failed) reuses this folder: move the earlier run's files into run-<n>/
# (n: the first free number from 0) so this run starts clean (docs/operating.md).
shopt -s nullglob dotglob
ENVLAYERS_PREV=()
for ENVLAYERS_F in "$RUN_DIR"/*; do
  [[ -d "$ENVLAYERS_F" && ! -L "$ENVLAYERS_F" && "${ENVLAYERS_F##*/}" =~ ^run-[0-9]+$ ]] || ENVLAYERS_PREV+=("$ENVLAYERS_F")
done
shopt -u nullglob dotglob
if [ -n "${ENVLAYERS_PREV[*]-}" ]; then
  ENVLAYERS_N=0
  while [ -e "$RUN_DIR/run-$ENVLAYERS_N" ]; do ENVLAYERS_N=$((ENVLAYERS_N + 1)); done
  envlayers_try "moving the previous run's files" mkdir -- "$RUN_DIR/run-$ENVLAYERS_N"
  envlayers_try "moving the previous run's files" mv -- "${ENVLAYERS_PREV[@]}" "$RUN_DIR/run-$ENVLAYERS_N/"
  echo "ENVLAYERS-STAGE: restart ${SLURM_RESTART_COUNT:-0} of job ${SLURM_JOB_ID} (requeued by Slurm); the previous run's files are in $RUN_DIR/run-$ENVLAYERS_N"
fi
unset ENVLAYERS_PREV ENVLAYERS_F ENVLAYERS_N
envlayers_write serve.env "writing serve.env" printf '%s' "$ENVLAYERS_SERVE_ENV"
envlayers_write job.sh "writing job.sh" cat "$0"
echo "ENVLAYERS-STAGE: run_dir=$RUN_DIR"

# Starts one rank per node (srun), waits for readiness, prints the endpoint, and ends the
# job as soon as any rank exits or a budget runs out: an allocation never idles on a dead server.
exec {{ python|sh }} -m envlayers launch --run-dir "$RUN_DIR"
"""

PIECES = (HEAD, PARTITION, SBATCH_REST, SOURCE, ENV, UNBOUND_HEAD, UNBOUND_CHECK, UNBOUND_TAIL, EXPORTS, PODMAN, RUN)


def job_script(*, job_name: str, target: str, nodes: int, partition: str, gpus_per_node: int, shape: str,
               sources, delimiter: Code, env_text: str, edf: str, unbound: list, ready_timeout_s: int,
               python: str, keys: str, image: str, devices: str) -> str:
    """The job script: the sbatch header, the merged environment as a here-document, the checks of the
    references the layers leave for the job, the launch keys, the run folder, and the launcher."""
    values = dict(job_name=job_name, target=target, nodes=nodes, partition=partition, gpus_per_node=gpus_per_node,
                  shape=shape, delimiter=delimiter, env_text=env_text, edf=edf, ready_timeout_s=ready_timeout_s,
                  python=python, keys=keys, image=image, devices=devices)
    out = [fill(HEAD, values)]
    if partition:
        out.append(fill(PARTITION, values))
    out.append(fill(SBATCH_REST, values))
    out += [fill(SOURCE, {"source": s}) for s in sources]
    out.append(fill(ENV, values))
    if unbound:
        out.append(fill(UNBOUND_HEAD, values))
        out += [fill(UNBOUND_CHECK, {"check": check}) for check in unbound]
        out.append(fill(UNBOUND_TAIL, values))
    out.append(fill(EXPORTS, values))
    if image:
        out.append(fill(PODMAN, values))
    out.append(fill(RUN, values))
    return "".join(out)
