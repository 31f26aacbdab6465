"""Evaluation: the field's own metrics for every LOGOS task, comparable with the literature and other models.

One module per field, each with an in-memory ``evaluate`` that generation calls too:

- :mod:`~logos.evaluate.molecules` - MOSES metrics (validity, unique@k, novelty, IntDiv, filters, FCD, SA, QED);
- :mod:`~logos.evaluate.reactions` - retro / forward top-k exact match, invalid rate, per class;
- :mod:`~logos.evaluate.crystals` - CDVAE validity, uniqueness, novelty, property distances; CSP match rate, RMSE;
- :mod:`~logos.evaluate.mofs` - valid, unique, novel, VNU;
- :mod:`~logos.evaluate.pockets` - residue precision/recall/F1, DCC, DCA, top-n;
- :mod:`~logos.evaluate.ligands` - drug-likeness and Vina scores;
- :mod:`~logos.evaluate.proteins` - uniqueness, composition, length, identity to training;
- :mod:`~logos.evaluate.reference` - cached canonical reference sets; :mod:`~logos.evaluate.report` - reports;
- :mod:`~logos.evaluate.tasks` - ``logos evaluate``: files in, report out.
"""

from logos.evaluate.tasks import DEFAULT_REFERENCES, TASKS, EvaluateOptions, run

__all__ = ["DEFAULT_REFERENCES", "TASKS", "EvaluateOptions", "run"]
