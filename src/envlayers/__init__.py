"""envlayers: layered launch settings and a serve-only launcher for LLM endpoints on Slurm."""

__version__ = "0.1.0"
