"""Calibration profiles on disk: round trip, the per-user cache, fingerprint matching, bad files; and
what ``init`` attaches (``ringlet.tuning.autoload.attach``) on in-process worlds."""
from __future__ import annotations

import dataclasses
import json
import logging
import os

import pytest
from conftest import run_world

from ringlet.collectives import runtime
from ringlet.engine.probe import Prober
from ringlet.tuning import autoload
from ringlet.tuning.network import INTER, INTRA, LinkCost, Network
from ringlet.tuning.profile import Fingerprint, Profile, cache_path, lookup, profile_dir
from ringlet.types import Options

NET = Network({INTRA: LinkCost(12e-6, 0.05e-9), INTER: LinkCost(180e-6, 8e-9)}, 0.1e-9)


def profile_of(ranks: int, layout: tuple[int, ...], transport: str = "inproc") -> Profile:
    return Profile(Fingerprint(ranks, layout, transport), NET, {"plan": "test"})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "profiles"
    monkeypatch.setenv("RINGLET_PROFILE_DIR", str(folder))
    return folder


@pytest.mark.parametrize("ranks,layout,transport", [(1, (1,), "shm"), (4, (2, 2), "torch"), (5, (3, 2), "mpi"),
                                                    (1024, (8,) * 128, "torch")])
def test_round_trip(tmp_path, ranks, layout, transport):
    prof = Profile(Fingerprint(ranks, layout, transport), NET, {"date": "x", "fit": {"inter": {"alpha": 1.0}}})
    path = tmp_path / "sub" / "p.json"
    prof.save(str(path))
    back = Profile.load(str(path))
    assert back == prof and back.info == prof.info and back.network == NET
    assert json.loads(path.read_text())["fingerprint"]["key"] == prof.fingerprint.key


def test_profile_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGLET_PROFILE_DIR", str(tmp_path / "mine"))
    assert profile_dir() == str(tmp_path / "mine")
    monkeypatch.delenv("RINGLET_PROFILE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert profile_dir() == str(tmp_path / "xdg" / "ringlet" / "profiles")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert profile_dir() == str(tmp_path / "home" / ".cache" / "ringlet" / "profiles")


def test_cache_path_is_named_by_the_fingerprint(cache):
    fp = Fingerprint(4, (2, 2), "torch")
    assert cache_path(fp) == str(cache / f"{fp.key}.json")
    assert cache_path(fp, "/x") == f"/x/{fp.key}.json"
    keys = {Fingerprint(4, (2, 2), "torch").key, Fingerprint(4, (2, 2), "shm").key, Fingerprint(4, (1, 3), "torch").key,
            Fingerprint(4, (3, 1), "torch").key, Fingerprint(4, (4,), "torch").key}
    assert len(keys) == 5


def test_lookup(cache, caplog):
    fp = Fingerprint(4, (2, 2), "torch")
    assert lookup(fp) is None  # nothing cached
    prof = profile_of(4, (2, 2), "torch")
    prof.save(cache_path(fp))
    assert lookup(fp) == prof
    other = Fingerprint(4, (2, 2), "shm")
    profile_of(4, (2, 2), "torch").save(cache_path(other))  # a hand-copied file under another's name
    with caplog.at_level(logging.WARNING, logger="ringlet.tuning"):
        assert lookup(other) is None
    assert "ignoring" in caplog.text and cache_path(other) in caplog.text


BAD_FILES = {
    "not json": ("{not json", "is not JSON"),
    "empty": ("", "is not JSON"),
    "binary": (b"\xff\xfe\x00garbage", "is not JSON|codec"),
    "a list": ("[1, 2]", "not a ringlet calibration profile"),
    "other format": ('{"format": 99}', "not a ringlet calibration profile"),
    "no fingerprint": ('{"format": 1, "network": {}}', "bad fingerprint"),
    "layout sum": ('{"format": 1, "fingerprint": {"ranks": 3, "layout": [2, 2], "transport": "shm"}}',
                   "does not add up"),
    "no network": ('{"format": 1, "fingerprint": {"ranks": 2, "layout": [2], "transport": "shm"}}', "no network"),
    "a class missing": ('{"format": 1, "fingerprint": {"ranks": 2, "layout": [2], "transport": "shm"}, '
                        '"network": {"links": {"intra": {"alpha": 1e-6, "beta": 1e-9}}, "gamma": 0}}', "lacks"),
    "negative alpha": ('{"format": 1, "fingerprint": {"ranks": 2, "layout": [2], "transport": "shm"}, '
                       '"network": {"links": {"intra": {"alpha": -1, "beta": 1e-9}, "inter": {"alpha": 1, "beta": 1}},'
                       ' "gamma": 0}}', ">= 0"),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_corrupt_profiles_name_the_file(tmp_path, name):
    text, match = BAD_FILES[name]
    path = tmp_path / "bad.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError, match=match) as err:
        Profile.load(str(path))
    assert str(path) in str(err.value)


@pytest.mark.parametrize("value,expected", [("", "load"), ("auto", "auto"), ("OFF", "off"), (" load ", "load")])
def test_tune_option_from_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv("RINGLET_TUNE", value)
    monkeypatch.setenv("RINGLET_PROFILE", "/some/where.json")
    opts = Options.from_env()
    assert opts.tune == expected and opts.profile == "/some/where.json"


@pytest.mark.parametrize("value", ["yes", "always", "1"])
def test_bad_tune_option(monkeypatch, value):
    monkeypatch.setenv("RINGLET_TUNE", value)
    with pytest.raises(ValueError, match="tune must be one of"):
        Options.from_env()
    with pytest.raises(ValueError, match="tune must be one of"):
        Options(tune=value)


# ---- attach, as ringlet.init runs it ------------------------------------------------------------------
def attach_all(p: int, **opts) -> list:
    """``autoload.attach`` on every rank of an in-process world of ``p`` (one host); per rank:
    ``(network_model, profile)``."""
    def body(rank):
        rt = runtime()
        autoload.attach(rt, Prober(rt))
        return rt.network_model, rt.profile

    return run_world(p, body, options=Options(timeout=20, **opts))


@pytest.mark.parametrize("p", [1, 2, 3])
def test_attach_loads_the_matching_cached_profile(cache, p):
    prof = profile_of(p, (p,))
    prof.save(cache_path(prof.fingerprint))
    got = attach_all(p)
    for model, loaded in got:
        network, topology = model
        assert network == NET and topology.host_of == (0,) * p and loaded == prof


def test_attach_tries_only_the_segments_the_transport_runs(cache):
    from ringlet.tuning.model import SEGMENTS, segments_up_to

    prof = profile_of(2, (2,))
    prof.save(cache_path(prof.fingerprint))

    def body(rank):
        rt = runtime()
        rt.transport.capabilities = dataclasses.replace(rt.transport.capabilities, max_segment_bytes=1 << 20)  # MPI's
        autoload.attach(rt, Prober(rt))
        return rt.selector.model.segments

    got = run_world(2, body, options=Options(timeout=20))
    assert got == [segments_up_to(1 << 20)] * 2
    assert got[0][0] == 1 << 20 and max(got[0]) == 1 << 20 and None not in got[0]
    assert segments_up_to(None) == SEGMENTS


@pytest.mark.parametrize("p", [2, 3])
def test_attach_loads_an_explicit_profile(tmp_path, cache, p):
    path = tmp_path / "mine.json"
    profile_of(p, (p,)).save(str(path))
    got = attach_all(p, profile=str(path))
    assert all(model[0] == NET for model, _ in got)


def test_attach_without_a_profile_leaves_no_model(cache):
    assert attach_all(2) == [(None, None), (None, None)]


def test_attach_off_reads_nothing(cache):
    (cache).mkdir()
    (cache / f"{Fingerprint(2, (2,), 'inproc').key}.json").write_text("corrupt")
    assert attach_all(2, tune="off") == [(None, None), (None, None)]


@pytest.mark.parametrize("made_for", [(3, (3,), "inproc"), (2, (1, 1), "inproc"), (2, (2,), "torch")])
def test_attach_ignores_another_clusters_profile(tmp_path, cache, caplog, made_for):
    path = tmp_path / "other.json"
    profile_of(*made_for).save(str(path))
    with caplog.at_level(logging.WARNING, logger="ringlet.tuning"):
        got = attach_all(2, profile=str(path))
    assert got == [(None, None), (None, None)]
    assert "ignoring" in caplog.text and str(path) in caplog.text
    assert caplog.text.count("ignoring") == 1  # rank 0 says it once


@pytest.mark.parametrize("explicit", [False, True])
def test_attach_raises_the_same_error_on_every_rank_for_a_corrupt_file(tmp_path, cache, explicit):
    fp = Fingerprint(3, (3,), "inproc")
    path = tmp_path / "bad.json" if explicit else cache / f"{fp.key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"format": 1, "fingerprint": {"ranks": 3}}')
    errors = []

    def body(rank):
        try:
            autoload.attach(runtime(), Prober(runtime()))
        except ValueError as exc:
            errors.append(str(exc))
        return rank

    run_world(3, body, options=Options(timeout=20, profile=str(path) if explicit else ""))
    assert len(errors) == 3 and len(set(errors)) == 1
    assert str(path) in errors[0] and "bad fingerprint" in errors[0]


def test_attach_refuses_a_missing_explicit_profile(tmp_path, cache):
    missing = tmp_path / "nowhere.json"
    with pytest.raises(ValueError, match="cannot be read: FileNotFoundError"):
        attach_all(2, profile=str(missing))


@pytest.mark.parametrize("explicit", [False, True])
def test_attach_auto_calibrates_and_saves(tmp_path, cache, monkeypatch, explicit):
    from ringlet.tuning import calibrate as calib

    monkeypatch.setitem(calib.PLANS, "quick", calib.CalibrationPlan("quick", (4, 4096, 65536), (1, 2), 1,
                                                                      (4096, 65536), 2.0))
    target = tmp_path / "new.json"
    got = attach_all(2, tune="auto", profile=str(target) if explicit else "")
    assert got[0][0][0] == got[1][0][0] and got[0][1].info["plan"] == "quick"
    fp = Fingerprint(2, (2,), "inproc")
    saved = Profile.load(str(target) if explicit else cache_path(fp))
    assert saved.fingerprint == fp and saved.network == got[0][0][0]
    assert os.path.exists(cache_path(fp)) != explicit
    again = attach_all(2, tune="auto", profile=str(target) if explicit else "")  # now it loads
    assert again[0][1].info == saved.info
