"""Sites: what a site file must say and may not say, and whether a stack agrees with its site's GPUs.

A site is one layer (``experiments/sites/<SITE>.env``, :func:`envlayers.layers.stack_sources` places it
right above common.env) holding what a cluster decides: its partition, its GPUs, its container runtime
and fabric. A model layer says what the model needs and nothing about the hardware, so the catalog moves
between sites unchanged. Pure: the rules read merged stacks and parsed assignments, never files.
"""

from __future__ import annotations

from typing import Iterable

from .envfile import Assignment

# What every site file states: without one of these a stack would take another site's value silently.
REQUIRED = ("SLURM_PARTITION", "GPUS_PER_NODE", "GPU_MEM_GB", "GPU_VENDOR", "CONTAINER_RUNTIME")
# What a model decides: a site file setting one would change every model of the catalog on that site.
MODEL_KEYS = ("INFERENCE_ENGINE", "INFERENCE_MODEL", "CONTAINER_ROLE", "VLLM_SERVED_MODEL", "REASONING_PARSER",
              "TOOL_CALL_PARSER", "NUMBER_OF_INSTANCES", "PIPELINE_PARALLEL_SIZE", "INFERENCE_NODES")

# A setting only one vendor's GPUs understand: (vendor it belongs to, why), by name prefix or exact value.
_VENDOR_PREFIXES = {
    "amd": ("HIP_", "HSA_", "ROCM_", "ROCR_", "MIOPEN_", "RCCL_", "AMD_", "GPU_MAX_HW_QUEUES"),
    "nvidia": ("CUDA_", "NVIDIA_", "NCCL_CUMEM", "CUBLAS_"),
}
_VENDOR_VALUES = {  # key -> {value word: vendor}
    "SGLANG_ATTENTION_BACKEND": {"aiter": "amd", "triton_rocm": "amd", "fa3": "nvidia", "flashinfer": "nvidia",
                                 "trtllm_mha": "nvidia", "trtllm_mla": "nvidia", "cutlass_mla": "nvidia",
                                 "flashmla": "nvidia"},
    "CONTAINER_GPU_DEVICES": {"/dev/kfd": "amd", "/dev/dri": "amd", "nvidia.com/gpu=all": "nvidia"},
}
_VENDOR_WORDS = {"amd": "AMD", "nvidia": "NVIDIA"}


def name_of(label: str) -> str:
    """A site layer's name as the job and its reports show it: ``mi300a`` for experiments/sites/mi300a.env,
    the path as given for a file named by SITE."""
    from .catalog import SITE_SUFFIX, SITES_DIR

    folder, _, file = label.rpartition("/")
    if folder == SITES_DIR and file.endswith(SITE_SUFFIX):
        return file[:-len(SITE_SUFFIX)]
    return label


def site_file_problems(assignments: Iterable[Assignment]) -> list[str]:
    """``file:line: why`` for each rule a site file breaks: a key every site states is missing, or a key
    that is a model's decision is set."""
    items = list(assignments)
    seen = {a.key for a in items}
    out = [f"{a.origin}: {a.key} is a model's decision, not a site's: every model on this site would get it; "
           "move it to a model layer" for a in items if a.key in MODEL_KEYS]
    missing = [k for k in REQUIRED if k not in seen]
    if missing:
        first = items[0].origin.path if items else "the site file"
        out.append(f"{first}: a site states {', '.join(missing)}; without "
                   f"{'them' if len(missing) > 1 else 'it'} the stack would take common.env's or the engine's "
                   "default, another cluster's value (docs/sites.md)")
    return out


def vendor_of(key: str, value: str) -> str | None:
    """The vendor whose GPUs alone understand ``key=value``, or None for a neutral setting."""
    for vendor, prefixes in _VENDOR_PREFIXES.items():
        if key.startswith(prefixes):
            return vendor
    words = _VENDOR_VALUES.get(key)
    if words:
        for word in value.replace(",", " ").split():
            if word in words:
                return words[word]
    return None


def foreign_settings(env, vendor: str | None, site_label: str | None) -> list[str]:
    """``file:line: ...`` for each setting of the merged stack ``env`` (layers.Env) that only the other
    vendor's GPUs understand, when the site says ``vendor``; settings from the site file itself are the
    site's own business. Empty when the vendor is unknown."""
    if vendor not in _VENDOR_WORDS:
        return []
    out = []
    for key, b in env.bindings.items():
        if site_label is not None and b.origin.path == site_label:
            continue
        value = "".join(p if isinstance(p, str) else "" for p in b.value)
        theirs = vendor_of(key, value)
        if theirs is not None and theirs != vendor:
            out.append(f"{b.origin}: {key}={value} is for {_VENDOR_WORDS[theirs]} GPUs, and this site's are "
                       f"{_VENDOR_WORDS[vendor]} (GPU_VENDOR={vendor}); set it in a layer for that vendor or "
                       "hardware, not in one every site shares")
    return out
