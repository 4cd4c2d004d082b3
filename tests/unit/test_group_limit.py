"""Group ids travel in GROUP_BITS bits of every message tag: one group too many is a clear error, not
two collectives whose messages can be matched with each other (found by the fuzz)."""
import pytest
from conftest import run_world

import ringlet
from ringlet.runtime import MAX_GROUPS


def test_one_group_too_many_is_a_clear_error():
    def body(rank):
        for _ in range(MAX_GROUPS - 1):  # the world is group 0
            ringlet.new_group([0, 1])
        with pytest.raises(RuntimeError, match="groups per session"):
            ringlet.new_group([0, 1])
        return True

    assert run_world(2, body) == [True, True]
