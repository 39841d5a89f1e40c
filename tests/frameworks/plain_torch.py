"""Plain PyTorch DDP, written for torchrun: ``torchrun --nproc-per-node 2 plain_torch.py``.

Rank 0 writes the result (final loss, a parameter checksum, world size, steps) to ``--out``.
"""

import argparse

import torch
import torch.distributed as dist
from common import dataset, write_result
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--out", default=None, help="rank 0 writes the result here (JSON)")
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(1)  # the same arithmetic under any launcher
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    data = dataset()
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    steps = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.6f}", flush=True)

    final = loss.detach().clone()
    dist.all_reduce(final)
    if rank == 0:
        write_result(args.out, final.item() / world, model, world, steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
