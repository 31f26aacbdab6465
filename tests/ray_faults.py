"""Test-only fault for the Ray corpus engine: a Ray worker that exits while it encodes a chunk, once.

Ray runs :func:`install` in every worker process it starts (``runtime_env`` ``worker_process_setup_hook``),
before the worker unpickles a task's function, so the engine's encode stage resolves to the patched one.
A file ``die-once`` in the folder ``LOGOS_TEST_RAY_FAULT_DIR`` names makes the next encode task's worker
exit; the file is consumed by exactly one task.
"""

import os

DIR_ENV = "LOGOS_TEST_RAY_FAULT_DIR"


def install() -> None:
    import logos.data.corpus_ray as engine

    encode = engine._encode

    def encode_or_die(row: dict) -> dict:
        folder = os.environ.get(DIR_ENV)
        if folder:
            try:
                os.remove(os.path.join(folder, "die-once"))
            except FileNotFoundError:
                pass
            else:
                os._exit(1)
        return encode(row)

    engine._encode = encode_or_die
