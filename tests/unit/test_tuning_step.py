"""StepTuner and TrialPlan: which candidates a DDP puts on trial, step timing, the rank sum, the choice."""
from ringlet.tuning import StepTuner, TrialPlan


def test_candidates():
    assert TrialPlan("auto", 4, timing=True, factors=False).candidates() == ("auto", "direct")
    assert TrialPlan("auto", 4, timing=True, factors=True).candidates() == ("auto", "direct", "auto+factors")
    assert TrialPlan("auto", 2, timing=True, factors=True).candidates() == ("auto", "auto+factors")
    assert TrialPlan("auto", 9, timing=True, factors=False).candidates() == ("auto",)
    assert TrialPlan("auto", 4, timing=True, factors=True, native=True).candidates() == (
        "native", "auto", "direct", "native+factors")
    assert TrialPlan("auto", 2, timing=True, factors=False, native=True).candidates() == ("native", "auto")
    assert TrialPlan("ring", 4, timing=True, factors=False, native=True).candidates() == ("ring",)
    assert TrialPlan("ring", 4, timing=True, factors=True).candidates() == ("ring", "ring+factors")
    assert TrialPlan("auto", 4, timing=False, factors=True).candidates() == ("auto",)
    forced = TrialPlan("auto", 4, timing=True, factors=False, resolve=lambda a: "direct")
    assert forced.candidates() == ("auto",)


def test_resolve_is_asked_only_when_the_algorithm_may_be_tuned():
    def fail(a):
        raise AssertionError("resolve called")

    assert TrialPlan("ring", 4, timing=True, factors=False, resolve=fail).candidates() == ("ring",)
    assert TrialPlan("auto", 4, timing=False, factors=False, resolve=fail).candidates() == ("auto",)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_times_reduced_steps_sums_over_ranks_and_decides_once():
    clock, sums = Clock(), []

    def over_three_ranks(values):
        sums.append(list(values))
        return [3 * v for v in values]

    st = StepTuner(("auto", "direct"), over_three_ranks, clock)
    seen = []
    decision = None
    for step in range(20):
        d = st.step_started()
        if d is not None:
            assert decision is None and step == 13  # untimed step 0, 2 warm-up steps, 5 trials each
            decision = d
        seen.append(st.algorithm)
        if step != 0:
            st.mark_reduced()  # the first step reduced nothing: not timed, not counted
        clock.now += 1.0 if st.algorithm == "auto" else 0.5
    assert seen[:13] == ["auto"] * 4 + ["direct", "auto"] * 4 + ["direct"]
    assert len(sums) == 1 and len(sums[0]) == 4  # medians and spreads, once
    assert decision.choice == "direct" and decision.times == {"auto": 3.0, "direct": 1.5}
    assert StepTuner.per_rank_ms(decision, 3) == {"auto": 1000.0, "direct": 500.0}
    assert seen[13:] == ["direct"] * 7 and st.wants_factors()


def test_factors_on_trial_and_withdrawn():
    st = StepTuner(("auto", "auto+factors"), lambda v: v, Clock())
    assert st.factors_on_trial and not st.wants_factors() and st.algorithm == "auto"
    st.drop_factors()
    assert not st.factors_on_trial and st.choice.decision is not None and st.choice.current() == "auto"
    assert st.wants_factors()  # without a comparison the chosen layers always use factors
