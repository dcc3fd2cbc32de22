"""EDF sources: validation, derivation per topology, rendering (golden files).

Regenerate the golden files after an intended change to containers/edfs/ or to the renderer:

    ENVLAYERS_REGEN_GOLDEN=1 python -m pytest tests/test_edf.py -k golden

then review `git diff tests/golden/edf/`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import tomli_w

from envlayers import edf, edfinstall
from envlayers.errors import EdfError
from envlayers.runtimes.images import unpinned

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # Python 3.10: the parse and round-trip checks need it
    tomllib = None
needs_tomllib = pytest.mark.skipif(tomllib is None, reason="tomllib is Python 3.11+")

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "edf"
REGEN = os.environ.get("ENVLAYERS_REGEN_GOLDEN") == "1"

ROLES = ("sglang-mi300", "vllm-mi300", "vllm-mi200")  # the roles with an EDF; the h100 ones name images only
IMAGE_ROLES = ("sglang-h100", "vllm-h100")
BASE_NAMES = {role: f"hpcagent-bench-{role}-latest" for role in ROLES}
# one topology per variant is enough to name every EDF the catalog installs
VARIANT_TOPOLOGY = {"fabric": "pipeline", "intranode": "single"}
CE_KEYS = {"base_environment", "image", "workdir", "entrypoint", "writable", "mounts", "env", "annotations"}


def _cases():
    return [
        pytest.param(role, topology, id=f"{role}-{variant}")
        for role in ROLES
        for variant, topology in VARIANT_TOPOLOGY.items()
    ]


def _body(text: str) -> str:
    """The TOML after the two-line header and its blank line."""
    lines = text.split("\n", 3)
    assert lines[0].startswith("# ") and lines[1].startswith("# ") and lines[2] == ""
    return lines[3]


# ---------------------------------------------------------------------------------------------
# the catalog as shipped


def test_catalog_has_every_role():
    assert edf.roles(REPO) == sorted(ROLES + IMAGE_ROLES)


@pytest.mark.parametrize("role", IMAGE_ROLES)
def test_a_role_without_an_edf_table_names_an_image_and_no_edf(role, tmp_path):
    from envlayers.edf.schema import source

    src = source(role, REPO)
    assert src.edf == {} and src.remote_image and unpinned(src.remote_image) is None
    with pytest.raises(EdfError) as err:
        edf.edf_name(role, "single", REPO)
    assert "has no edf: table" in str(err.value) and err.value.where == f"containers/edfs/{role}.yaml"
    written = edfinstall.install(REPO, tmp_path / "edf", environ={})
    assert written and not any(role in r.path.name for r in written)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    "topology, suffix",
    [("single", "-intranode"), ("replicas", "-intranode"), ("pipeline", "")],
)
def test_edf_name_per_topology(role, topology, suffix):
    assert edf.edf_name(role, topology, REPO) == BASE_NAMES[role] + suffix


def test_topologies_constant():
    assert edf.TOPOLOGIES == ("single", "pipeline", "replicas")  # the launch modes, one definition


@pytest.mark.parametrize("role, topology", _cases())
def test_golden(role, topology):
    text = edf.render_edf(role, topology, REPO)
    path = GOLDEN / f"{edf.edf_name(role, topology, REPO)}.toml"
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"missing golden file {path}; regenerate: ENVLAYERS_REGEN_GOLDEN=1 pytest tests/test_edf.py -k golden"
    assert text == path.read_text(encoding="utf-8"), (
        f"{path.name} differs from the render; if intended, regenerate: "
        "ENVLAYERS_REGEN_GOLDEN=1 python -m pytest tests/test_edf.py -k golden"
    )


def test_no_stale_golden_files():
    expected = {
        f"{edf.edf_name(role, topology, REPO)}.toml" for role in ROLES for topology in edf.TOPOLOGIES
    }
    assert {p.name for p in GOLDEN.glob("*.toml")} == expected


@needs_tomllib
@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.toml")), ids=lambda p: p.stem)
def test_golden_parses_and_round_trips(path):
    text = path.read_text(encoding="utf-8")
    data = tomllib.loads(text)
    assert tomli_w.dumps(data) == _body(text)
    assert edf.written_by_envlayers(text) is True


@needs_tomllib
@pytest.mark.parametrize("role, topology", _cases())
def test_render_parses_to_edf_dict(role, topology):
    assert tomllib.loads(edf.render_edf(role, topology, REPO)) == edf.edf_dict(role, topology, REPO)


@pytest.mark.parametrize("role, topology", _cases())
def test_only_container_engine_keys_with_their_types(role, topology):
    data = edf.edf_dict(role, topology, REPO)
    assert set(data) <= CE_KEYS
    assert isinstance(data["image"], str)
    assert data["entrypoint"] is False and data["writable"] is True
    assert all(isinstance(m, str) for m in data["mounts"])
    assert all(isinstance(v, str) for v in data["env"].values())

    def leaves(table, prefix=""):
        for key, value in table.items():
            if isinstance(value, dict):
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    for key, value in leaves(data["annotations"]):
        assert key in edf._ANNOTATIONS and isinstance(value, str)


@pytest.mark.parametrize("role, topology", _cases())
def test_env_redeclares_paths_and_caches(role, topology):
    env = edf.edf_dict(role, topology, REPO)["env"]
    for key in ("PATH", "LD_LIBRARY_PATH", "HF_HOME", "TRITON_CACHE_DIR"):
        assert env[key], key
    assert env["HF_HOME"].startswith("${SCRATCH}/")


@pytest.mark.parametrize("role", ROLES)
def test_pipeline_keeps_the_three_pinned_hooks_and_forces_nccl_net(role):
    data = edf.edf_dict(role, "pipeline", REPO)
    hooks = data["annotations"]["com"]["hooks"]
    assert hooks["netstack"]["source"] == "artifact" and hooks["netstack"]["version"]
    assert hooks["cxi"] == {"enabled": "true"}
    assert hooks["aws_ofi_nccl"] == {"enabled": "true", "variant": "rocm6"}
    assert data["env"]["NCCL_NET"] == "AWS Libfabric"


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("topology", ["single", "replicas"])
def test_intranode_drops_fabric_hooks_and_nccl_net(role, topology):
    data = edf.edf_dict(role, topology, REPO)
    hooks = data["annotations"]["com"]["hooks"]
    assert hooks["cxi"] == {"enabled": "false"}
    assert hooks["aws_ofi_nccl"] == {"enabled": "false"}
    assert hooks["netstack"] == edf.edf_dict(role, "pipeline", REPO)["annotations"]["com"]["hooks"]["netstack"]
    assert data["env"]["NCCL_NET"] == ""  # unset in the container: nothing forces the fabric


def test_mi200_and_mi300_vllm_share_one_image():
    catalog = edf.load_catalog(REPO)
    assert catalog["vllm-mi200"].remote_image == catalog["vllm-mi300"].remote_image
    assert catalog["vllm-mi200"].edf["image"] == catalog["vllm-mi300"].edf["image"]


@pytest.mark.parametrize("role", ROLES)
def test_remote_images_are_pinned(role):
    assert unpinned(edf.load_catalog(REPO)[role].remote_image) is None


def test_unknown_topology():
    with pytest.raises(EdfError) as err:
        edf.edf_name("vllm-mi300", "tensor", REPO)
    assert str(err.value) == "topology: unknown topology 'tensor'; hint: one of: single, pipeline, replicas"


def test_unknown_role():
    with pytest.raises(EdfError) as err:
        edf.render_edf("vllm-mi250", "single", REPO)
    assert str(err.value) == (
        "containers/edfs: unknown container role 'vllm-mi250'; "
        "hint: did you mean 'vllm-mi200'? roles: sglang-h100, sglang-mi300, vllm-h100, vllm-mi200, vllm-mi300"
    )


# ---------------------------------------------------------------------------------------------
# validation, on a one-file catalog

VALID = """\
role: r
name: test-r-latest
engine: vllm
remote_image: vllm/vllm-openai-rocm:v0.28.0
fabric_env:
  NCCL_NET: "AWS Libfabric"
edf:
  image: "${SCRATCH}/ce-images/r.sqsh"
  entrypoint: false
  mounts: ["${SCRATCH}:${SCRATCH}"]
  env:
    HF_HOME: "${SCRATCH}/hf"
  annotations:
    com.hooks.netstack.source: "artifact"
    com.hooks.netstack.version: "26.07.1"
    com.hooks.netstack.name: "gpu:rocm7"
    com.hooks.cxi.enabled: "true"
    com.hooks.aws_ofi_nccl.enabled: "true"
    com.hooks.aws_ofi_nccl.variant: "rocm6"
"""


def _root(tmp_path: Path, text: str, filename: str = "r.yaml") -> Path:
    folder = tmp_path / "containers" / "edfs"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / filename).write_text(text, encoding="utf-8")
    return tmp_path


def _error(tmp_path: Path, text: str, filename: str = "r.yaml") -> str:
    with pytest.raises(EdfError) as err:
        edf.load_catalog(_root(tmp_path, text, filename))
    return str(err.value)


def test_valid_source_loads(tmp_path):
    src = edf.load_catalog(_root(tmp_path, VALID))["r"]
    assert src.file == "containers/edfs/r.yaml"
    assert edf.edf_name("r", "replicas", tmp_path) == "test-r-latest-intranode"


def test_sources_that_say_the_same_on_other_lines_are_equal(tmp_path):
    from dataclasses import FrozenInstanceError, replace

    src = edf.load_catalog(_root(tmp_path, VALID))["r"]
    assert src.lines and replace(src, lines={}) == src and "lines" not in repr(src)
    assert replace(src, remote_image="other:1") != src
    with pytest.raises(FrozenInstanceError):
        src.role = "x"


EDF_KEYS_HINT = "Container Engine EDF keys are: base_environment, image, workdir, entrypoint, writable, mounts, env, annotations"
PIN_HINT = (
    "pin a release tag or a digest (IMAGE:TAG or IMAGE@sha256:<digest>); "
    "the EDF name may say -latest, the image may not"
)


@pytest.mark.parametrize(
    "old, new, message",
    [
        pytest.param(
            "  entrypoint: false", "  entrypiont: false",
            "containers/edfs/r.yaml:9: edf.entrypiont: unknown key; hint: did you mean 'entrypoint'? " + EDF_KEYS_HINT,
            id="unknown-edf-key",
        ),
        pytest.param(
            "engine: vllm", "engine: vllm\nimage_tag: v1",
            "containers/edfs/r.yaml:4: image_tag: unknown key; hint: keys of a container source are: "
            "role, name, engine, remote_image, fabric_env, edf",
            id="unknown-top-key",
        ),
        pytest.param(
            '    HF_HOME: "${SCRATCH}/hf"', '    HF_HOME: "${SCRATCH}/hf"\n    TP_SIZE: 4',
            'containers/edfs/r.yaml:13: edf.env.TP_SIZE: [env] values must be strings, got an integer (4); '
            'hint: quote it: TP_SIZE: "4"',
            id="env-int",
        ),
        pytest.param(
            '    HF_HOME: "${SCRATCH}/hf"', '    HF_HOME: "${SCRATCH}/hf"\n    HF_HUB_OFFLINE: yes',
            'containers/edfs/r.yaml:13: edf.env.HF_HUB_OFFLINE: [env] values must be strings, got a boolean (true); '
            'hint: quote it: HF_HUB_OFFLINE: "true"',
            id="env-yaml-bool",
        ),
        pytest.param(
            '  NCCL_NET: "AWS Libfabric"', "  NCCL_NET:",
            'containers/edfs/r.yaml:6: fabric_env.NCCL_NET: [env] values must be strings, got nothing (null); '
            'hint: quote it: NCCL_NET: ""',
            id="fabric-env-null",
        ),
        pytest.param(
            "remote_image: vllm/vllm-openai-rocm:v0.28.0", "remote_image: vllm/vllm-openai-rocm",
            "containers/edfs/r.yaml:4: remote_image: 'vllm/vllm-openai-rocm' has no tag; hint: " + PIN_HINT,
            id="no-tag",
        ),
        pytest.param(
            "remote_image: vllm/vllm-openai-rocm:v0.28.0", "remote_image: vllm/vllm-openai-rocm:latest",
            "containers/edfs/r.yaml:4: remote_image: 'vllm/vllm-openai-rocm:latest' is tagged 'latest', "
            "which moves; hint: " + PIN_HINT,
            id="latest",
        ),
        pytest.param(
            "remote_image: vllm/vllm-openai-rocm:v0.28.0", "remote_image: localhost:5000#vllm/vllm-openai-rocm",
            "containers/edfs/r.yaml:4: remote_image: 'localhost:5000#vllm/vllm-openai-rocm' has no tag; hint: " + PIN_HINT,
            id="registry-port-no-tag",
        ),
        pytest.param(
            "  entrypoint: false", '  entrypoint: "false"',
            "containers/edfs/r.yaml:9: edf.entrypoint: must be a boolean, got a string ('false'); "
            "hint: write true or false, unquoted",
            id="bool-as-string",
        ),
        pytest.param(
            '    com.hooks.cxi.enabled: "true"', "    com.hooks.cxi.enabled: true",
            'containers/edfs/r.yaml:17: edf.annotations.com.hooks.cxi.enabled: annotation values must be strings, '
            'got a boolean (true); hint: quote it: com.hooks.cxi.enabled: "true"',
            id="annotation-bool",
        ),
        pytest.param(
            '    com.hooks.cxi.enabled: "true"', '    com.hooks.cxi.enabled: "true"\n    com.hooks.aws_ofi_ncl.enabled: "true"',
            "containers/edfs/r.yaml:18: edf.annotations.com.hooks.aws_ofi_ncl.enabled: unknown annotation; "
            "hint: did you mean 'com.hooks.aws_ofi_nccl.enabled'? known: " + ", ".join(edf._ANNOTATIONS),
            id="unknown-annotation",
        ),
        pytest.param(
            '    com.hooks.aws_ofi_nccl.variant: "rocm6"', '    com.hooks.aws_ofi_nccl.variant: "rocm7"',
            "containers/edfs/r.yaml:19: edf.annotations.com.hooks.aws_ofi_nccl.variant: 'rocm7' is not one of "
            "cuda11, cuda12, cuda13, cuda-dl, rocm5, rocm6",
            id="hook-variant",
        ),
        pytest.param(
            '    com.hooks.netstack.version: "26.07.1"\n', "",
            "containers/edfs/r.yaml:13: edf.annotations: com.hooks.netstack.version is missing: an unversioned "
            "artifact follows CSCS's latest; hint: pin the netstack version the image was tested with",
            id="netstack-unpinned",
        ),
        pytest.param(
            '    HF_HOME: "${SCRATCH}/hf"', '    HF_HOME: "${SCRATCH}/hf"\n    HF_HOME: "/tmp"',
            "containers/edfs/r.yaml:13: edf.env.HF_HOME: duplicate key; hint: YAML would keep only the last one",
            id="duplicate-key",
        ),
        pytest.param(
            '  image: "${SCRATCH}/ce-images/r.sqsh"', "  image: vllm/vllm-openai-rocm:v0.28.0",
            "containers/edfs/r.yaml:8: edf.image: 'vllm/vllm-openai-rocm:v0.28.0' is a registry reference; the EDF "
            "names the local SquashFS that registry.sbatch pull writes; hint: put the reference in remote_image "
            'and set edf.image to "${SCRATCH}/ce-images/<file>.sqsh"',
            id="remote-image-in-edf",
        ),
        pytest.param(
            "role: r", "role: q",
            "containers/edfs/r.yaml:1: role: role 'q' does not match the file name 'r.yaml'; "
            "hint: name the file q.yaml, or set role: r",
            id="role-not-file-name",
        ),
        pytest.param(
            '    HF_HOME: "${SCRATCH}/hf"', '    HF_HOME: "${SCRATCH}/hf"\n    NCCL_NET: "Socket"',
            "containers/edfs/r.yaml:6: fabric_env.NCCL_NET: is also set in edf.env; hint: a key belongs either "
            "to every variant (edf.env) or to the pipeline EDF only (fabric_env)",
            id="fabric-env-also-in-env",
        ),
        pytest.param(
            "edf:\n", "edf:\n  image_store: x\n",
            "containers/edfs/r.yaml:8: edf.image_store: unknown key; hint: did you mean 'image'? " + EDF_KEYS_HINT,
            id="unknown-key-near-image",
        ),
    ],
)
def test_validation_error(tmp_path, old, new, message):
    assert old in VALID
    assert _error(tmp_path, VALID.replace(old, new, 1)) == message


def test_invalid_yaml_names_the_line(tmp_path):
    # the unclosed list on line 3 is noticed where the parser trips, on line 4
    assert _error(tmp_path, VALID.replace("engine: vllm", "engine: [vllm")) == (
        "containers/edfs/r.yaml:4: invalid YAML: expected ',' or ']', but got ':'; hint: fix the YAML syntax"
    )


def test_two_roles_one_squashfs_two_images(tmp_path):
    _root(tmp_path, VALID)
    other = VALID.replace("role: r", "role: s").replace("test-r-latest", "test-s-latest").replace(
        ":v0.28.0", ":v0.27.1"
    )
    assert _error(tmp_path, other, "s.yaml") == (
        "containers/edfs/s.yaml:8: edf.image: '${SCRATCH}/ce-images/r.sqsh' is also the SquashFS of r, "
        "which pins 'vllm/vllm-openai-rocm:v0.28.0', not 'vllm/vllm-openai-rocm:v0.27.1'; "
        "hint: one SquashFS holds one image: give this role its own file name"
    )


def test_empty_catalog(tmp_path):
    with pytest.raises(EdfError) as err:
        edf.roles(tmp_path)
    assert "no container definitions (*.yaml)" in str(err.value)


@pytest.mark.parametrize(
    "ref, problem",
    [
        pytest.param("vllm/vllm-openai-rocm:v0.28.0", None, id="tag"),
        pytest.param("nvcr.io#nvidia/pytorch:22.12-py3", None, id="registry-tag"),
        pytest.param("user@nvcr.io#nvidia/pytorch:22.12-py3", None, id="user-registry-tag"),
        pytest.param("localhost:5000#team/img:1.0", None, id="registry-port-tag"),
        pytest.param("vllm/vllm-openai-rocm@sha256:" + "a" * 64, None, id="digest"),
        pytest.param("vllm/vllm-openai-rocm:latest@sha256:" + "0" * 64, None, id="latest-with-digest"),
        pytest.param("vllm/vllm-openai-rocm", "has no tag", id="no-tag"),
        pytest.param("localhost:5000#team/img", "has no tag", id="registry-port-no-tag"),
        pytest.param("vllm/vllm-openai-rocm:latest", "is tagged 'latest', which moves", id="latest"),
        pytest.param("vllm/vllm-openai-rocm:LATEST", "is tagged 'latest', which moves", id="latest-upper"),
        pytest.param("vllm/vllm-openai-rocm:", "has an empty tag", id="empty-tag"),
        pytest.param(
            "vllm/vllm-openai-rocm@sha256:abc",
            "has a malformed digest (want @sha256: and 64 hex digits)",
            id="short-digest",
        ),
    ],
)
def test_unpinned(ref, problem):
    assert unpinned(ref) == problem


@pytest.mark.parametrize(
    "environ, expected",
    [
        pytest.param({"EDF_PATH": "/a/edf:/b/edf", "HOME": "/h"}, "/a/edf", id="first-of-edf-path"),
        pytest.param({"EDF_PATH": ":/b/edf", "HOME": "/h"}, "/b/edf", id="skips-empty"),
        pytest.param({"EDF_PATH": "", "HOME": "/h"}, "/h/.edf", id="empty-edf-path"),
        pytest.param({"HOME": "/h"}, "/h/.edf", id="home"),
    ],
)
def test_edf_search_dir(environ, expected):
    assert edf.edf_search_dir(environ) == Path(expected)


@pytest.mark.parametrize(
    "text, environ, expected",
    [
        pytest.param("${SCRATCH}/x.sqsh", {"SCRATCH": "/s"}, "/s/x.sqsh", id="var"),
        pytest.param("${NOPE:-/d}/x", {}, "/d/x", id="default"),
        pytest.param("$${SCRATCH}", {}, "${SCRATCH}", id="escaped"),
    ],
)
def test_expand_vars(text, environ, expected):
    assert edf.expand_vars(text, environ) == expected


def test_expand_vars_undefined_is_an_error():
    with pytest.raises(EdfError) as err:
        edf.expand_vars("${SCRATCH}/x", {}, where="edf.image")
    assert str(err.value) == "edf.image: ${SCRATCH} is not set; hint: export SCRATCH (the Container Engine expands it the same way)"


def test_shipped_sources_are_copyable(tmp_path):
    """The catalog validates outside the checkout too (what a wheel ships)."""
    shutil.copytree(REPO / "containers" / "edfs", tmp_path / "containers" / "edfs")
    assert edf.roles(tmp_path) == sorted(ROLES + IMAGE_ROLES)
