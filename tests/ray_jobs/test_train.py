"""Ray Train's TorchTrainer running ringlet's DDP: ``ringlet.init()`` in the training function adopts the
process group Ray Train made (either init method), and the digits example reaches ``ringlet run``'s accuracy."""
from __future__ import annotations

import pytest
from conftest import NO_RAY
from test_executor import EPOCHS, ringlet_run_accuracy

pytest.importorskip("ray", reason=NO_RAY)


@pytest.mark.parametrize("init_method", ["env", "tcp"])
def test_torch_trainer_runs_ringlet_ddp(ray_cluster, tmp_path, init_method):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray_digits import train_ddp

    trainer = TorchTrainer(train_ddp, train_loop_config={"epochs": EPOCHS},
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           torch_config=TorchConfig(init_method=init_method),
                           run_config=RunConfig(storage_path=str(tmp_path)))
    metrics = trainer.fit().metrics
    assert metrics["world"] == 2
    assert round(metrics["accuracy"], 4) == ringlet_run_accuracy("train_digits_ddp.py")  # it prints 4 digits
