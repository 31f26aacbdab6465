"""Constrained decoding: grammar masks, per-row domain constraints (chemistry, crystal composition), the sampler."""
