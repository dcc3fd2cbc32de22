"""Every launch key: its name, type, default, allowed values, what absent and empty mean, a line of doc; and the
typed readers.

A launch key is a key the merged environment assigns and the planner (on the login node) or the launcher
(inside the job) reads. :data:`KEYS` is the one table; docs/keys.md is generated from it
(``python3 -m envlayers.keys --markdown > docs/keys.md``) and a test keeps the page equal to it.

The readers take a mapping key -> text. Inside the job that is a plain mapping (serve.env, the
environment): an error names the key. On the login node it is :func:`located` of the merged Env, which
also knows the ``file:line`` of each assignment: an error names that line too. A key missing from the
mapping is *absent*, a value that is blank after stripping is *empty*; what each means is in the table.
Every bad value raises :class:`~envlayers.errors.KeyValueError` with a hint.

A key with a closed set of words (``CONTAINER_RUNTIME``, ``INFERENCE_ENGINE``, ...) declares them in the table
(:attr:`Key.allowed`); its reader takes them from there (:func:`allowed`) and docs/keys.md shows them.

One rule for every boolean key: ``true``/``1``/``yes``/``on`` and ``false``/``0``/``no``/``off``, in any
case; anything else is an error listing those spellings.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Callable, Mapping

from .defaults import DEFAULT_READY_TIMEOUT_S
from .errors import KeyValueError
from .joblines import WARN

TRUE_WORDS: tuple[str, ...] = ("true", "1", "yes", "on")
FALSE_WORDS: tuple[str, ...] = ("false", "0", "no", "off")


class _Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


ERROR = _Marker("ERROR")  # Key.if_empty: an empty value is an error
AS_ABSENT = _Marker("AS_ABSENT")  # Key.if_empty: an empty value means what absence means
_UNSET = _Marker("_UNSET")


@dataclass(frozen=True)
class Type:
    """How a key's text becomes a value: ``parse`` returns ``None`` for text that is not one."""

    name: str  # the docs' type column
    what: str  # "must be <what>"
    noun: str  # "or another <noun>"
    example: str
    parse: Callable[[str], object]
    checked: bool = True  # read through :func:`value` (a bad value is an error); False: free text


def _whole(low: int, high: int | None = None) -> Callable[[str], int | None]:
    def parse(text: str) -> int | None:
        if not (text.isascii() and text.isdigit()):
            return None
        n = int(text)
        return n if n >= low and (high is None or n <= high) else None
    return parse


def _positive_number(text: str) -> float | None:
    try:
        n = float(text)
    except ValueError:
        return None
    return n if n > 0 and math.isfinite(n) else None


def _bool(text: str) -> bool | None:
    word = text.lower()
    return True if word in TRUE_WORDS else False if word in FALSE_WORDS else None


def _text(text: str) -> str:
    return text


COUNT = Type("int", "a positive integer", "positive integer", "1", _whole(1))
PORT = Type("port", "a TCP port (1-65535)", "port", "8000", _whole(1, 65535))
SECONDS = Type("seconds", "a positive number of seconds", "positive number of seconds", "300", _whole(1))
SECONDS_OR_0 = Type("seconds", "a whole number of seconds", "whole number of seconds", "600", _whole(0))
WHOLE = Type("int", "a whole number", "whole number", "0", _whole(0))
FRACTIONAL_SECONDS = Type("seconds", "a positive number of seconds", "positive number of seconds", "1800",
                          _positive_number)
GIB = Type("GiB", "a positive number of GiB", "positive number of GiB", "128", _positive_number)
BOOL = Type("bool", f"true or false ({'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}, any case)", "boolean",
            "true", _bool)
RAY_PORT = Type("port", "a port from 1024 to 64536 (the Ray ports take 1000 from it)", "port", "28000",
                _whole(1024, 64536))
CPUS = Type("int", "a positive number of CPUs", "positive number of CPUs", "8", _whole(1))
PORT_PAIR = Type("port", "a TCP port from 1 to 65534 (the port above it is taken too)", "port", "30000",
                 _whole(1, 65534))
VENDOR = Type("vendor", "amd or nvidia", "GPU vendor", "nvidia", lambda t: t if t in ("amd", "nvidia") else None)
STR = Type("str", "text", "text", "", _text, checked=False)
WORD = Type("word", "one of its words", "word", "", _text, checked=False)  # checked where it is read
PATH = Type("path", "a path", "path", "", _text, checked=False)
NUMBER = Type("number", "a number", "number", "", _text, checked=False)  # the engine checks it
LIST = Type("list", "a list", "list", "", _text, checked=False)


@dataclass(frozen=True)
class Key:
    """One launch key. ``default``: the value when absent (``None``: nothing, or derived by its reader);
    ``if_empty``: the value when empty, :data:`AS_ABSENT` or :data:`ERROR`; ``absent``/``empty``: what the
    docs say they mean; ``hint``: how to fix a bad value (else one is made from the default); ``allowed``: the
    only words the key takes (empty: not a closed set), read by the key's reader and shown in docs/keys.md."""

    name: str
    type: Type
    default: object = None
    if_empty: object = AS_ABSENT
    section: str = "main"
    doc: str = ""
    absent: str = ""
    empty: str = ""
    hint: str | None = None
    allowed: tuple[str, ...] = ()

    @property
    def what(self) -> str:
        """What a value must be: one of the allowed words, or the type's ``what``."""
        return f"one of {', '.join(self.allowed)}" if self.allowed else self.type.what


KEYS: tuple[Key, ...] = (
    Key('INFERENCE_ENGINE', WORD, section='main', allowed=('sglang', 'vllm'),
        doc='the engine that serves the model',
        absent='error', empty='error'),
    Key('INFERENCE_MODEL', STR, section='main',
        doc='model path or Hugging Face id (`--model-path` / positional for `vllm serve`)',
        absent='error', empty='error'),
    Key('VLLM_SERVED_MODEL', STR, section='main',
        doc='the served model name clients use (`--served-model-name`)',
        absent='error', empty='error'),
    Key('INFERENCE_NODES', COUNT, default=1, if_empty=ERROR, section='main',
        doc='nodes in the allocation; `--nodes` of the job. Absent, the nodes one instance needs: `TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE x NUMBER_OF_INSTANCES` over `GPUS_PER_NODE`, rounded up, so a model layer states its GPUs and the site its nodes (docs/sites.md)',
        absent='derived (1 when one node holds the GPUs)', empty='error'),
    Key('GPUS_PER_NODE', COUNT, default=4, if_empty=ERROR, section='main',
        doc='GPUs per node; `--gpus-per-node` of the job',
        absent='4', empty='error'),
    Key('TENSOR_PARALLEL_SIZE', COUNT, if_empty=ERROR, section='main',
        doc='tensor parallel size (inside a node)',
        absent='derived: `GPUS_PER_NODE` (docs/topology.md)', empty='error'),
    Key('PIPELINE_PARALLEL_SIZE', COUNT, if_empty=ERROR, section='main',
        doc='pipeline parallel size (across nodes); derived over the layers\' value when a higher layer sets `INFERENCE_NODES` for one instance (docs/topology.md, "Parallelism from the allocation")',
        absent='derived: the nodes one instance spans (docs/topology.md)', empty='error'),
    Key('INFERENCE_MODE', WORD, section='main', allowed=('single', 'pipeline', 'replicas'),
        doc='the shape of the ranks (docs/topology.md)',
        absent='derived from nodes and tp x pp', empty='derived'),
    Key('SLURM_PARTITION', STR, section='main',
        doc='`--partition` of the job: letters, digits, `.`, `_`, `-`, several separated by commas (anything else is refused with its `file:line`)',
        absent='no `--partition`', empty='no `--partition`'),
    Key('SERVER_PORT', PORT, default=8000, if_empty=ERROR, section='main',
        doc='port the server binds (rank 0; every replica)',
        absent='8000', empty='error'),
    Key('SERVER_HOST', STR, section='main',
        doc="address the server binds: an IP address, read as the engine's bind reads it (`0`, `0x0`, `0.0` and `000.000.000.000` are `0.0.0.0`; `::0` and `::ffff:0.0.0.0` are every interface too), or a host name (letters, digits, `-`, labels separated by dots); anything else is refused naming the key. Only loopback (`127.0.0.0/8`, `::1`, `localhost`) is private: every other address, every host name and every spelling of every interface serves other nodes, and keyless needs `ALLOW_PUBLIC_UNAUTHENTICATED=1` (end of this page)",
        absent='`0.0.0.0`', empty='error'),
    Key('RDZV_PORT', PORT, default=29500, if_empty=ERROR, section='main',
        doc='multi-node rendezvous port (SGLang `--dist-init-addr` port, vLLM `--master-port`)',
        absent='29500', empty='error'),
    Key('GPU_VENDOR', VENDOR, section='main',
        doc="the site's GPU vendor, `amd` or `nvidia`: which devices a container gets (`--rocm` or `--nv`; /dev/kfd and /dev/dri or NVIDIA's CDI name) and the vendor's defaults (SGLang's `aiter` attention on AMD only); a site file sets it (docs/sites.md)",
        absent="AMD's defaults; the role's GPU for devices", empty='as absent'),
    Key('GPU_NAME', WORD, section='main',
        doc="the site's GPU, as the catalog's container roles name it (`mi300`, `h100`): a catalog model's role is `CONTAINER_ROLE=<engine>-${GPU_NAME}`, the image for those GPUs (containers/edfs/)",
        absent='nothing (a role that reads it is refused)', empty='as absent'),
    Key('CONTAINER_RUNTIME', WORD, default='ce', if_empty=ERROR, section='main',
        allowed=('ce', 'none', 'podman', 'docker', 'apptainer', 'singularity', 'charliecloud', 'pyxis'),
        doc="how a rank's engine starts: `ce` by `srun --environment=<EDF>`, `pyxis` by `srun --container-image=...`, `none` from the host's PATH; the others run the engine in a container per node: `podman`, `docker` (docs/podman.md), `apptainer`/`singularity` (a SIF file), `charliecloud` (`ch-run` of an image directory) (docs/sites.md)",
        absent='`ce`', empty='error',
        hint="ce runs the registered EDF; none runs the engine from the host's PATH; podman or docker runs it in a pinned image (docs/podman.md); apptainer (or singularity) in a SIF file, charliecloud in an image directory, pyxis as the srun step's container (docs/sites.md)"),
    Key('CONTAINER_IMAGE', STR, section='main',
        doc="the image, pinned by tag or digest (`latest` refused), for podman and docker; for apptainer, charliecloud and pyxis also a `.sif`, image directory or `.sqsh` path",
        absent="the `CONTAINER_ROLE`'s image", empty='error'),
    Key('CONTAINER_IMAGE_DIR', PATH, section='main',
        doc="the shared directory of images: the archives podman and docker load a missing image from (`env_layers images save`), apptainer's `<image>.sif`, charliecloud's `<image>` directory, pyxis's `<image>.sqsh` (docs/sites.md)",
        absent='no loading', empty='no loading'),
    Key('CONTAINER_GPU_DEVICES', LIST, section='main',
        doc='podman and docker: `--device` values, comma-separated, or `none`; apptainer: only `none` (no `--nv`/`--rocm`)',
        absent="by `GPU_VENDOR` (else the role's GPUs): AMD `/dev/kfd,/dev/dri`; NVIDIA `nvidia.com/gpu=all` (podman), `--gpus all` (docker), `--nv` (apptainer)", empty='error'),
    Key('CONTAINER_SHM_SIZE', STR, section='main',
        doc='podman: `--shm-size` instead of `--ipc=host` (sites that forbid the host IPC namespace)',
        absent='`--ipc=host`', empty='`--ipc=host`'),
    Key('CONTAINER_MOUNTS', LIST, section='main',
        doc='podman: more host paths mounted read-only, colon-separated (weights: `HF_HOME` and a path `INFERENCE_MODEL` are mounted already)',
        absent='none', empty='none'),
    Key('ALLOW_PUBLIC_UNAUTHENTICATED', WORD, section='main',
        doc='`1`: serve keyless on every interface knowingly, with `SERVER_API_KEY_FILE=` (empty; see the end of this page)',
        absent='refused', empty='refused'),
    Key('CONTAINER_ROLE', WORD, section='main',
        doc="the image's role in containers/edfs/: `<engine>-<GPU_NAME>` (`sglang-mi300`, `vllm-h100`, ...); the EDF under `ce`, the image under podman and apptainer",
        absent='error when runtime is `ce`', empty='error'),
    Key('MEM_FRACTION_STATIC', NUMBER, section='main',
        doc='SGLang `--mem-fraction-static`',
        absent='flag omitted', empty='flag omitted'),
    Key('GPU_MEMORY_UTILIZATION', NUMBER, section='main',
        doc='vLLM `--gpu-memory-utilization`',
        absent='flag omitted', empty='flag omitted'),
    Key('SGLANG_ATTENTION_BACKEND', WORD, section='main',
        doc='SGLang `--attention-backend`',
        absent='`aiter` unless `GPU_VENDOR=nvidia` (then omitted: SGLang picks)', empty='flag omitted'),
    Key('REASONING_PARSER', WORD, section='main',
        doc="`--reasoning-parser`; for vLLM checked before submission against vLLM's own parser names (below)",
        absent='flag omitted', empty='flag omitted'),
    Key('TOOL_CALL_PARSER', WORD, section='main',
        doc='`--tool-call-parser` (vLLM also gets `--enable-auto-tool-choice`); checked like `REASONING_PARSER`',
        absent='flag omitted', empty='flag omitted'),
    Key('MAX_MODEL_LEN', NUMBER, section='main',
        doc='vLLM `--max-model-len`, SGLang `--context-length`',
        absent='flag omitted', empty='flag omitted'),
    Key('SERVER_EXTRA_ARGS', STR, section='main',
        doc='extra engine arguments, split like a shell would, appended verbatim; a flag the plan or the exposure check decides (host, port, parallel sizes, node rank and count, rendezvous, served name, API key, executor backend, data-parallel settings, in any spelling the engine reads) is refused before submission, naming the key that sets it',
        absent='none', empty='none'),
    Key('SERVER_API_KEY_FILE', PATH, section='main',
        doc='a file holding the API key (`--api-key`); the job reads it at launch, so the key never appears in the job script, the dry run or a log; checked on the login node before submission (see below); `generate`: a per-job key (end of this page), what `experiments/serve-only.env` sets, so every job has a key unless a later layer changes it',
        absent='no key', empty='no key: the way to go keyless (with `ALLOW_PUBLIC_UNAUTHENTICATED=1` on every interface)'),
    Key('SERVER_API_KEY', STR, section='main',
        doc='refused in every layer, by every command that writes a render (`render`, `render -o`, `check`, `check --update`, `serve`): a key there would be written into the render, the job script and its logs',
        absent='', empty=''),
    Key('NCCL_SOCKET_IFNAME', STR, section='main',
        doc="set on the server command; on a pipeline server the launcher derives `=hsn0[,hsn1...]` from the head node's fabric interfaces when this is absent",
        absent='derived (pipeline)', empty='derived (pipeline)'),
    Key('ENVLAYERS_HSN_IFACE', STR, section='main',
        doc='fabric interface prefix, matched as `<prefix><digits>` or exactly (VLAN children like `hsn0.561` excluded); when set and nothing matches, a pipeline job ends before srun with `no routable fabric IPv4 address`',
        absent='`hsn`, and a warning when nothing matches', empty='`hsn`'),
    Key('NCCL_NET_GDR_LEVEL', STR, section='main',
        doc='set on the server command itself (the netstack hook overwrites the step environment)',
        absent='not set', empty='not set'),
    Key('AGENT_READY_TIMEOUT_SECONDS', SECONDS, if_empty=AS_ABSENT, section='main',
        doc='readiness budget in seconds, first choice; a whole number above 0',
        absent='next key', empty='next key'),
    Key('VLLM_READY_TIMEOUT_SECONDS', SECONDS, if_empty=AS_ABSENT, section='main',
        doc='readiness budget, second choice',
        absent='7200', empty='7200'),
    Key('ENVLAYERS_READY_TIMEOUT_S', SECONDS, default=DEFAULT_READY_TIMEOUT_S, if_empty=AS_ABSENT, section='main',
        doc='the readiness budget the job script exports (from the two keys above, checked on the login node); not a layer key',
        absent='7200', empty='7200'),
    Key('RUN_ROOT', PATH, section='main',
        doc='run directories: `$RUN_ROOT/<jobid>/` (set in `experiments/serve-only.env`)',
        absent='error', empty='error'),
    Key('RUN_DIR_GROUP_READ', BOOL, default=False, if_empty=AS_ABSENT, section='main',
        doc="the run directory and the job's files: `false` (absent or empty): the user's alone (folder 0700, files 0600); `true`: the job's group may read them (0750, 0640), for a team that shares logs; never writable by anyone else either way. The job ends before writing anything when RUN_ROOT or the run directory is a symbolic link, belongs to another user or is writable by others, or a folder above RUN_ROOT is writable by everyone without the sticky bit (docs/operating.md)",
        absent='private', empty='private', hint='1 lets the group read the run directory; 0 or absent keeps it yours alone'),
    Key('ENVLAYERS_RANK_START_TIMEOUT', SECONDS, default=300, if_empty=AS_ABSENT, section='main',
        doc='seconds for every rank to reach its launcher; a whole number above 0',
        absent='300', empty='300'),
    Key('STARTUP_STALL_S', SECONDS_OR_0, default=900,  # weight loading from a slow file system can be quiet for minutes
        if_empty=AS_ABSENT, section='main',
        doc="once every rank started and before the endpoint is live: seconds no rank's log may go without growing before the job ends with `startup stalled`, naming each rank's phase and last line (a multi-node rendezvous that never completes); `0` turns the detector off; anything but a whole number is refused before submission, naming the line",
        absent='900', empty='900',
        hint='900, the default, or 0 to turn the stall detector off'),
    Key('CHECK_WEIGHTS', BOOL, default=True, if_empty=AS_ABSENT, section='weights',
        doc='before submission, check that a hub-id `INFERENCE_MODEL` (`org/name`) is already in the Hugging Face cache the job reads, and refuse the submission when it is not; `0`/`false`/`no`/`off` skips the check (weights that reach the nodes another way), `1`/`true`/`yes`/`on` checks, anything else an error naming the key',
        absent='checked', empty='checked',
        hint='0 skips the weights check before submission (weights that come another way); 1 or absent checks them'),
    Key('GPU_MEM_GB', GIB, if_empty=AS_ABSENT, section='weights',
        doc='memory of one GPU in GiB (2^30 bytes; a decimal such as `79.5` is fine): the weights found in the cache must fit `TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE x GPU_MEM_GB` (one instance), else the submission is refused (docs/topology.md, "Do the weights fit?"); the catalog sets `128` (MI300A, sites/mi300a.env) and `64` (one MI250X GCD, the mi200 layer); anything but a number above 0 is an error naming the line',
        absent='no fit check', empty='no fit check',
        hint='the memory of one GPU in GiB, e.g. 128 for an MI300A, 64 for one MI250X GCD; empty skips the fit check'),
    Key('SGLANG_ENABLE_METRICS', BOOL, default=True, if_empty=False, section='metrics',
        doc='SGLang `--enable-metrics`: Prometheus text at `<root>/metrics`. `true`/`1`/`yes`/`on` on, `false`/`0`/`no`/`off` off, anything else an error',
        absent='on', empty='off',
        hint='true (the default) serves Prometheus metrics at <root>/metrics, false turns them off'),
    Key('NUMBER_OF_INSTANCES', COUNT, default=1, if_empty=ERROR, section='shape',
        doc='copies of the model behind one endpoint: more than 1 plans `data-parallel` (each copy fits a node) or `gateway` (each copy spans nodes)',
        absent='1', empty='error'),
    Key('USE_RAY_SERVE', BOOL, default=False, if_empty=False, section='shape',
        doc='`true` forces the Ray Serve gateway (`gateway` shape), also on one node; `false` leaves the choice to the planner; the boolean spellings above, nothing else',
        absent='false', empty='false',
        hint='true forces the Ray Serve gateway; false, the default, leaves the shape to the numbers'),
    Key('DATA_PARALLEL_RPC_PORT', PORT, default=13345, if_empty=ERROR, section='shape',
        doc="the port node 0 coordinates vLLM's data-parallel ranks on (`--data-parallel-rpc-port`); change it only if the port is taken",
        absent='13345', empty='error'),
    Key('DISTRIBUTED_BACKEND', WORD, section='shape', allowed=('native', 'ray'),
        doc="how the ranks of one instance across nodes meet: `native` (the engine's own rendezvous: the `pipeline` shape) or `ray` (vLLM's Ray executor: the `ray` shape). Only for one instance across nodes; `ray` elsewhere is refused, and SGLang has no Ray executor",
        absent="the rule: `ray` when tensor parallelism is larger than one node's GPUs, else `native`", empty='the rule'),
    Key('VLLM_ALLREDUCE_USE_SYMM_MEM', STR, section='shape',
        doc='set on every multi-node vLLM command (the server and the Ray workers): vLLM turns symmetric-memory all-reduce on by default and it deadlocks across nodes at engine start',
        absent='`0` on multi-node vLLM', empty="not set (vLLM's default)"),
    Key('RAY_PORT_BASE', RAY_PORT, default=28000, if_empty=None, section='shape',
        doc='`ray` and `gateway`: the first of the 1000 ports every Ray node takes its fixed ports from (agents, node and object manager, metrics, client server, workers: docs/topology.md, "Ports"); jobs sharing a node need different blocks; `SERVER_PORT` or `RDZV_PORT` inside the block is refused',
        absent='28000', empty="Ray's own port defaults (fixed 10001, 52365, 10002-19999, the rest at random)"),
    Key('RAY_NUM_CPUS', CPUS, if_empty=None, section='shape',
        doc='`ray` and `gateway`: `--num-cpus` of every Ray node',
        absent="Ray counts the node's CPUs", empty="Ray counts the node's CPUs"),
    Key('RAY_JOIN_TIMEOUT_S', SECONDS, default=300, if_empty=ERROR, section='shape',
        doc='`ray` and `gateway`: seconds node 0 waits for every node to join the Ray cluster before the job ends with the missing count',
        absent='300', empty='error'),
    Key('IDLE_STOP_AFTER_S', FRACTIONAL_SECONDS, if_empty=AS_ABSENT, section='idle',
        doc='once live, end the job cleanly (exit 0, `IDLE-STOPPED`) after this many seconds without a served request',
        absent='never', empty='never',
        hint='e.g. IDLE_STOP_AFTER_S=1800, or empty to never stop an idle endpoint'),
    Key('IDLE_WARN_AFTER_S', FRACTIONAL_SECONDS, if_empty=AS_ABSENT, section='idle',
        doc=f'once live, print `{WARN.prefix}no request served for <s>s ...` once per idle stretch of this many seconds (with the seconds left when `IDLE_STOP_AFTER_S` is set too)',
        absent='never', empty='never',
        hint='e.g. IDLE_WARN_AFTER_S=1500, or empty to never warn'),
    Key('MIN_REPLICAS', COUNT, default=1, if_empty=AS_ABSENT, section='lasting',
        doc='replicas and gateway shapes: the job ends once fewer than this many replicas are alive (gateway: healthy for longer than `GATEWAY_REPLACE_TIMEOUT_S`); a whole number from 1 to the number of replicas (anything but a whole number above 0 is refused before submission, naming the line; more than the replicas ends the launch before srun)',
        absent='1', empty='1',
        hint='the default 1 keeps serving while any replica is alive'),
    Key('GATEWAY_REPLACE_TIMEOUT_S', SECONDS, if_empty=ERROR, section='lasting',
        doc='gateway shape: seconds the job keeps serving with fewer than `MIN_REPLICAS` healthy replicas while Ray Serve replaces the dead ones; then it ends',
        absent='the readiness budget (`ENVLAYERS_READY_TIMEOUT_S`, clamped to the allocation)', empty='error'),
    Key('ROUTER', WORD, section='lasting', allowed=('smg', 'none'),
        doc='replicas shape: `smg` starts one router on node 0 in front of every replica, and the endpoint is its one URL (docs/topology.md, "One URL in front of the replicas"); `none`: no router; anything else, or a shape other than replicas, is refused before submission naming the line',
        absent='no router: an URL per replica', empty='no router'),
    Key('ROUTER_PORT', PORT_PAIR, default=30000, if_empty=ERROR, section='lasting',
        doc="the router's port on node 0 (the port above it serves its Prometheus metrics, bound where the router is); the first free pair from it up is taken; equal to `SERVER_PORT` or the port below it is refused",
        absent='30000', empty='error', hint='e.g. ROUTER_PORT=30000 (the metrics take the port above it)'),
    Key('ROUTER_POLICY', WORD, default='cache_aware', section='lasting',
        allowed=('cache_aware', 'round_robin', 'power_of_two', 'least_load', 'prefix_hash', 'consistent_hashing', 'random'),
        doc="the router's policy (smg's `--policy`)",
        absent='`cache_aware`', empty='`cache_aware`'),
    Key('MAX_REPLICAS', COUNT, if_empty=AS_ABSENT, section='lasting',
        doc='replicas shape with `ROUTER=smg`: the router\'s pool grows up to this many replicas by submitting one-node replica jobs while requests wait longer than `SCALE_UP_WAIT_S` for `SCALE_UP_WINDOW_S`, and releases an added replica idle for `IDLE_STOP_AFTER_S` (docs/topology.md, "The elastic pool"); fewer than the replicas the job starts with, or without the router, is refused before submission naming the line',
        absent='the pool does not grow', empty='the pool does not grow',
        hint='a whole number at least the replicas the job starts with (INFERENCE_NODES), or empty for no growth'),
    Key('SCALE_UP_WAIT_S', FRACTIONAL_SECONDS, default=10.0, if_empty=AS_ABSENT, section='lasting',
        doc='`MAX_REPLICAS`: the queue wait (seconds a request waits in an engine\'s queue, from the engines\' `/metrics`) above which the pool is under pressure',
        absent='10', empty='10', hint='e.g. SCALE_UP_WAIT_S=10'),
    Key('SCALE_UP_WINDOW_S', FRACTIONAL_SECONDS, default=60.0, if_empty=AS_ABSENT, section='lasting',
        doc='`MAX_REPLICAS`: seconds the queue wait must stay above `SCALE_UP_WAIT_S` before the pool grows by one replica',
        absent='60', empty='60', hint='e.g. SCALE_UP_WINDOW_S=60'),
    Key('HEALTH_FAIL_AFTER_S', SECONDS_OR_0, default=600, if_empty=AS_ABSENT, section='lasting',
        doc='seconds a serving rank may go without a healthy answer (`GET /health` and a one-token completion), once the endpoint is live, before it counts as hung; `0` turns the watch off',
        absent='600', empty='600',
        hint='600, the default, or 0 to turn the health watch off'),
    Key('PROGRESS_STALL_AFTER_S', SECONDS_OR_0, default=300, if_empty=AS_ABSENT, section='lasting',
        doc="seconds a serving rank may go, once live, with work to do (requests running or waiting in its `/metrics`, or the health watch's one-token completion sent) while its generated-token counter does not advance, before it counts as stuck even though `/health` answers; `0` turns the check off. vLLM only: SGLang counts a request's tokens when it ends, so it is judged by `HEALTH_FAIL_AFTER_S` alone",
        absent='300', empty='300',
        hint='300, the default, or 0 to judge a rank by /health and its one-token completion alone'),
    Key('SUCCESSORS', WHOLE, default=0, if_empty=AS_ABSENT, section='lasting',
        doc="a chain past the walltime: once live, the job submits a successor (same job script, same time limit) timed to be live before this job's limit; the chain stops after this many successors",
        absent='0', empty='0',
        hint='SUCCESSORS=2 keeps the endpoint up for three time limits'),
    Key('SUCCESSOR_DRAIN_S', SECONDS_OR_0, default=60, if_empty=AS_ABSENT, section='lasting',
        doc='seconds a job keeps serving after its successor is live, then it ends',
        absent='60', empty='60',
        hint='the seconds the old job serves on after its successor is live; 60, the default'),
)

BY_NAME: dict[str, Key] = {k.name: k for k in KEYS}

# Variables a layer may set besides the launch keys: the job exports every key a layer assigns, and these
# are read by the engine, its libraries or the runtime, not by envlayers. prefix -> who reads it.
PASSED_ON: dict[str, str] = {
    "VLLM_": "vLLM", "SGLANG_": "SGLang", "NCCL_": "NCCL", "RCCL_": "RCCL", "FI_": "libfabric (Slingshot's CXI)",
    "CXI_": "libfabric's CXI provider", "UCX_": "UCX", "GLOO_": "Gloo", "MPICH_": "Cray MPICH", "HF_": "the Hugging Face hub",
    "HUGGINGFACE_": "the Hugging Face hub", "TRANSFORMERS_": "transformers", "TOKENIZERS_": "tokenizers",
    "SAFETENSORS_": "safetensors", "TORCH_": "PyTorch", "TORCHINDUCTOR_": "PyTorch's inductor", "PYTORCH_": "PyTorch",
    "TRITON_": "Triton", "CUDA_": "CUDA", "NVIDIA_": "NVIDIA's container runtime", "HIP_": "HIP", "HSA_": "ROCm's runtime",
    "ROCM_": "ROCm", "ROCR_": "ROCm's runtime", "AMD_": "ROCm", "MIOPEN_": "MIOpen", "GPU_": "ROCm's runtime",
    "OMP_": "OpenMP", "MKL_": "MKL", "ONEDNN_": "oneDNN", "RAY_": "Ray", "XDG_": "the XDG folders",
    "OUTLINES_": "outlines", "FLASHINFER_": "FlashInfer", "DG_": "DeepGEMM", "AITER_": "AITER",
}
PASSED_ON_NAMES = frozenset({"PATH", "TMPDIR", "TZ", "LANG", "LC_ALL", "USER",
                             "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"})


def unknown_key(name: str) -> str | None:
    """For a key a layer assigns that is no launch key and nothing the engine or its libraries read by name
    (:data:`PASSED_ON`): the words of a warning, with the nearest launch key when one is close (a typo, as
    ``TENSOR_PARALLEL_SIZE`` for ``TENSOR_PARALEL_SIZE``). ``None`` for a key the job knowingly passes on."""
    import difflib

    if name in BY_NAME or name in PASSED_ON_NAMES:
        return None
    if name.startswith(tuple(PASSED_ON)):  # passed on by name, unless it is a launch key misspelt
        near = difflib.get_close_matches(name, list(BY_NAME), n=1, cutoff=0.88)
        if not near:
            return None
        return (f"{name} is no launch key, only passed on to the engine as it is, and so close to the launch key "
                f"{near[0]} that it looks like a typo of it: did you mean {near[0]}?")
    near = difflib.get_close_matches(name.upper(), list(BY_NAME), n=1, cutoff=0.75)
    guess = f"did you mean {near[0]}?" if near else "docs/keys.md lists the launch keys"
    return (f"{name} is no launch key and nothing envlayers passes on knowingly: it is exported to the job, where "
            f"nothing envlayers knows of reads it; {guess}")


class Located(dict):
    """key -> text, as a plain mapping, and ``origins``: key -> the ``file:line`` of its assignment."""

    def __init__(self, text: Mapping[str, str], origins: Mapping[str, str]):
        super().__init__(text)
        self.origins = dict(origins)


def located(env) -> Located:
    """The merged Env (``layers.Env``) as a :class:`Located` mapping: its text and each key's ``file:line``."""
    return Located(env.text(), {k: str(b.origin) for k, b in env.bindings.items()})


def where(env: Mapping[str, str], name: str) -> str | None:
    """The ``file:line`` that assigned ``name`` when ``env`` knows it (a :class:`Located`), else None."""
    return getattr(env, "origins", {}).get(name)


def error(env: Mapping[str, str], name: str, message: str, hint: str | None = None) -> KeyValueError:
    """A :class:`KeyValueError` for ``name``: ``message`` says what is wrong, ``hint`` how to fix it."""
    return KeyValueError(name, message, where=where(env, name), hint=hint)


def value(env: Mapping[str, str], name: str, default: object = _UNSET, *, shown: str | None = None):
    """The typed value of launch key ``name`` in ``env`` by the table's rules: absent -> the key's default
    (or ``default``, for a default its reader derives), empty -> what the table says, a value -> parsed.
    ``shown`` is the value the hint of an empty-error suggests when the default is derived. Raises
    :class:`KeyValueError` for an empty value where that is an error and for text that is not of the type."""
    key = BY_NAME[name]
    fallback = key.default if default is _UNSET else default
    raw = env.get(name)
    if raw is None:
        return fallback
    text = raw.strip()
    suggest = shown if shown is not None else (None if fallback is None else _word(fallback))
    if text == "":
        if key.if_empty is AS_ABSENT:
            return fallback
        if key.if_empty is not ERROR:
            return key.if_empty
        raise error(env, name, f"is empty; it must be {key.what}", _hint(key, suggest))
    if not key.type.checked:
        return raw
    parsed = key.type.parse(text)
    if parsed is None:
        raise error(env, name, f"must be {key.type.what}, got {raw!r}", key.hint or _hint(key, suggest))
    return parsed


def allowed(name: str) -> tuple[str, ...]:
    """The words key ``name`` takes (:attr:`Key.allowed`): what its reader accepts."""
    return BY_NAME[name].allowed


def text(env: Mapping[str, str], name: str) -> str | None:
    """A text key whose absence and emptiness mean the same (nothing): its stripped text, or ``None``."""
    raw = env.get(BY_NAME[name].name)
    return raw.strip() or None if raw is not None else None


def _word(v: object) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _hint(key: Key, suggest: str | None) -> str:
    if suggest is not None:
        other = f"one of {', '.join(w for w in key.allowed if w != suggest)}" if key.allowed else f"another {key.type.noun}"
        return f"set {key.name}={suggest} (its value when no layer assigns it), or {other}"
    return f"set {key.name} to {key.type.what}, e.g. {key.name}={key.type.example}"


def check(env: Mapping[str, str]) -> None:
    """Read every typed key ``env`` assigns, so that a bad value is refused where it is first seen (the
    login node, naming the layer line) rather than in the job. A value the job's shell expands (``${...}``)
    cannot be read here and is left to the job."""
    for key in KEYS:
        if key.type.checked and key.name in env and "${" not in env[key.name]:
            value(env, key.name, default=None)


# --------------------------------------------------------------------------- docs/keys.md

DOC_TEMPLATE = "keys-doc.md"  # data/: docs/keys.md's prose, with a `@@keys <section>@@` line per table
GENERATED = ("<!-- Generated from src/envlayers/keys.py and src/envlayers/data/keys-doc.md by\n"
             "     `python3 -m envlayers.keys --markdown > docs/keys.md`. Do not edit by hand. -->")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _type_cell(k: Key) -> str:
    """The docs' type column: the type, or the allowed words of a key that has them (:attr:`Key.allowed`)."""
    return "one of " + ", ".join(f"`{w}`" for w in k.allowed) if k.allowed else k.type.name


def markdown_table(section: str) -> str:
    """The keys of one section as a Markdown table: key, type, what it does, absent, empty."""
    out = ["| key | type | what it does | absent | empty |", "|---|---|---|---|---|"]
    for k in KEYS:
        if k.section == section:
            out.append(f"| `{k.name}` | {_cell(_type_cell(k))} | {_cell(k.doc)} | {_cell(k.absent)} | {_cell(k.empty)} |")
    return "\n".join(out)


def render_markdown(template: str | None = None) -> str:
    """docs/keys.md: the hand-written prose of ``data/keys-doc.md`` with the tables generated from
    :data:`KEYS`, one per ``@@keys <section>@@`` line. Every key of the table is on the page exactly once."""
    if template is None:
        from importlib import resources

        template = resources.files("envlayers").joinpath("data", DOC_TEMPLATE).read_text(encoding="utf-8")
    lines = template.split("\n")
    out, seen = [], set()
    for line in lines:
        if line.startswith("@@keys ") and line.endswith("@@"):
            section = line[len("@@keys "):-2]
            seen.add(section)
            out.append(markdown_table(section))
        else:
            out.append(line)
    missing = sorted({k.section for k in KEYS} - seen)
    if missing:
        raise ValueError(f"{DOC_TEMPLATE} has no @@keys line for section(s) {', '.join(missing)}")
    out.insert(1, "\n" + GENERATED)
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if argv != ["--markdown"]:
        print("usage: python3 -m envlayers.keys --markdown > docs/keys.md", file=sys.stderr)
        return 2
    sys.stdout.write(render_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
