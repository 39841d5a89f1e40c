"""What the framework scripts share: their data and how rank 0 writes its result.

The scripts import it as ``from common import ...``: a script's own folder is first on
``sys.path``, under torchrun as with ``%nbdist run``.
"""

import json

import torch
from torch.utils.data import TensorDataset


def dataset(n: int = 256, features: int = 8) -> TensorDataset:
    """A fixed regression problem: the same rows under every launcher."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=g)
    y = (x @ torch.linspace(-1, 1, features)).unsqueeze(1) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def write_result(path: str | None, loss: float, model, world_size: int, steps: int) -> None:
    """Rank 0's result: final loss, a parameter checksum, world size and steps, as JSON."""
    if not path:
        return
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    result = {"loss": loss, "checksum": checksum, "world_size": world_size, "steps": steps}
    with open(path, "w") as f:
        json.dump(result, f)
