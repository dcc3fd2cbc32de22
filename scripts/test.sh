#!/usr/bin/env bash
# Set up and run the whole test suite on a fresh Debian machine.
#
# Installs the package with its test extra, and (as root) the Debian packages the local
# Slurm cluster needs; the Slurm tests start and stop that cluster themselves
# (cluster/slurm-lab). Extra arguments go to pytest, e.g. scripts/test.sh -k layers.
set -euo pipefail
cd "$(dirname "$0")/.."

# bench: matplotlib for `env_layers bench --plot` and its test (wheels only, about 20 s); ray: Ray Serve
# for the ray and gateway shapes' lab tests (about 30 s, ~500 MB); router: smg, the router ROUTER=smg
# starts (a wheel with its Rust binary, about 100 MB)
python3 -m pip install --quiet --disable-pip-version-check -e '.[test,bench,ray,router]'

# The real vLLM (its CPU build, pinned) for the tests marked real_vllm, in its own environment outside the
# checkout (docs/testing.md, "The real engine"); reused once installed.
ENVLAYERS_REAL_VLLM="$(scripts/real-vllm.sh | tail -n 1)"
export ENVLAYERS_REAL_VLLM

if [ "$(id -u)" = 0 ]; then
  # As root the Slurm tests can always run here, so a skipped one is a failure.
  export ENVLAYERS_REQUIRE_SLURM="${ENVLAYERS_REQUIRE_SLURM:-1}"
  # The two-user tests submit as other users, who must reach the lab's slurm.conf and munge socket: a
  # checkout they cannot enter (under /root, say) keeps its lab in a root-owned folder under /var/tmp.
  if [ -z "${ENVLAYERS_LAB_DIR:-}" ] && ! scripts/others-can-enter "$PWD"; then
    ENVLAYERS_LAB_DIR="/var/tmp/envlayers-lab-$(printf %s "$PWD" | sha256sum | cut -c1-12)"
    if [ -e "$ENVLAYERS_LAB_DIR" ] && [ "$(stat -c %u:%a "$ENVLAYERS_LAB_DIR")" != 0:755 ]; then
      echo "scripts/test.sh: $ENVLAYERS_LAB_DIR is not root's with mode 755; remove it or set ENVLAYERS_LAB_DIR" >&2
      exit 2
    fi
    mkdir -p -m 755 "$ENVLAYERS_LAB_DIR"
    export ENVLAYERS_LAB_DIR
    echo "scripts/test.sh: other users cannot enter $PWD; the Slurm lab lives in $ENVLAYERS_LAB_DIR" \
         "(ENVLAYERS_LAB_DIR=$ENVLAYERS_LAB_DIR cluster/slurm-lab down stops it)"
  fi
  # The end-to-end tests run the job's printed curl; cluster/slurm-lab installs Slurm itself.
  if ! command -v curl >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl
  fi
  # The container runtimes' lab tests run the stand-in in real containers: podman (tests/podmantools.py
  # configures it), charliecloud (ch-run, ch-convert) and docker (a daemon per lab node, started by the test).
  if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1 || ! command -v ch-run >/dev/null 2>&1 \
     || ! command -v dockerd >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      podman runc charliecloud docker.io
  fi
fi

exec python3 -m pytest "$@"
