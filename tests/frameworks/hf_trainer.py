"""A tiny BERT trained by ``transformers.Trainer`` on CPU, written for torchrun:
``torchrun --nproc-per-node 2 hf_trainer.py``.

Rank 0 writes the result (final loss, a parameter checksum, world size, steps) to ``--out``.
"""

import argparse
import tempfile

import torch
from common import write_result
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
    set_seed,
)

import nbdist


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--output-dir", default=None)
    p.add_argument("--out", default=None, help="rank 0 writes the result here (JSON)")
    return p.parse_args()


class Sentences(torch.utils.data.Dataset):
    """Random token sequences; the label is whether token 7 occurs in the first half."""

    def __init__(self, n=128, length=16, vocab=64):
        g = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(1, vocab, (n, length), generator=g)
        self.labels = (self.ids[:, : length // 2] == 7).any(dim=1).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.labels[i]}


def main():
    args = parse_args()
    torch.set_num_threads(1)  # the same arithmetic under any launcher
    set_seed(0)
    config = BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    training_args = TrainingArguments(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="hf_trainer-"),
        use_cpu=True,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
        report_to=[],
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3,
        save_strategy="no",
        logging_steps=5,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=Sentences(),
        callbacks=[nbdist.HuggingFaceCallback()],  # the dashboard; a no-op under torchrun
    )
    output = trainer.train()

    if trainer.is_world_process_zero():
        world = training_args.world_size
        write_result(args.out, output.training_loss, model, world, output.global_step)


if __name__ == "__main__":
    main()
