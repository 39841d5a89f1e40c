"""``%nbdist`` and ``%%distributed``: parse, validate, hand over to the session, show the result.

Bad input never reaches a cluster: every mistake becomes one ``UsageError`` line that says what
to type instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import keyword
import os

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from ..config import CellOptions, cell_flags, positive
from ..errors import UsageError
from . import session
from .arguments import Parser, parse
from .housekeeping import gc as housekeeping
from .sweeps.spec import SweepSpec, parse_sweep


@functools.cache  # built once: a cell's parse is then the parse alone
def _nbdist_parser() -> Parser:
    p = Parser(prog="%nbdist", description="Start, inspect and stop the nbdist cluster.")
    sub = p.add_subparsers(dest="command", parser_class=Parser, required=True)
    s = sub.add_parser("start", help="start N engines with a ready process group")
    s.add_argument("-n", type=int, default=None, help="number of engines (ranks); default 2")
    s.add_argument("--threads", type=int, default=None, help="threads per engine")
    over = "allow more engines (4 per CPU) or threads (1 per CPU) than the CPUs can serve"
    s.add_argument("--oversubscribe", action="store_true", default=None, help=over)
    pin = "leave threads where the OS puts them (default: each CPU rank on its own cores)"
    s.add_argument("--no-pin", dest="pin_cores", action="store_false", default=None, help=pin)
    shm = "DDP on CPU all-reduces over gloo's TCP (default: through shared memory on one host)"
    s.add_argument("--no-shm", dest="shared_memory", action="store_false", default=None, help=shm)
    s.add_argument("--backend", choices=["gloo", "nccl"], default=None)
    # engines on other hosts (see notebook.cluster.hosts and notebook.cluster.engines.remote)
    s.add_argument("--hosts", default=None, help="engines over ssh: user@gpu1:4,user@gpu2:4")
    s.add_argument("--cluster-file", default=None, help="hosts and settings in a TOML file")
    s.add_argument("--launcher", choices=["ssh", "slurm", "mpi", "local"], default=None)
    s.add_argument(
        "--launcher-opt",
        action="append",
        type=_key_value,
        default=None,
        metavar="KEY=VALUE",
        help="an option of ipyparallel's launcher (repeatable)",
    )
    s.add_argument("--ip", default=None, help="controller address the hosts reach ('*': all)")
    # the scheduler's words (slurm; see nbdist.records.slurm)
    s.add_argument("--partition", default=None, help="slurm: the partition to run in")
    s.add_argument("--time", default=None, help="slurm: the job's time limit (30, 1:30:00)")
    s.add_argument(
        "--gpus-per-node", type=int, default=None, help="slurm: GPUs per node (--gpus-per-node)"
    )
    s.add_argument(
        "--start-timeout",
        type=float,
        default=None,
        help="seconds to wait for the engines (a queued job included); default 60",
    )
    s.add_argument(
        "--allow-mixed",
        action="store_true",
        default=None,
        help="ranks without a GPU beside ranks with one: gloo on CPU, warned",
    )
    s.add_argument(
        "--env-check",
        choices=["refuse", "warn"],
        default=None,
        help="when hosts differ in Python/torch/nbdist/CUDA (default: refuse)",
    )
    sub.add_parser("stop", help="stop every engine and the controller")
    at = sub.add_parser("attach", help="use a cluster started from the sidebar")
    at.add_argument("cluster_id", nargs="?", default=None, help="default: the newest one")
    sub.add_parser("status", help="show each rank: host, pid, device, GPU, state, mesh, stage")
    # housekeeping (see nbdist.notebook.housekeeping)
    g = sub.add_parser("gc", help="show what the retention rule frees of the data folder")
    g.add_argument("--yes", action="store_true", help="free it (without: only show it)")
    for keep, kind in (("checkpoints", int), ("runs", int), ("days", float), ("logs", int)):
        g.add_argument(f"--keep-{keep}", type=kind, default=None, metavar="N")
    sc = sub.add_parser("scatter", help="send one shard of a notebook array to each rank")
    sc.add_argument("name", help="notebook variable: an array, a tensor or a tuple of them")
    sc.add_argument("--stratify", default=None, metavar="LABELS", help="notebook labels variable")
    sc.add_argument("--labels", default=None, metavar="LABELS", help="labels, for the report only")
    sc.add_argument("--no-shuffle", dest="shuffle", action="store_false", help="keep row order")
    sc.add_argument("--seed", type=int, default=0)
    sc.add_argument("--remainder", choices=["drop", "pad", "uneven"], default="uneven")
    sc.add_argument("--as", dest="target", default=None, help="engine name (default: NAME)")
    run = sub.add_parser("run", help="run a script on every rank, as torchrun would")
    _add_cell_options(run)
    run.add_argument("file", help="the script; everything after it is its own command line")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    sub.add_parser("stacks", help="where every rank's threads are now, folded")
    db = sub.add_parser("debug", help="pdb on the rank that failed in the last cell")
    db.add_argument("--rank", type=int, default=None, help="default: the first to fail")
    pl = sub.add_parser("pull", help="bring an engine variable into the notebook")
    pl.add_argument("name")
    pl.add_argument("--rank", type=int, default=0)
    pl.add_argument("--trial", default=None, help="from the latest sweep's trial: ID or best")
    pl.add_argument("--as", dest="target", default=None, help="notebook name (default: NAME)")
    return p


@functools.cache
def _distributed_parser() -> Parser:
    p = Parser(prog="%%distributed", description="Run this cell on every rank at once.")
    _add_cell_options(p)
    # sweeps (see nbdist.notebook.sweeps.trials)
    p.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="NAME=VALUES",
        help="run once per value: lr=0.1,0.01 (a grid), or lr=1e-4..1e-1:log with --samples",
    )
    p.add_argument("--trial-size", type=positive, default=None, help="ranks per trial")
    p.add_argument("--samples", type=positive, default=None, help="draw N random trials")
    p.add_argument("--seed", type=int, default=0, help="seed of --samples' draws")
    p.add_argument(
        "--stop-early", default=None, metavar="RULE", help="median: stop hopeless trials"
    )
    return p


def _sweep_spec(args: argparse.Namespace) -> SweepSpec | None:
    """The sweep the options ask for, checked; None for a plain cell."""
    given = [o for o in ("trial_size", "samples", "stop_early") if getattr(args, o) is not None]
    if not args.sweep:
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise UsageError(f"{flag} belongs to a sweep: add --sweep NAME=VALUES")
        return None
    params = dict(parse_sweep(text) for text in args.sweep)
    if len(params) != len(args.sweep):
        raise UsageError("each name takes one --sweep: list all its values in it")
    return SweepSpec(
        params, args.trial_size or 1, args.samples, args.seed, args.stop_early, args.name
    )


def _add_cell_options(p: argparse.ArgumentParser) -> None:
    """The options of ``%%distributed``, which ``%nbdist run`` shares: ``config.CellOptions``'
    fields, as each declares its words."""
    for _, words, kw in cell_flags():
        p.add_argument(*words, **kw)


def _cell_options(args: argparse.Namespace) -> CellOptions:
    """The cell's options as the line gave them."""
    return CellOptions(**{name: getattr(args, name) for name, _, _ in cell_flags()})


def _explicit_profile(tokens: list[str]) -> list[str]:
    """``--profile`` followed by a word that is not a number of steps (``%nbdist run --profile
    train.py``) profiles the whole run: the word is not STEPS."""
    out = list(tokens)
    for i, t in enumerate(out[:-1]):
        if t == "--profile" and not out[i + 1].lstrip("-").isdigit():
            out[i] = "--profile=all"
    return out


def _key_value(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    return key.strip(), value


def _status_table(rows: list[dict]) -> str:
    cols = ["rank", "host", "pid", "device", "gpu", "state", "mesh", "stage", "replica"]
    for optional in ("gpu", "mesh", "stage", "replica"):  # none of them: no dashes
        if all(r.get(optional, "-") == "-" for r in rows):
            cols.remove(optional)
    widths = {c: max(len(c), *(len(str(r.get(c, "-"))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "-")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


@magics_class
class NbdistMagics(Magics):
    @line_magic
    def nbdist(self, line: str):
        """Control the cluster: ``%nbdist start -n N`` | ``attach [ID]`` | ``stop`` | ``status`` |
        ``run [OPTIONS] FILE [ARGS...]`` | ``pull NAME`` | ``scatter NAME`` |
        ``debug [--rank R]`` | ``stacks`` | ``gc [--yes]``."""
        args = parse(_nbdist_parser(), line, _explicit_profile)
        if args is None:
            return None
        if args.command == "start":
            c = session.start(
                n=args.n,
                threads_per_engine=args.threads,
                backend=args.backend,
                hosts=args.hosts,
                cluster_file=args.cluster_file,
                launcher=args.launcher,
                launcher_options=dict(args.launcher_opt) if args.launcher_opt else None,
                ip=args.ip,
                allow_mixed=args.allow_mixed,
                env_check=args.env_check,
                oversubscribe=args.oversubscribe,
                pin_cores=args.pin_cores,
                shared_memory=args.shared_memory,
                partition=args.partition,
                time=args.time,
                gpus_per_node=args.gpus_per_node,
                start_timeout=args.start_timeout,
            )
            print(
                f"nbdist: {len(c.slots)} ranks ready ({c.backend}, {c.cfg.threads} thread(s) "
                f"per engine) in {c.ready_seconds:.1f} s"
            )
        elif args.command == "attach":
            c = session.attach(args.cluster_id)
            print(f"nbdist: attached to {c.engines.cluster_id}, {len(c.slots)} ranks ({c.backend})")
        elif args.command == "stop":
            c = session.current(required=False)
            if c is None:
                print("nbdist: no cluster is running")
            elif not c.engines.owns_engines:
                c.stop()
                print("nbdist: detached; the cluster runs on (stop it from the nbdist sidebar)")
            else:
                c.stop()
                print("nbdist: cluster stopped")
        elif args.command == "status":
            c = session.current()
            job = getattr(c.engines, "job_line", None)  # a scheduler's job: its state, time left
            if job is not None and (text := job()):
                print(text)
            print(_status_table(c.status()))
            print(housekeeping.status_line())  # the data folder's size, what gc would free
        elif args.command == "gc":
            keep = {k: v for k, v in vars(args).items() if k.startswith("keep_")}
            housekeeping.command(args.yes, **keep)
        elif args.command == "scatter":
            from .data import scatter as data

            opts = {
                k: getattr(args, k)
                for k in ("target", "stratify", "labels", "shuffle", "seed", "remainder")
            }
            data.scatter_variable(self.shell.user_ns, args.name, **opts)
        elif args.command == "run":
            from .run import programs

            opts = _cell_options(args)  # bad options first, then the file, then the cluster
            if not opts.name:
                opts = dataclasses.replace(opts, name=os.path.basename(args.file))
            program = programs.load(args.file, args.args)
            programs.run_watched(session.current(), program, opts)
        elif args.command == "stacks":
            from .debug import stacks

            print(stacks.fold(stacks.between_cells(session.current())))
        elif args.command == "debug":
            from .debug import postmortem

            postmortem.debug(session.current(), args.rank)
        elif args.command == "pull":
            target = args.target
            if target is not None and (not target.isidentifier() or keyword.iskeyword(target)):
                raise UsageError(f"--as {target!r} is not a variable name: use letters, digits, _")
            if args.trial is not None:
                from .sweeps.trials import pull_trial

                value = pull_trial(args.name, args.trial)
            else:
                value = session.current().pull(args.name, rank=args.rank)
            self.shell.user_ns[target or args.name] = value
        return None

    @cell_magic
    def distributed(self, line: str, cell: str):
        """Run the cell on every rank at once; rank 0's last expression is the cell's value.

        Options: ``--timeout SECONDS``, ``--ranks 0,2``, ``--all-output``; telemetry:
        ``--no-dashboard``, ``--total N``, ``--tensorboard DIR``, ``--stop-on-nan``, ``--name``;
        trackers: ``--track mlflow|wandb|comet`` (see ``nbdist.notebook.trackers``);
        a sweep: ``--sweep NAME=VALUES`` (repeated), ``--trial-size K``, ``--samples N``,
        ``--seed S``, ``--stop-early median`` (see ``nbdist.notebook.sweeps.trials``).
        """
        args = parse(_distributed_parser(), line)
        if args is None:
            return None
        from .run import programs

        opts = _cell_options(args)
        spec = _sweep_spec(args)
        cluster = session.current()  # no cluster: that error first
        program = programs.cell(cell, self.shell.transform_cell)
        if spec is not None:
            from .sweeps.trials import run_sweep

            return run_sweep(program, spec, opts)
        return programs.run_watched(cluster, program, opts)
