# Source this file (bash) to put the test-only stand-in engine first on PATH and PYTHONPATH:
#   . tests/standin/activate.sh
# Then `vllm serve ...`, `python -m sglang.launch_server ...` and `python3 -m sglang.launch_server ...`
# run tests/standin/engine.py. Never source it outside tests.
_standin_src="${BASH_SOURCE[0]:-$0}"
ENVLAYERS_STANDIN_DIR="$(cd "$(dirname "$_standin_src")" && pwd -P)"
export ENVLAYERS_STANDIN_DIR
case ":${PATH}:" in
  *":${ENVLAYERS_STANDIN_DIR}/bin:"*) ;;
  *) export PATH="${ENVLAYERS_STANDIN_DIR}/bin${PATH:+:${PATH}}" ;;
esac
case ":${PYTHONPATH:-}:" in
  *":${ENVLAYERS_STANDIN_DIR}/pypath:"*) ;;
  *) export PYTHONPATH="${ENVLAYERS_STANDIN_DIR}/pypath${PYTHONPATH:+:${PYTHONPATH}}" ;;
esac
unset _standin_src
