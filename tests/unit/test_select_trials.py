"""The step tuner's candidates from the cost model: "auto" against the model's best other algorithms."""
import pytest

from ringlet.tuning import TrialPlan, select
from ringlet.tuning.network import INTER, INTRA, LinkCost, Network

NET = Network.of(link="1gbit", latency="50us", gamma=0.25e-9)
BUCKETS = (25 << 20, 25 << 20, 7 << 20)


@pytest.mark.parametrize("host_of", [(0, 1, 2, 3), (0, 0, 1, 1), (0, 1, 2), tuple(range(12)), (0, 0, 0, 1, 1, 1, 2)],
                         ids=str)
def test_model_candidates(host_of):
    model = select.Model(NET)
    plan = TrialPlan("auto", len(host_of), timing=True, factors=False, model=model, buckets=BUCKETS, host_of=host_of)
    got = plan.candidates()
    assert got[0] == "auto" and len(got) == 3 and len(set(got)) == 3
    assert got[1:] == model.top_algorithms(BUCKETS, host_of, count=2)
    assert {model.choose(b, host_of).algorithm for b in BUCKETS} != {got[1]}  # not auto's own pick again
    if len(host_of) > 8:
        assert "direct" not in got
    factors = TrialPlan("auto", len(host_of), timing=True, factors=True, model=model, buckets=BUCKETS,
                        host_of=host_of).candidates()
    assert factors == got + ("auto+factors",)


def test_ranked_by_total_predicted_time():
    model, host_of = select.Model(NET), (0, 0, 1, 1)
    top = model.top_algorithms(BUCKETS, host_of, count=6)

    def total(a):
        return sum(model.best(b, host_of, algorithm=a).seconds for b in BUCKETS)

    assert [total(a) for a in top] == sorted(total(a) for a in top)


def test_ranked_with_other_constants_when_given():
    """A re-trial ranks the alternatives under the corrected constants (``network``), while what ``"auto"``
    picks stays the installed model's."""
    model, host_of = select.Model(NET), (0, 0, 1, 1)
    fast = Network({INTRA: NET[INTRA], INTER: LinkCost(NET[INTER].alpha, NET[INTER].beta / 20)}, NET.gamma)
    mine = model.top_algorithms(BUCKETS, host_of, count=6, network=fast)
    assert mine != model.top_algorithms(BUCKETS, host_of, count=6)  # a 20x faster link between hosts reorders

    def total(a):
        return sum(model.best(b, host_of, algorithm=a, network=fast).seconds for b in BUCKETS)

    assert [total(a) for a in mine] == sorted(total(a) for a in mine)
    plan = TrialPlan("auto", 4, timing=True, factors=False, model=model, buckets=BUCKETS, host_of=host_of,
                     network=fast)
    assert plan.candidates() == ("auto",) + mine[:2]


def test_without_a_model_or_when_not_tuning_nothing_changes():
    model = select.Model(NET)
    assert TrialPlan("auto", 4, timing=True, factors=False).candidates() == ("auto", "direct")
    no_buckets = TrialPlan("auto", 4, timing=True, factors=False, model=model)
    assert no_buckets.candidates() == ("auto", "direct")  # bucket sizes unknown: the fixed pair
    assert TrialPlan("ring", 4, timing=True, factors=False, model=model, buckets=BUCKETS).candidates() == ("ring",)
    assert TrialPlan("auto", 4, timing=False, factors=False, model=model, buckets=BUCKETS).candidates() == ("auto",)
    forced = TrialPlan("auto", 4, timing=True, factors=False, resolve=lambda a: "ring", model=model, buckets=BUCKETS)
    assert forced.candidates() == ("auto",)
