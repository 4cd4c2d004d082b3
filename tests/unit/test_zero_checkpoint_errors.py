"""ZeRO checkpoints refuse what does not fit: incomplete or missing checkpoints, models that differ (the
error names the parameter or buffer), objects without the interface, ranks that cannot agree."""
import json
import shutil

import pytest
import torch
from zero_ckpt_models import Net, make, sharded
from zero_fake import RefZero

from ringlet.torch.training.zero import checkpoint as zckpt
from ringlet.torch.training.zero.checkpoint import CheckpointMismatch, IncompleteCheckpoint

from conftest import run_world


def save(p, path, **kw):
    def body(rank):
        net, zero = sharded(p, rank, **kw)
        zckpt.save(path, zero, net)
    run_world(p, body)


def save_one(path, **net_kw):
    net, zero = sharded(1, 0, **net_kw)
    zckpt.save(path, zero, net)


def load_one(path, **net_kw):
    net, zero = sharded(1, 0, seed=3, steps=0, **net_kw)
    return zckpt.load(path, zero, net)


def test_missing_and_incomplete_checkpoints_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_one(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(IncompleteCheckpoint, match="rank 0 has not finished"):
        load_one(tmp_path / "empty")
    save(3, tmp_path / "ck")
    (tmp_path / "ck" / "rank-00002.json").unlink()
    with pytest.raises(IncompleteCheckpoint, match="rank 2 of 3 has not finished"):
        load_one(tmp_path / "ck")
    with pytest.raises(IncompleteCheckpoint):
        zckpt.consolidate(tmp_path / "ck")


def test_truncated_data_file_is_refused(tmp_path):
    save(2, tmp_path / "ck")
    data = next((tmp_path / "ck").glob("rank-00001-*.pt"))
    data.write_bytes(data.read_bytes()[:-10])
    with pytest.raises(IncompleteCheckpoint, match="another size"):
        zckpt.consolidate(tmp_path / "ck")


def test_a_marker_of_another_save_makes_it_incomplete(tmp_path):
    """A save over an old checkpoint killed after rank 0 finished: rank 1's files are the old save's."""
    save(2, tmp_path / "ck", opt="sgd")
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "ck", old)
    save(2, tmp_path / "ck", opt="adam")
    for f in old.glob("rank-00001*"):
        shutil.copy(f, tmp_path / "ck" / f.name)
    with pytest.raises(IncompleteCheckpoint, match="rank 1's marker belongs to another save"):
        zckpt.consolidate(tmp_path / "ck")
    assert zckpt.latest(tmp_path) == old


def test_marker_of_another_format_version(tmp_path):
    save_one(tmp_path / "ck")
    marker = tmp_path / "ck" / "rank-00000.json"
    body = json.loads(marker.read_text())
    marker.write_text(json.dumps({**body, "version": 99}))
    with pytest.raises(IncompleteCheckpoint, match="version 99"):
        load_one(tmp_path / "ck")


@pytest.mark.parametrize("net_kw,match", [
    ({"extra": True}, "parameter 'x' of the model is missing"),
    ({"b_size": 8}, r"parameter 'b': shape \(8,\) in the model, \(7,\)"),
    ({"dtype": torch.float64}, "parameter '.*': dtype torch.float64 in the model, torch.float32 in"),
])
def test_mismatched_parameters_are_named(tmp_path, net_kw, match):
    save_one(tmp_path / "ck", steps=0)
    with pytest.raises(CheckpointMismatch, match=match):
        load_one(tmp_path / "ck", **net_kw)


def test_unexpected_parameter_is_named(tmp_path):
    save_one(tmp_path / "ck", steps=0, extra=True)
    with pytest.raises(CheckpointMismatch, match="unexpected parameter 'x'"):
        load_one(tmp_path / "ck")


def test_unexpected_and_missing_module_state_and_groups(tmp_path):
    save_one(tmp_path / "ck")
    net, zero = sharded(1, 0, steps=0)
    net.register_buffer("more", torch.zeros(2))
    with pytest.raises(CheckpointMismatch, match="module state 'more'.* missing"):
        zckpt.load(tmp_path / "ck", zero, net)
    net, zero = sharded(1, 0, steps=0)
    del net.running
    with pytest.raises(CheckpointMismatch, match="unexpected module state 'running'"):
        zckpt.load(tmp_path / "ck", zero, net)
    net, zero = sharded(1, 0, steps=0)
    net.running = torch.zeros(5)
    with pytest.raises(CheckpointMismatch, match=r"module state 'running': \(5,\)"):
        zckpt.load(tmp_path / "ck", zero, net)
    net = Net()
    one_group = RefZero(net, torch.optim.Adam(p for p in net.parameters() if p.requires_grad), 1, 0)
    with pytest.raises(CheckpointMismatch, match="parameter '.*': param group 0 in the model, 1 in"):
        zckpt.load(tmp_path / "ck", one_group, net)


def test_mismatch_in_a_resharded_load_names_the_parameter_on_every_rank(tmp_path):
    save(3, tmp_path / "ck")

    def body(rank):
        net, zero = sharded(2, rank, seed=3, steps=0, b_size=8)
        with pytest.raises(CheckpointMismatch, match="'b'"):
            zckpt.load(tmp_path / "ck", zero, net)
    run_world(2, body)


def test_fetch_refuses_unknown_names_and_ranges(tmp_path):
    save_one(tmp_path / "ck")
    from ringlet.torch.training.zero.checkpoint_fetch import Fetcher, Index, load_common
    from ringlet.torch.training.zero.checkpoint_files import Manifest

    manifest = Manifest.read(tmp_path / "ck")
    common = load_common(manifest)
    with Fetcher(manifest, Index(manifest, common), common) as fetch:
        with pytest.raises(CheckpointMismatch, match="'nope' is not in"):
            fetch("nope", 0, 1)
        with pytest.raises(CheckpointMismatch, match=r"elements \[0, 8\) of parameter 'b'"):
            fetch("b", 0, 8)
        master, state = fetch("b", 2, 2)
        assert master.shape == (0,) and state["exp_avg"].shape == (0,) and state["step"].dim() == 0
        assert fetch.groups[1]["lr"] == 3e-3 and fetch.extra == {"kind": "RefZero"}


def test_bad_objects_and_lonely_ranks(tmp_path):
    with pytest.raises(TypeError, match="lacks the ZeRO checkpoint interface"):
        zckpt.save(tmp_path / "ck", object())
    net, optimizer = make()
    zero = RefZero(net, optimizer, 2, 0)
    with pytest.raises(ValueError, match="ringlet is not initialised"):
        zckpt.save(tmp_path / "ck", zero, net)
    assert not (tmp_path / "ck").exists()
