"""``ringlet diagnose``'s verdicts on synthetic flight records, one per kind, and the command itself."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ringlet.cli.diagnose import diagnose_cli
from ringlet.diagnose import analyse, load


def rec(seq, kind="allreduce", shape=(4,), dtype="float32", state="done", site="/x/train.py:12", group=0,
        ranks=(0, 1, 2), error="", error_type="", peer=None):
    return {"group": group, "ranks": list(ranks), "seq": seq, "kind": kind, "name": "", "shape": list(shape),
            "dtype": dtype, "algorithm": "", "bytes": 16, "site": site, "state": state, "error": error,
            "error_type": error_type, "peer": peer, "t_enqueue": 100.0 + seq, "t_start": 100.0 + seq,
            "t_end": None if state == "running" else 100.5 + seq, "m_enqueue": 1.0, "m_start": 1.0, "m_end": 2.0}


def dump(rank, records, size=3, reason="shutdown", failure=None):
    return {"version": 1, "rank": rank, "world_size": size, "hostname": f"h{rank}", "pid": 1, "time": 200.0,
            "reason": reason, "failure": failure, "capacity": 2000, "records": records}


def three(*per_rank, **kw):
    return {r: dump(r, recs, **kw) for r, recs in enumerate(per_rank)}


def test_fewer_calls():
    fail = dict(state="failed", error="peer rank 2 closed its transport", error_type="PeerError")
    dumps = three([rec(1), rec(2), rec(3, **fail)], [rec(1), rec(2), rec(3, **fail)], [rec(1), rec(2)])
    v = analyse(dumps)
    assert v.kind == "fewer"
    assert v.sentence == ("rank 2 made 2 all-reduces on the world group where ranks 0 and 1 made 3; "
                          "ranks 0 and 1 failed in the third (shape [4], float32, train.py:12)")
    assert len(v.table) == 4 and "PeerError" not in v.table[3]


def test_fewer_calls_in_incomplete_records_counts_sequence_numbers():
    dumps = three([rec(8), rec(9, state="running")], [rec(8), rec(9, state="running")], [rec(8)])
    dumps[2]["complete"] = False
    assert analyse(dumps).sentence == ("rank 2 stopped at seq 8 on the world group where ranks 0 and 1 reached "
                                       "seq 9; ranks 0 and 1 wait in seq 9, an all-reduce (shape [4], float32, "
                                       "train.py:12)")


def test_fewer_calls_while_waiting():
    dumps = three([rec(1), rec(2, state="running")], [rec(1), rec(2, state="running")], [rec(1)])
    assert analyse(dumps).sentence == ("rank 2 made 1 all-reduce on the world group where ranks 0 and 1 made 2; "
                                       "ranks 0 and 1 wait in the second (shape [4], float32, train.py:12)")


def test_different_ops_at_one_seq():
    dumps = three([rec(6), rec(7, state="running")], [rec(6), rec(7, kind="broadcast", state="running")],
                  [rec(6), rec(7, state="running")])
    v = analyse(dumps)
    assert v.kind == "kind"
    assert v.sentence.startswith("rank 1 is in a broadcast (")
    assert "where ranks 0 and 2 are in an all-reduce (" in v.sentence and v.sentence.endswith("world group seq 7")


@pytest.mark.parametrize("change, words", [({"shape": (5,)}, "shape [5]"), ({"dtype": "float16"}, "shape [4], float16")])
def test_shape_or_dtype_mismatch(change, words):
    dumps = three([rec(1), rec(2)], [rec(1), rec(2, **change)], [rec(1), rec(2)])
    v = analyse(dumps)
    assert v.kind == "shape"
    assert v.sentence.startswith(f"rank 1 called an all-reduce with {words}")
    assert "where ranks 0 and 2 used shape [4], float32" in v.sentence and v.sentence.endswith("seq 2")


def test_ragged_allgather_is_not_a_mismatch():
    dumps = three(*[[rec(1, kind="allgather", shape=(r + 1, 2))] for r in range(3)])
    assert analyse(dumps).kind == "consistent"


def test_missing_rank():
    fail = dict(state="failed", error="peer rank 2 closed its transport", error_type="PeerError")
    dumps = three([rec(1), rec(2, **fail)], [rec(1), rec(2, **fail)])
    v = analyse(dumps)
    assert v.kind == "missing"
    assert v.sentence.startswith("rank 2 left no flight record")
    assert "ranks 0 and 1 failed in an all-reduce on the world group seq 2 (shape [4]" in v.sentence


def test_peer_named_in_a_failure():
    fail = dict(state="failed", error="rank 2 fell silent", error_type="PeerError", peer=2)
    dumps = three([rec(1), rec(2, **fail)], [rec(1), rec(2, **fail)], [rec(1), rec(2, **fail)])
    v = analyse(dumps)
    assert v.kind == "peer" and "with PeerError naming rank 2" in v.sentence


def test_peer_named_in_the_error_text_only():
    fail = dict(state="failed", error="rank 0: peer rank 2 closed its transport", error_type="PeerError")
    dumps = three([rec(1), rec(2, **fail)], [rec(1)], [rec(1), rec(2)])
    dumps[1]["records"][-1] = rec(2, **dict(fail, error="rank 1: peer rank 2 closed its transport"))
    v = analyse(dumps)
    assert v.kind == "peer" and v.sentence.startswith("ranks 0 and 1 failed in an all-reduce on the world group "
                                                      "seq 2 (shape [4], float32, train.py:12) with PeerError "
                                                      "naming rank 2")


def test_consistent():
    dumps = three([rec(1), rec(2)], [rec(1), rec(2)], [rec(1), rec(2)])
    v = analyse(dumps)
    assert v.sentence == "no mismatch found: every rank completed seq 2 on every group"


def test_cli(tmp_path):
    for r, d in three([rec(1), rec(2, state="running")], [rec(1), rec(2, state="running")], [rec(1)]).items():
        (tmp_path / f"rank-{r}.json").write_text(json.dumps(d))
    res = CliRunner().invoke(diagnose_cli, [str(tmp_path)])
    assert res.exit_code == 1 and res.output.startswith("rank 2 made 1 all-reduce")
    res = CliRunner().invoke(diagnose_cli, [str(tmp_path), "--json"])
    assert json.loads(res.output)["kind"] == "fewer"
    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(diagnose_cli, [str(empty)])
    assert res.exit_code == 2 and "no flight records" in res.output
    with pytest.raises(ValueError, match="not a directory"):
        load(str(tmp_path / "nope"))
