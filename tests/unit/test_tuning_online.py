"""OnlineChoice: round-robin trials after warm-up, then the candidate with the smallest summed median."""
import pytest

from ringlet.tuning import OnlineChoice


def run(choice, times_by_candidate, steps):
    used = []
    for _ in range(steps):
        c = choice.current()
        used.append(c)
        choice.record(times_by_candidate[c])
    return used


def test_warmup_then_alternates_then_ready():
    ch = OnlineChoice(["a", "b"], warmup=2, trials=3)
    used = run(ch, {"a": 2.0, "b": 1.0}, 8)
    assert used == ["a", "a", "a", "b", "a", "b", "a", "b"]
    assert ch.ready and ch.decision is None
    assert ch.medians() == [2.0, 1.0]
    d = ch.decide([8.0, 4.0])  # e.g. summed over 4 ranks
    assert d.choice == "b" and d.times == {"a": 8.0, "b": 4.0}
    assert not ch.ready and ch.current() == "b"
    ch.record(100.0)  # after the decision, recording changes nothing
    assert ch.current() == "b"


def test_median_resists_one_outlier_and_ties_go_first():
    ch = OnlineChoice(["a", "b"], warmup=0, trials=3)
    for t in (1.0, 1.5, 9.0, 1.5, 1.0, 1.5):  # a: 1, 9, 1 -> median 1; b: 1.5 x3
        ch.record(t)
    assert ch.medians() == [1.0, 1.5]
    assert ch.decide([3.0, 3.0]).choice == "a"


def test_single_candidate_is_decided_at_once():
    ch = OnlineChoice(["ring"])
    assert ch.decision is not None and ch.current() == "ring" and not ch.ready


def test_duplicates_collapse_and_bad_arguments_raise():
    assert OnlineChoice(["a", "a"]).decision.choice == "a"
    with pytest.raises(ValueError):
        OnlineChoice([])
    with pytest.raises(ValueError):
        OnlineChoice(["a", "b"], trials=0)
    with pytest.raises(ValueError):
        OnlineChoice(["a", "b"]).decide([1.0])


@pytest.mark.parametrize("challenger, expected", [(0.99, "a"), (0.97, "a"), (0.969, "b"), (0.5, "b")])
def test_first_candidate_stays_unless_beaten_by_the_margin(challenger, expected):
    ch = OnlineChoice(["a", "b"], warmup=0, trials=1, margin=0.03)
    run(ch, {"a": 1.0, "b": challenger}, 2)
    assert ch.decide([1.0, challenger]).choice == expected


def test_margin_must_be_a_fraction():
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError):
            OnlineChoice(["a", "b"], margin=bad)


def test_a_candidate_withdrawn_before_the_trials_is_never_tried():
    ch = OnlineChoice(["a", "b", "c"], warmup=1, trials=1)
    ch.record(1.0)  # warm-up only
    ch.remove("c")
    assert ch.candidates == ("a", "b")
    run(ch, {"a": 1.0, "b": 2.0}, 2)
    assert ch.ready and ch.decide([1.0, 2.0]).choice == "a"
    ch = OnlineChoice(["a", "b"])
    ch.remove("b")
    assert ch.decision is not None and ch.current() == "a"


def test_withdrawing_after_trials_started_raises():
    ch = OnlineChoice(["a", "b"], warmup=0, trials=2)
    ch.record(1.0)
    with pytest.raises(RuntimeError):
        ch.remove("b")


def _feed(ch, samples):
    """Record per-candidate samples in the round-robin order the chooser asks for, until a decision is
    due; ``samples``: candidate -> iterator (later calls go on where the last one stopped)."""
    while ch.decision is None and not ch.ready:
        ch.record(next(samples[ch.current()]))


def test_close_medians_ask_for_more_trials_until_they_separate_or_the_cap():
    # b is 3.5% faster than a, but each candidate's steps spread by ±10%: not decided on five each.
    noise = [1.0, 0.9, 1.1, 0.95, 1.05] * 4
    ch = OnlineChoice(["a", "b"], warmup=0, trials=5, margin=0.03, max_trials=20)
    samples = {"a": iter([x * 1.0 for x in noise]), "b": iter([x * 0.965 for x in noise])}
    rounds = 0
    while ch.decision is None:
        _feed(ch, samples)
        rounds += 1
        ch.decide(ch.stats())
    assert rounds == 4 and ch.trials_done == 20  # at the cap, the plain rule: b beats the 3% margin
    assert ch.decision.choice == "b"


def test_clearly_separated_medians_decide_after_the_first_trials():
    ch = OnlineChoice(["a", "b", "c"], warmup=0, trials=5, margin=0.03, max_trials=20)
    noise = [1.0, 0.98, 1.02, 0.99, 1.01]
    _feed(ch, {"a": iter(noise), "b": iter([x * 1.02 for x in noise]), "c": iter([x * 0.85 for x in noise])})
    d = ch.decide([4 * x for x in ch.stats()])  # summed over 4 ranks in lockstep
    assert d is not None and d.choice == "c" and ch.trials_done == 5
    assert d.times == pytest.approx({"a": 4.0, "b": 4.08, "c": 3.4})


def test_a_challenger_clearly_within_the_margin_keeps_the_first_at_once():
    ch = OnlineChoice(["a", "b"], warmup=0, trials=5, margin=0.03, max_trials=20)
    noise = [1.0, 0.999, 1.001, 0.9995, 1.0005]
    _feed(ch, {"a": iter(noise), "b": iter([x * 0.99 for x in noise])})
    assert ch.decide(ch.stats()).choice == "a"


def test_medians_alone_decide_as_before_and_max_trials_is_checked():
    ch = OnlineChoice(["a", "b"], warmup=0, trials=2, margin=0.03, max_trials=10)
    _feed(ch, {"a": iter([1.0, 1.2]), "b": iter([0.9, 1.3])})
    assert ch.decide(ch.medians()).choice == "a"  # no spreads: no extension
    with pytest.raises(ValueError):
        OnlineChoice(["a", "b"], trials=5, max_trials=4)
    with pytest.raises(ValueError):
        OnlineChoice(["a", "b"]).decide([1.0, 2.0, 3.0])
