"""The defaults and fixed names several modules share, each defined once (no imports: cheap to import)."""

DEFAULT_EXPERIMENT = "experiment"  # the catalog experiment a bare model name means
DEFAULT_MODEL = "qwen38"  # `env_layers serve` without --model / MODEL
DEFAULT_TIME = "04:00:00"  # the job's time limit without --time / SERVE_TIME
DEFAULT_READY_TIMEOUT_S = 7200  # readiness budget without AGENT_/VLLM_READY_TIMEOUT_SECONDS
JOB_NAME = "serve-only"  # the Slurm job name: `status` lists jobs by it
BANNER = "===== endpoint is live ====="  # the first line of the endpoint block in the job output
