"""The dataset the digits examples share: scikit-learn's ``load_digits`` (1797 8x8 images, shipped inside
the package, no download), split the same way on every rank. Imported as a sibling module: the examples
run as ``python examples/<name>.py``, which puts this directory on ``sys.path``."""
import os

import torch
from sklearn.datasets import load_digits
from torch.utils.data import TensorDataset


def digits(test_fraction=0.2, seed=0):
    """(train, test) datasets of 8x8 images scaled to [0, 1]; the split is the same on every rank."""
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    y = torch.tensor(y)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def configuration() -> str:
    """How this job synchronises gradients, for the first line of the output (``ringlet demo`` shows it):
    ringlet's transport and all-reduce algorithm, or torch.distributed's backend when ringlet is not in use."""
    import ringlet

    if ringlet.is_initialized():
        transport = ringlet.collectives.runtime().transport.name
        algorithm = os.environ.get("RINGLET_ALGORITHM", "auto")
        return f"ringlet over the {transport} transport, all-reduce algorithm {algorithm}"
    import torch.distributed as dist

    return f"torch.distributed over {dist.get_backend()}"
