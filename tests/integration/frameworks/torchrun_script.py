"""A training script written for torchrun, with nothing nbdist-specific in it.

Run it as ``torchrun --nproc-per-node 2 tests/integration/frameworks/torchrun_script.py``; the
tests also run its text, unchanged, in a ``%%distributed`` cell and compare what it prints.
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for _ in range(20):
        x = torch.randn(32, 8, generator=g)
        y = x.sum(dim=1, keepdim=True)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    total = torch.tensor([loss.item()])
    dist.all_reduce(total)
    checksum = sum(p.double().sum().item() for p in model.parameters())
    if rank == 0:
        print(
            f"RESULT world={world_size} mean_loss={total.item() / world_size:.6f} "
            f"checksum={checksum:.6f}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
