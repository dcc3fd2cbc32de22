"""Container definitions (EDFs) for the CSCS Container Engine: one YAML source per engine image in
``containers/edfs/``, two TOML EDFs rendered from each, installed where ``srun --environment`` finds them
(docs/containers.md).

One module per job:

- :mod:`.schema`: the sources' schema, validated with file:line (``load_catalog``, ``RoleSource``);
- :mod:`.render`: a source and a topology -> the EDF's TOML (``render_edf``, ``edf_name``), and the folder
  the Container Engine reads it from (``edf_search_dir``);
- :mod:`.images`: the SquashFS images the EDFs name (``expand_vars``, ``image_info``, ``fetch_command``).

This package re-exports their public names, so ``from envlayers import edf; edf.render_edf(...)``
keeps working. PyYAML and tomli-w are imported inside the functions that need them, so importing the
package is cheap (the CLI imports it for ``TOPOLOGIES``). Pure: writing the EDFs into ``EDF_PATH`` or
``~/.edf`` is ``edfinstall.py`` (``env_layers install-edfs``).
"""

from __future__ import annotations

from ..errors import EdfError
from .images import expand_vars, fetch_command, image_info
from .render import (edf_dict, edf_name, edf_search_dir, render_edf, render_source, roles, variant_for,
                     written_by_envlayers)
from .schema import (
    _ANNOTATIONS,
    FABRIC_HOOKS,
    FETCH_SCRIPT,
    INTRANODE_SUFFIX,
    SOURCE_DIR,
    TOPOLOGIES,
    VARIANTS,
    RoleSource,
    load_catalog,
)

__all__ = [
    "EdfError", "expand_vars", "fetch_command", "image_info", "edf_search_dir",
    "edf_dict", "edf_name", "render_edf", "render_source", "roles", "variant_for", "written_by_envlayers",
    "FABRIC_HOOKS",
    "FETCH_SCRIPT", "INTRANODE_SUFFIX", "SOURCE_DIR", "TOPOLOGIES", "VARIANTS", "RoleSource", "load_catalog",
    "_ANNOTATIONS",
]
