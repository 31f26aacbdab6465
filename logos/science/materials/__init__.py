"""Crystals and metal-organic frameworks: data model, symmetry, grammar text, CIF writing, MOF split, validity.

One module per job; the domain adapters :mod:`logos.domains.crystal` and :mod:`logos.domains.mof`
put them behind the :class:`~logos.domains.base.Domain` interface.

- :mod:`~logos.science.materials.crystal`: the ``Crystal``/``Site`` data model, lattice math, readers (CIF
  blocks via gemmi, pymatgen ``Structure`` JSON, POSCAR);
- :mod:`~logos.science.materials.symmetry`: spglib analysis, the operations of a space group's standard
  setting, snapping, orbits, expansion to the unit cell;
- :mod:`~logos.science.materials.wyckoff`: Wyckoff positions of the 230 space groups (pyxtal's tables), free
  lattice parameters per crystal system;
- :mod:`~logos.science.materials.text`: Crystal -> grammar text v2 (canonical form, precision), decoding;
- :mod:`~logos.science.materials.parse`: grammar text (v2, v1) -> Crystal, one-line errors;
- :mod:`~logos.decoding.crystal_rules`: per-space-group grammar of the crystal body for constrained decoding;
- :mod:`~logos.science.materials.cif`: CIF writing;
- :mod:`~logos.science.materials.bonds`: covalent bonds and connected components under periodic boundaries;
- :mod:`~logos.science.materials.framework`: the MOF split (node formula, linker SMILES) and MOF text;
- :mod:`~logos.science.materials.validity`: validity of generated crystals and MOFs.

The main functions and classes are importable from the package too (``from logos.science.materials import
encode_crystal``); constants (the grammar tokens, tolerances) from their modules.
"""

import os

# spglib's C core prints search diagnostics ("ssm_get_exact_positions failed") to stderr; the
# encoder reports failures itself, one line per record. Set before any module here imports spglib.
os.environ.setdefault("SPGLIB_WARNING", "OFF")

from logos.science.materials.bonds import components, periodic_bonds  # noqa: E402
from logos.science.materials.cif import crystal_to_cif  # noqa: E402
from logos.science.materials.crystal import (Crystal, Site, cif_blocks, count_crystals, crystal_from_dict,  # noqa: E402
                                     crystal_from_poscar, crystal_from_pymatgen, lattice_matrix, lattice_parameters,
                                     load, read_cif_block, read_crystal_file)
from logos.science.materials.framework import encode_framework, parse_mof_text, split_framework  # noqa: E402
from logos.science.materials.symmetry import expand, orbit, space_group_operations, symmetry_dataset, unit_cell  # noqa: E402
from logos.science.materials.text import convert_v1, decode_text, encode_crystal, parse_crystal_text  # noqa: E402
from logos.science.materials.validity import (CrystalValidity, check_crystal, compositional_validity,  # noqa: E402
                                      known_nodes, mof_validity, multiplicity_consistency, space_group_consistency,
                                      structural_validity, summarize, validity_report)
from logos.science.materials.wyckoff import crystal_system, lattice_free, multiplicity, position, positions  # noqa: E402

__all__ = [
    "Crystal", "Site", "lattice_matrix", "lattice_parameters", "cif_blocks", "read_crystal_file", "count_crystals",
    "read_cif_block", "crystal_from_dict", "crystal_from_pymatgen", "crystal_from_poscar", "load",
    "symmetry_dataset", "space_group_operations", "orbit", "expand", "unit_cell", "multiplicity",
    "encode_crystal", "parse_crystal_text", "decode_text", "convert_v1", "crystal_to_cif", "position", "positions",
    "crystal_system", "lattice_free",
    "periodic_bonds", "components", "split_framework", "encode_framework", "parse_mof_text",
    "CrystalValidity", "check_crystal", "structural_validity", "compositional_validity", "space_group_consistency",
    "multiplicity_consistency", "summarize", "mof_validity", "known_nodes", "validity_report",
]
