"""The resample queue both engines' front ends draw from: failed draws are drawn again up to ``resamples`` times,
finished draws that are not a whole record up to ``whole_draws`` times (the last one kept when a later draw fails),
in queue order."""

from __future__ import annotations

from logos.generate.resample import ResampleQueue


def test_failed_draws_are_drawn_again_then_kept_as_failed():
    queue = ResampleQueue(["a", "b"], resamples=2)
    kept = []
    while queue:
        for attempt in queue.take(1):
            ok = attempt.job == "a" and attempt.resamples == 1  # "a" ends validly at its second draw; "b" never
            result = queue.settle(attempt, (attempt.job, attempt.resamples, ok), ok)
            if result is not None:
                kept.append(result)
    assert kept == [("a", 1, True), ("b", 2, False)] and queue.resampled == 3


def test_a_draw_that_is_not_a_whole_record_is_drawn_again_and_kept_if_the_next_one_fails():
    queue = ResampleQueue(["m"], resamples=1, whole_draws=2)
    a, = queue.take()
    assert queue.settle(a, "first", ok=True, whole=False) is None  # drawn again, "first" kept aside
    b, = queue.take()
    assert (b.draws, b.kept) == (1, "first")
    assert queue.settle(b, "failed", ok=False) is None  # a failed redraw is resampled first ...
    c, = queue.take()
    assert queue.settle(c, "failed again", ok=False) == "first"  # ... and then the kept draw stands
    assert (queue.resampled, queue.not_whole, len(queue)) == (1, 1, 0)
    queue = ResampleQueue(["m"], resamples=0, whole_draws=1)
    d, = queue.take()
    queue.settle(d, "first", ok=True, whole=False)
    e, = queue.take()
    assert queue.settle(e, "second", ok=True, whole=False) == "second"  # out of whole-record draws: the last stands


def test_entries_drawn_again_go_to_the_back_of_the_queue():
    queue = ResampleQueue(range(4), resamples=1)
    first = queue.take(2)
    for attempt in first:
        queue.settle(attempt, None, ok=False)
    assert [(a.job, a.resamples) for a in queue.take()] == [(2, 0), (3, 0), (0, 1), (1, 1)]
