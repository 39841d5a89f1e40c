"""Lightning DDP (or FSDP) on CPU, written for torchrun, with nbdist's dashboard line:
``torchrun --nproc-per-node 2 lightning_ddp.py [--strategy fsdp]``.

Rank 0 writes the result (final loss, a parameter checksum, world size, steps) to ``--out``.
"""

import argparse
import tempfile

import lightning as L
import torch
from common import dataset, write_result
from torch.utils.data import DataLoader

import nbdist


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp")
    p.add_argument("--max-steps", type=int, default=12)
    p.add_argument("--max-epochs", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--print-every", type=int, default=0, help="rank 0 prints every N steps")
    p.add_argument("--root-dir", default=None)
    p.add_argument("--out", default=None, help="rank 0 writes the result here (JSON)")
    return p.parse_args()


class Regressor(L.LightningModule):
    def __init__(self, features=8, lr=0.05):
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Sequential(
            torch.nn.Linear(features, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class PrintProgress(L.Callback):
    def __init__(self, every):
        self.every = every

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.is_global_zero and trainer.global_step % self.every == 0:
            print(f"training step {trainer.global_step}", flush=True)


def main():
    args = parse_args()
    torch.set_num_threads(1)  # the same arithmetic under any launcher
    L.seed_everything(0, verbose=False)
    model = Regressor()
    loader = DataLoader(dataset(), batch_size=args.batch_size, shuffle=True)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        max_steps=args.max_steps,
        max_epochs=args.max_epochs,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        logger=nbdist.LightningLogger(),  # the dashboard's one line; a no-op under torchrun
        default_root_dir=args.root_dir or tempfile.gettempdir(),
        callbacks=[PrintProgress(args.print_every)] if args.print_every else [],
    )
    trainer.fit(model, loader)

    if trainer.is_global_zero:
        loss = trainer.callback_metrics["train_loss"].item()
        write_result(args.out, loss, model, trainer.world_size, trainer.global_step)


if __name__ == "__main__":
    main()
