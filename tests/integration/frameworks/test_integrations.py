"""The framework adapters on a real 2-engine cluster: Lightning, Accelerate and the transformers
Trainer each train a tiny model on CPU with DDP, the adapter added in one line, and their
metrics reach the run store. Off the engines (here, in the test process) each does nothing."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from clusters import store_of, watched

from nbdist.config import CellOptions, TelemetryConfig
from nbdist.errors import UsageError
from nbdist.worker.integrations import numbers

# dashboards are built and updated (their widgets too), but there is no front end here
pytestmark = pytest.mark.usefixtures("no_front_end")

DATA = """
import torch
g = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(256, 8, generator=g),
                                      torch.randint(0, 2, (256,), generator=g))
"""

LIGHTNING = (
    DATA
    + """
import lightning as L
from nbdist.worker.integrations.lightning import LightningLogger

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)
    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        self.log("odd metric", float("nan"))  # left out, never breaks anything
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

trainer = L.Trainer(
    max_steps=6, log_every_n_steps=3, accelerator="cpu", devices=2, strategy="ddp",
    logger=LightningLogger(), default_root_dir={root!r}, enable_progress_bar=False,
    enable_model_summary=False, enable_checkpointing=False,
)
trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
trainer.global_step
"""
)

ACCELERATE = (
    DATA
    + """
from accelerate import Accelerator
from nbdist.worker.integrations.accelerate import AccelerateTracker

acc = Accelerator(cpu=True, log_with=AccelerateTracker(total=6, samples=8))
acc.init_trackers("tiny")
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt, loader = acc.prepare(model, opt, torch.utils.data.DataLoader(data, batch_size=8))
for step, (x, y) in zip(range(6), loader):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    acc.log({"train_loss": loss.detach(), "lr": 0.1, "note": "text", "bad": float("inf")}, step)
acc.end_training()
(acc.num_processes, type(model).__name__)
"""
)

TRANSFORMERS = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from nbdist.worker.integrations.transformers import HuggingFaceCallback

torch.manual_seed(0)
class Tokens(torch.utils.data.Dataset):
    x = torch.randint(0, 64, (64, 16))
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return {{"input_ids": self.x[i], "labels": self.x[i]}}

config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16,
                    bos_token_id=0, eos_token_id=0)
args = TrainingArguments(
    output_dir={root!r}, use_cpu=True, ddp_backend="gloo", report_to=[], max_steps=6,
    per_device_train_batch_size=4, logging_steps=2, save_strategy="no", disable_tqdm=True,
    ddp_find_unused_parameters=False,
)
trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Tokens(),
                  callbacks=[HuggingFaceCallback()])
trainer.train()
(trainer.state.global_step, args.world_size)
"""


def _train(cluster, source: str):
    """Run ``source`` on both ranks under a monitor: (rank 0's value, metric rows, collector)."""
    opts = CellOptions()
    mon = watched(cluster, source, opts, cfg=TelemetryConfig())
    value = cluster.run(source, opts, watch=mon)
    return value, store_of(mon).metrics(mon.run_id), mon.collector


def _rows(rows, rank, with_loss=None):
    return [
        r
        for r in rows
        if r["rank"] == rank and (with_loss is None or (r["loss"] is not None) == with_loss)
    ]


def test_lightning_logger_reports_every_batch_on_every_rank(cluster, tmp_path):
    value, rows, col = _train(cluster, LIGHTNING.format(root=str(tmp_path)))
    assert value == 6
    for rank in (0, 1):
        batches = _rows(rows, rank, with_loss=True)
        assert [r["step"] for r in batches] == list(range(6))  # every batch, from step 0
        assert all(r["samples"] == 8 and math.isfinite(r["loss"]) for r in batches)
        # what Lightning logged (every 3 steps) arrives too, at the same steps as the batches
        logged = {r["step"]: r["extra"] for r in _rows(rows, rank, with_loss=False)}
        assert sorted(logged) == [2, 5]
        loss_at = {r["step"]: r["loss"] for r in batches}
        for step, extra in logged.items():
            assert set(extra) == {"train_loss", "epoch"}  # the NaN metric left out
            assert extra["train_loss"] == pytest.approx(loss_at[step])
    assert col.total == 6 and col.done() == 6  # the ETA's total: estimated stepping batches


def test_accelerate_tracker_reports_from_the_main_process(cluster):
    value, rows, col = _train(cluster, ACCELERATE)
    assert value == (2, "DistributedDataParallel")
    main = _rows(rows, 0)
    assert [r["step"] for r in main] == list(range(6))
    assert all(math.isfinite(r["loss"]) and r["samples"] == 8 for r in main)
    assert all(r["extra"] == {"lr": 0.1} for r in main)  # text and inf left out
    assert _rows(rows, 1) == []  # Accelerate calls trackers on the main process only
    assert col.total == 6 and col.done() == 6


def test_transformers_callback_reports_steps_and_logs_on_every_rank(cluster, tmp_path):
    value, rows, col = _train(cluster, TRANSFORMERS.format(root=str(tmp_path)))
    assert value == (6, 2)
    for rank in (0, 1):
        steps = [r for r in _rows(rows, rank, with_loss=False) if r["samples"] is not None]
        assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
        assert all(r["samples"] == 4 for r in steps)
        logged = _rows(rows, rank, with_loss=True)
        assert [r["step"] for r in logged] == [2, 4, 6]
        assert all({"lr", "grad_norm", "epoch"} <= set(r["extra"]) for r in logged)
        final = [r for r in rows if r["rank"] == rank and "train_runtime" in r["extra"]]
        assert len(final) == 1 and final[0]["step"] == 6
    # the Trainer logs the loss averaged over ranks: both ranks report the same value
    assert [r["loss"] for r in _rows(rows, 0, True)] == [r["loss"] for r in _rows(rows, 1, True)]
    assert col.total == 6 and col.done() == 6


def test_adapters_do_nothing_off_the_engines(tmp_path):
    import lightning as L
    import torch
    from transformers import TrainerControl, TrainerState

    import nbdist
    from nbdist.worker.integrations.accelerate import AccelerateTracker
    from nbdist.worker.integrations.lightning import LightningLogger
    from nbdist.worker.integrations.transformers import HuggingFaceCallback

    with pytest.raises(UsageError):  # what the adapters guard against
        nbdist.report(step=1, loss=0.5)

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            loss = self.net(batch[0]).pow(2).mean()
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    logger = LightningLogger()
    trainer = L.Trainer(
        max_steps=2, log_every_n_steps=1, accelerator="cpu", devices=1, logger=logger,
        default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False,
    )  # fmt: skip
    data = torch.utils.data.TensorDataset(torch.randn(8, 4))
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
    assert trainer.global_step == 2 and logger.callback not in trainer.callbacks

    tracker = AccelerateTracker(total=3)
    tracker.store_init_configuration({"lr": 0.1})
    tracker.log({"loss": 1.0, "lr": 0.1}, step=0)

    callback = HuggingFaceCallback()
    args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=1)
    state = TrainerState(global_step=1, max_steps=3)
    callback.on_step_end(args, state, TrainerControl())
    callback.on_log(args, state, TrainerControl(), logs={"loss": 1.0, "learning_rate": 0.1})


def test_metrics_are_filtered_to_what_report_accepts():
    import torch

    got = numbers(
        {
            "lr": 0.1,
            "count": 3,
            "flag": True,
            "one": torch.tensor([2.0]),
            "many": torch.ones(3),
            "note": "text",
            "nan": float("nan"),
            "step": 4,
            "a metric": 1.0,
        },
        skip="count",
    )
    assert got == {"lr": 0.1, "flag": 1.0, "one": 2.0, "logged_step": 4.0, "a_metric": 1.0}
