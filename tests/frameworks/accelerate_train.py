"""Hugging Face Accelerate on CPU, written for torchrun:
``torchrun --nproc-per-node 2 accelerate_train.py`` (or ``accelerate launch``).

Rank 0 writes the result (final loss, a parameter checksum, world size, steps) to ``--out``.
"""

import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from common import dataset, write_result
from torch.utils.data import DataLoader

import nbdist


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
    # log_with: the dashboard's one line (a no-op under torchrun)
    accelerator = Accelerator(cpu=True, log_with=nbdist.AccelerateTracker())
    accelerator.init_trackers("accelerate_train")
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loader = DataLoader(dataset(), batch_size=args.batch_size, shuffle=True)
    model, opt, loader = accelerator.prepare(model, opt, loader)

    steps = 0
    for epoch in range(args.epochs):
        model.train()
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            steps += 1
            accelerator.log({"loss": loss.detach()}, step=steps)
        accelerator.print(f"epoch {epoch} loss {loss.item():.6f}")

    final = accelerator.reduce(loss.detach(), reduction="mean")
    if accelerator.is_main_process:
        write_result(args.out, final.item(), model, accelerator.num_processes, steps)
    accelerator.end_training()


if __name__ == "__main__":
    main()
