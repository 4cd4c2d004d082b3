"""The timeline helper behind priority scheduling's measurement: the share of communication that ran
while a forward computed (its waits for averages left out)."""
from __future__ import annotations

import pytest

from ringlet.timeline import STEP_EVENT, STEP_TRACK, Timeline
from ringlet.torch.training.forward_overlap import forward_overlap, subtract


def write(path, spans, marks, rank=0):
    tl = Timeline(str(path), rank)
    for ts in marks:
        tl.instant(STEP_TRACK, STEP_EVENT, ts_us=ts)
    for track, phase, a, b in spans:
        tl.span(track, phase, a, b)
    tl.close()


def test_shares_of_forward_backward_and_exposed_communication(tmp_path):
    path = tmp_path / "t.json"
    write(path, [
        ("ddp.bucket0", "COMMUNICATE", 10, 20),      # before the skipped first mark's step ends: left out
        ("forward", "FORWARD", 100, 140),
        ("forward", "WAIT", 100, 110),               # waiting for its layer's pieces: not computing
        ("backward", "BACKWARD", 140, 180),
        ("ddp.bucket1", "COMMUNICATE", 105, 125),    # 5 us during the wait, 15 us hidden behind the forward
        ("ddp.bucket0", "COMMUNICATE", 150, 190),    # 30 us behind the backward, 10 us exposed
    ], marks=[0, 100, 200])
    f = forward_overlap(str(path), rank=0, skip=1)
    assert (f.steps, f.comm_us, f.forward_us, f.wait_us) == (2, 60, 30, 10)
    assert (f.hidden_forward_us, f.hidden_backward_us, f.exposed_us) == (15, 30, 15)
    assert f.share_forward == pytest.approx(0.25) and f.share_backward == pytest.approx(0.5)
    assert f.per_step(f.comm_us) == pytest.approx(0.03)


def test_needs_more_step_marks_than_it_skips(tmp_path):
    path = tmp_path / "t.json"
    write(path, [("forward", "FORWARD", 0, 5)], marks=[0])
    with pytest.raises(ValueError, match="step marks"):
        forward_overlap(str(path), rank=0, skip=1)
    assert forward_overlap(str(path), rank=0, skip=0).share_forward == 0.0


@pytest.mark.parametrize("xs, ys, expected", [
    ([], [(1, 2)], []),
    ([(0, 10)], [], [(0, 10)]),
    ([(0, 10)], [(0, 10)], []),
    ([(0, 10)], [(-5, 3), (9, 20)], [(3, 9)]),
    ([(0, 10), (20, 30)], [(2, 3), (5, 12), (25, 40)], [(0, 2), (3, 5), (20, 25)]),
])
def test_subtract(xs, ys, expected):
    assert subtract(xs, ys) == expected
