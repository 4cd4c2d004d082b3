"""Step 8 of calibration (ringlet.tuning.wire): a lone inter-host transfer against the inter shift pattern
tells a wire from the processors that copy its bytes."""
from __future__ import annotations

import dataclasses

import pytest

from ringlet.tuning.cost import predict_allreduce
from ringlet.tuning.network import INTER, INTRA, Cpus, LinkCost, Network, Topology
from ringlet.tuning.patterns import sharing, shift_pattern
from ringlet.tuning.wire import WireEvidence, lone_pattern, pattern_load, split_wire

NS = 1e-9
MIB16 = 16 << 20


@pytest.mark.parametrize("host_of, expected", [
    ((0,), ()), ((0, 0, 0), ()), ((0, 1), ((0, 1),)), ((0, 1, 2, 3), ((0, 1),)),
    ((0, 0, 1, 1), ((0, 2),)), ((1, 1, 0, 0), ((0, 2),)), ((0, 0, 0, 1, 1), ((0, 3),)),
])
def test_the_lone_transfer_crosses_one_link_between_hosts(host_of, expected):
    assert lone_pattern(host_of) == expected


def _network(beta_inter, beta_intra=None, kappa=0.0, cores=2.0):
    links = {INTER: LinkCost(50e-6, beta_inter * NS), INTRA: LinkCost(50e-6, (beta_intra or beta_inter) * NS)}
    return Network(links, gamma=0.08 * NS, kappa=kappa * NS, cpus=Cpus("machine", cores))


def _evidence(host_of, network, shift_s, lone_s, fixed_s=0.2e-3):
    top = Topology(host_of)
    shares, loads = {}, {}
    for c in (INTRA, INTER):
        pattern = shift_pattern(host_of, c)
        if pattern:
            shares[c], loads[c] = sharing(pattern, top), pattern_load(pattern, top, network)
    return WireEvidence(MIB16, shift_s, lone_s, fixed_s, shares, loads)


def test_pattern_load_counts_the_machines_endpoints():
    top, net = Topology((0, 1, 2, 3)), _network(1.0)
    assert pattern_load(shift_pattern((0, 1, 2, 3), INTER), top, net) == 4.0  # 8 endpoints on 2 cores
    assert pattern_load(lone_pattern((0, 1, 2, 3)), top, net) == 1.0
    assert pattern_load((), top, net) == 1.0


def test_processors_that_bind_the_shift_get_kappa_and_the_wire_its_own_beta():
    # 4 x 1 at 10 Gbit/s on one 2-core machine, as measured: the lone transfer ran at half the shift's time.
    host_of, net = (0, 1, 2, 3), _network(1.79, kappa=0.37)
    ev = _evidence(host_of, net, shift_s=29.4e-3, lone_s=14.7e-3)
    out, seen = split_wire(net, ev)
    assert seen["split"] and seen["processors"] == pytest.approx(1.79 * NS / 4)
    lone = 1.79 * (14.7e-3 - 0.2e-3) / (29.4e-3 - 0.2e-3)
    assert out[INTER].beta == pytest.approx(lone * NS) and out[INTRA] == out[INTER]  # intra not measured
    assert out.kappa == pytest.approx(1.79 * NS / 4) and out[INTER].alpha == net[INTER].alpha
    # The shift pattern is predicted as before; a step with two of the four ranks moving bytes, faster.
    top = Topology(host_of)
    for algorithm in ("ring", "halving_doubling"):
        before, after = (predict_allreduce(algorithm, MIB16, top, n).seconds for n in (net, out))
        assert after == pytest.approx(before, rel=0.03)
    before, after = (predict_allreduce("tree", MIB16, top, n).seconds for n in (net, out))
    assert after < 0.85 * before


def test_a_larger_kappa_from_the_whole_calls_is_kept():
    net = _network(1.79, kappa=0.6)
    out, seen = split_wire(net, _evidence((0, 1, 2, 3), net, 29.4e-3, 14.7e-3))
    assert seen["split"] and out.kappa == net.kappa


def test_a_lone_transfer_at_the_shifts_rate_leaves_the_links_alone():
    # 4 x 1 at 1 Gbit/s: the wire binds both.
    net = _network(8.33)
    out, seen = split_wire(net, _evidence((0, 1, 2, 3), net, 143.0e-3, 140.2e-3))
    assert out is net and not seen["lone_faster"] and not seen["split"]


def test_a_shift_slower_than_the_processors_explain_leaves_the_links_alone():
    # 2 x 2: two flows share each uplink, and the intra shift (same endpoint load) ran at half the inter
    # shift's time per transfer: the processors cannot explain the inter shift, the shared link does.
    host_of = (0, 0, 1, 1)
    net = _network(0.96, beta_intra=0.95, kappa=0.34)
    out, seen = split_wire(net, _evidence(host_of, net, shift_s=31.5e-3, lone_s=10.0e-3))
    assert seen["lone_faster"] and not seen["processors_explain_shift"] and out is net


@pytest.mark.parametrize("kw", [dict(nbytes=0), dict(shift_s=0.0), dict(lone_s=-1.0)])
def test_bad_evidence_is_refused(kw):
    net = _network(1.0)
    ev = dataclasses.replace(_evidence((0, 1), net, 10e-3, 5e-3), **kw)
    with pytest.raises(ValueError, match="split_wire"):
        split_wire(net, ev)


@pytest.mark.parametrize("margin", [-0.1, 1.0])
def test_bad_margins_are_refused(margin):
    net = _network(1.0)
    with pytest.raises(ValueError, match="margin"):
        split_wire(net, _evidence((0, 1), net, 10e-3, 5e-3), margin)
