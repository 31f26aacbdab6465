"""The demo report: one self-contained HTML page of a generation run's outputs (``make demo``'s), with its pictures."""
