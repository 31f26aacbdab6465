"""Science without the language model: chemistry (RDKit), materials (symmetry, Wyckoff positions, CIF, frameworks)."""
