"""Images as every runtime names them: whether a reference is pinned (:func:`unpinned`, the one check, for
``CONTAINER_IMAGE`` and the container sources' ``remote_image`` alike), and where a runtime reads a job's image
from shared storage (:func:`shared_image`: a file or folder of the image folder, named after the pinned image).
Pure: moving an image's archive there is ``imagearchive.py`` (``env_layers images save|load``).
"""

from __future__ import annotations

import re
from typing import Mapping

from ..errors import EnvLayersError

_DIGEST_RE = re.compile(r"@sha256:[0-9a-f]{64}$")


def unpinned(ref: str) -> str | None:
    """Why a remote reference ``[USER@][REGISTRY#]IMAGE[:TAG][@sha256:DIGEST]`` is not pinned,
    or None when it is."""
    if _DIGEST_RE.search(ref):
        return None
    if "@sha256:" in ref:
        return "has a malformed digest (want @sha256: and 64 hex digits)"
    image = ref.rsplit("#", 1)[-1]
    if "#" not in ref and "@" in image:
        image = image.split("@", 1)[1]  # USER@IMAGE
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "has no tag"
    tag = last.rsplit(":", 1)[1]
    if not tag:
        return "has an empty tag"
    if tag.lower() == "latest":
        return "is tagged 'latest', which moves"
    return None


def shared_image(env: Mapping[str, str], role_image: str | None, program: str, kind: str, name_of,
                 where=lambda key: key, folder_required: bool = True) -> tuple[str, str]:
    """The image a runtime reads from shared storage, as ``(path, pinned image)``: ``CONTAINER_IMAGE`` when it
    is a path (``/...`` or ``$VAR/...``; the pinned image then ``""``), else the pinned image (``CONTAINER_IMAGE``
    or the role's) as ``CONTAINER_IMAGE_DIR/<name_of(image)>``. Without a folder: ``(image, image)`` when
    ``folder_required`` is False (the runtime imports a registry reference itself), else an error. ``kind``
    names the file in messages (``a SIF file``); ``where(key)`` names a key's line (file:line)."""
    given = (env.get("CONTAINER_IMAGE") or "").strip()
    if given.startswith(("/", "$")):
        return given, ""
    if given.endswith((".sif", ".sqsh", ".sqfs")):
        raise EnvLayersError(f"CONTAINER_IMAGE={given!r} is not an absolute path", where=where("CONTAINER_IMAGE"),
                             hint=f"every node reads {kind} from shared storage: name it by its full path")
    image = given or (role_image or "").strip()
    if not image:
        raise EnvLayersError(f"CONTAINER_IMAGE is not set; {program} needs an image to run",
                             where=where("CONTAINER_RUNTIME"),
                             hint=f"{kind}'s path, or a pinned image with CONTAINER_IMAGE_DIR, or set CONTAINER_ROLE "
                                  "to use its image")
    why = unpinned(image)
    if why:
        raise EnvLayersError(f"image {image!r} {why}", where=where("CONTAINER_IMAGE" if given else "CONTAINER_ROLE"),
                             hint="pin a release tag or a digest: every node must run the same bytes")
    folder = (env.get("CONTAINER_IMAGE_DIR") or "").strip()
    if not folder and not folder_required:
        return image, image
    if not folder.startswith(("/", "$")):
        raise EnvLayersError(f"CONTAINER_IMAGE_DIR is {'not set' if not folder else repr(folder)}: {program} runs "
                             f"{kind} from shared storage",
                             where=where("CONTAINER_IMAGE_DIR" if folder else "CONTAINER_RUNTIME"),
                             hint=f"set CONTAINER_IMAGE_DIR to the shared folder that holds them, or CONTAINER_IMAGE "
                                  f"to {kind}'s path")
    return f"{folder.rstrip('/')}/{name_of(image)}", image
