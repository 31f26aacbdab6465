"""``logos detokenize``: grammar-text JSONL -> domain files chosen by the output suffix.

Each record's text is first checked against the grammar (a generated text that does not parse is
reported with the position of its first error), then handed to the writer for the output suffix
(``.smi``, ``.sdf``, ``.rsmi``, ...). Bad records go to the error log; the good ones are written.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from logos.domains import writer_for
from logos.domains.base import WriterOptions
from logos.language.grammar import GrammarError, validate
from logos.util.records import ErrorLog, InputError, RecordError, errors_path_for, read_records

__all__ = ["DetokenizeResult", "detokenize_file"]


@dataclass
class DetokenizeResult:
    records: int
    objects: int
    errors: int
    seconds: float

    @property
    def exit_code(self) -> int:
        return 1 if self.errors else 0


def detokenize_file(inp: Path, out: Path, options: WriterOptions | None = None, progress: bool | None = None,
                    echo=None) -> DetokenizeResult:
    start = time.perf_counter()
    out = Path(out)
    writer_cls = writer_for(out)  # InputError for an unknown suffix, before anything is written
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(unit="rec", desc="detokenize", disable=None if progress is None else not progress,
               mininterval=0.5, file=sys.stderr)
    errors = ErrorLog(errors_path_for(out), echo=echo or (lambda line: bar.write(line, file=sys.stderr)))
    n_records = n_objects = 0
    try:
        with writer_cls(out, options) as writer:
            for record in read_records(Path(inp), errors):
                n_records += 1
                bar.update(1)
                source = record.get("source", f"{inp}:{n_records}")
                try:
                    validate(record["text"])
                    n_objects += writer.write(record)
                except (GrammarError, RecordError) as e:
                    errors.add(source, str(e))
                except Exception as e:  # a detokenizer bug must not lose the other records
                    errors.add(source, f"internal error ({type(e).__name__}): {e}")
    except InputError as e:
        errors.add(str(inp), str(e))
    finally:
        bar.close()
        errors.close()
    return DetokenizeResult(n_records, n_objects, errors.count, time.perf_counter() - start)
