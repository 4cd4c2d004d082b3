"""The priority arms and the deep model of benchmarks/training_ddp/paired_ddp.py (argument parsing only; the paired
measurement itself runs on the emulated cluster)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from ringlet.torch.training import Priority

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "training_ddp" / "paired_ddp.py"


@pytest.fixture(scope="module")
def paired():
    spec = importlib.util.spec_from_file_location("paired_ddp", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("spec, partition, overlap, rest", [
    ("ringlet:priority", Priority().partition_bytes, True, {}),
    ("ringlet:priority:partition=1M", 1 << 20, True, {}),
    ("ringlet:priority,partition=65536,overlap=false", 65536, False, {}),
    ("ringlet:priority:partition=512K,sufficient_factors=false", 512 << 10, True, {"sufficient_factors": False}),
])
def test_priority_arms(paired, spec, partition, overlap, rest):
    kind, opts = paired.parse_arm(spec)
    assert kind == "ringlet"
    assert opts.pop("priority") == Priority(partition) and opts.pop("overlap") is overlap
    assert opts == rest


def test_other_ringlet_arms_are_unchanged(paired):
    assert paired.parse_arm("ringlet:bucket_cap_mb=1") == ("ringlet", {"bucket_cap_mb": 1})
    with pytest.raises(SystemExit):
        paired.parse_arm("fifo")


def test_the_deep_model_has_24_layers(paired):
    net = paired.MODELS["deep"]()
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 24 and net(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert sum(p.numel() for p in net.parameters()) == 3072 * 512 + 512 + 22 * (512 * 512 + 512) + 512 * 10 + 10
