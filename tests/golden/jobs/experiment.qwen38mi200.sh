#!/bin/bash
#SBATCH --job-name=serve-only
#SBATCH --output=serve-only-%j.out
#SBATCH --nodes=1
#SBATCH --partition=mi200
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --mem=0
#SBATCH --exclusive
#
# envlayers serve-only job for experiment:qwen38mi200 on site mi300a (single, 1 node(s)).
# Rendered by `env_layers serve`; `SUBMIT=0 cluster/serve-only.sbatch` prints this exact script.
# No -A: Slurm reads SBATCH_ACCOUNT; naming an account here would split identical jobs across accounts.
# --mem=0: otherwise the step's memory cgroup follows its CPU share and the server dies in weight load.
set -euo pipefail
# A machine-global core_pattern drops multi-GB core files into the working directory.
ulimit -c 0
echo "ENVLAYERS-STAGE: job ${SLURM_JOB_ID} started on $(hostname) with nodes ${SLURM_JOB_NODELIST}"

# The merged launch environment, lowest precedence first:
#   experiments/layers/common.env
#   experiments/sites/mi300a.env
#   experiments/layers/model-qwen38.env
#   experiments/layers/hardware-mi200-qwen38.env
#   experiments/serve-only.env
IFS= read -r -d '' ENVLAYERS_SERVE_ENV <<'ENVLAYERS_ENV' || true
export VLLM_SERVED_MODEL='hpcagent-bench-vllm'
export PIPELINE_PARALLEL_SIZE='1'
export SERVER_HOST='0.0.0.0'
export SERVER_PORT='8000'
export RDZV_PORT='29500'
export SLURM_PARTITION='mi200'
export GPUS_PER_NODE='4'
export TENSOR_PARALLEL_SIZE='4'
export GPU_MEM_GB='64'
export GPU_VENDOR='amd'
export GPU_NAME='mi200'
export CONTAINER_RUNTIME='ce'
export NCCL_NET_GDR_LEVEL='LOC'
export INFERENCE_ENGINE='vllm'
export CONTAINER_ROLE='vllm-mi200'
export INFERENCE_MODEL='Qwen/Qwen3.8-27B'
export MEM_FRACTION_STATIC='0.80'
export REASONING_PARSER='qwen3'
export TOOL_CALL_PARSER='hermes'
export SERVER_EXTRA_ARGS='--dtype bfloat16'
export GPU_MEMORY_UTILIZATION='0.90'
export RUN_ROOT="${SCRATCH:-${PWD}/runs}/inference-server"
export SERVER_API_KEY_FILE='generate'
ENVLAYERS_ENV

# References the layers leave for the job: each must be set here, or `set -u` would end the job
# without saying which layer line needs it.
envlayers_missing=0
envlayers_unset_ref() { echo "ENVLAYERS-ERROR: $1"; envlayers_missing=1; }
[ -n "${SCRATCH:-}" ] || [ -n "${PWD+x}" ] || envlayers_unset_ref 'RUN_ROOT (experiments/serve-only.env:6) references $PWD, which is not set in the job; fix: export PWD before submitting (sbatch passes your environment on), assign it in a layer, or write ${PWD-default}'
[ "$envlayers_missing" = 0 ] || exit 1

set -a
eval "$ENVLAYERS_SERVE_ENV"
set +a

# The launch keys are exactly these; anything else the submitting shell exported is not one.
export ENVLAYERS_KEYS='VLLM_SERVED_MODEL PIPELINE_PARALLEL_SIZE SERVER_HOST SERVER_PORT RDZV_PORT SLURM_PARTITION GPUS_PER_NODE TENSOR_PARALLEL_SIZE GPU_MEM_GB GPU_VENDOR GPU_NAME CONTAINER_RUNTIME NCCL_NET_GDR_LEVEL INFERENCE_ENGINE CONTAINER_ROLE INFERENCE_MODEL MEM_FRACTION_STATIC REASONING_PARSER TOOL_CALL_PARSER SERVER_EXTRA_ARGS GPU_MEMORY_UTILIZATION RUN_ROOT SERVER_API_KEY_FILE'
export ENVLAYERS_TARGET=experiment:qwen38mi200
export ENVLAYERS_SITE=mi300a
export ENVLAYERS_EDF=hpcagent-bench-vllm-mi200-latest-intranode
export ENVLAYERS_READY_TIMEOUT_S=7200
RUN_DIR="${RUN_ROOT:?RUN_ROOT is not set: experiments/serve-only.env sets it}/${SLURM_JOB_ID}"
# A run folder the job cannot write (a full or read-only file system) ends the job here, before any rank
# starts, in one line: the folder, what the OS said, what to do. A file is written whole or not at all.
envlayers_unwritable() {
  local said="${2%$'\n'}"
  said="${said##*$'\n'}"
  if [[ "$said" == *"Argument list too long"* ]]; then
    # E2BIG: no program starts, whatever the disk: a variable longer than Linux takes for one (MAX_ARG_STRLEN)
    local name kv big="" LC_ALL=C
    for name in $(compgen -e); do kv="$name=${!name}"; [ -z "${kv:131071:1}" ] || big+=" $name"; done
    echo "ENVLAYERS-ERROR: cannot prepare the run directory $RUN_DIR ($1): Argument list too long: the job's environment has a variable longer than the 131072 bytes Linux takes for one (${big# }), so no program starts; the job ends before any rank starts: keep long values in a file and name the file in the layer"
    exit 1
  fi
  echo "ENVLAYERS-ERROR: cannot write the run directory $RUN_DIR: ${said##*: } ($1); the job ends before any rank starts: free space there, or point SCRATCH (or RUN_ROOT) at a writable file system"
  exit 1
}
envlayers_try() { local err; err=$("${@:2}" 2>&1) || envlayers_unwritable "$1" "$err"; }
envlayers_write() {
  local err
  # noclobber: a name already there is never written through (the folder is the user's alone, checked below)
  if ! err=$(set -C; "${@:3}" 2>&1 > "$RUN_DIR/$1.tmp") || ! err=$(mv -f -- "$RUN_DIR/$1.tmp" "$RUN_DIR/$1" 2>&1); then
    rm -f -- "$RUN_DIR/$1.tmp"
    envlayers_unwritable "$2" "$err"
  fi
}
# The run folder holds the scripts every rank runs and the job's key: on a shared file system another user
# must not have made it, or be able to change it. RUN_ROOT and the run folder must be real folders of this
# user that nobody else can write, and no folder above them writable by others without the sticky bit
# (/tmp's); otherwise the job ends here, before anything is written (docs/operating.md).
envlayers_unsafe() {
  echo "ENVLAYERS-ERROR: unsafe run directory $RUN_DIR: $1 $2; the job ends before anything is written there: $3"
  exit 1
}
envlayers_own() {  # $1: a folder this job writes in
  local owner name mode
  [ ! -L "$1" ] || envlayers_unsafe "$1" "is a symbolic link (to $(readlink -- "$1"))" "point RUN_ROOT at a real folder of yours"
  owner=$(stat -c %u -- "$1") name=$(stat -c %U -- "$1") mode=$(stat -c %a -- "$1")
  [ "$name" != UNKNOWN ] || name=$owner
  [ "$owner" = "$(id -u)" ] || envlayers_unsafe "$1" "belongs to $name, not to $(id -un)" "point RUN_ROOT at a folder of your own, e.g. under \$SCRATCH"
  (( (8#$mode & 8#022) == 0 )) || envlayers_unsafe "$1" "is writable by others (mode $mode)" "chmod go-w $1 if it is yours and holds nothing you did not write, else remove it"
}
envlayers_above() {  # $1: a folder: none above it may be writable by others unless sticky
  local dir=$1 mode
  while dir=$(dirname -- "$dir") && [ -n "$dir" ]; do
    mode=$(stat -L -c %a -- "$dir" 2>/dev/null) || break
    if (( (8#$mode & 8#002) != 0 && (8#$mode & 8#1000) == 0 )); then
      envlayers_unsafe "$dir" "above RUN_ROOT is writable by everyone without the sticky bit (mode $mode): another user could put a folder of theirs in its place" "point RUN_ROOT at a folder of yours whose parents others cannot write"
    fi
    [ "$dir" != / ] || break
  done
}
umask 077  # the job's files are the user's alone (RUN_DIR_GROUP_READ=1 lets the group read them)
envlayers_try "creating it" mkdir -p -- "${RUN_DIR%/*}"
envlayers_own "${RUN_DIR%/*}"
envlayers_above "${RUN_DIR%/*}"
[ ! -L "$RUN_DIR" ] || envlayers_own "$RUN_DIR"  # names the link
[ -d "$RUN_DIR" ] || envlayers_try "creating it" mkdir -- "$RUN_DIR"  # 0700 (0750) by the umask
envlayers_own "$RUN_DIR"
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
envlayers_write serve.env "writing serve.env" printf '# site: %s\n%s' mi300a "$ENVLAYERS_SERVE_ENV"
envlayers_write job.sh "writing job.sh" cat "$0"
echo "ENVLAYERS-STAGE: run_dir=$RUN_DIR"

# Starts one rank per node (srun), waits for readiness, prints the endpoint, and ends the
# job as soon as any rank exits or a budget runs out: an allocation never idles on a dead server.
exec /usr/bin/python3 -m envlayers launch --run-dir "$RUN_DIR"
