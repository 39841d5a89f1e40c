"""A torchrun script that ends with ``sys.exit``: ``--code N`` on rank ``--rank R`` (every rank
when not given), after a collective; the others end normally.
"""

import argparse
import sys

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--code", type=int, default=0)
    p.add_argument("--rank", type=int, default=None)
    args = p.parse_args()
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    rank = dist.get_rank()
    print(f"rank {rank} sum {t.item()}", flush=True)
    dist.destroy_process_group()
    if args.rank is None or args.rank == rank:
        sys.exit(args.code)


if __name__ == "__main__":
    main()
