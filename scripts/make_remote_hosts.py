"""Writes notebooks/remote_hosts.ipynb (kept as code so the notebook's source is reviewable)."""

import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
cells = [
    md(
        "# nbdist on remote hosts: engines over SSH, with GPU placement\n\n"
        "The notebook stays here; the engines (one rank each) start on hosts this machine reaches "
        "over SSH, through ipyparallel's SSH launcher, and train with DDP across them. Each host "
        "needs:\n\n"
        "- the same Python environment as the others, with `nbdist`, `torch` and `ipyparallel` "
        "installed (nbdist checks, and shows the versions of every host in one table);\n"
        "- SSH login with a key, no password (`ssh-copy-id user@host`), and its host key "
        "accepted once (`ssh user@host`);\n"
        "- a route back to this machine: the controller listens on the one address the hosts "
        "reach, never on every interface unless you ask (`--ip '*'`)."
    ),
    md(
        "## The configuration for real GPU hosts\n\n"
        "A cluster file names the hosts, their engines, the Python to run there, SSH options and "
        "the network interface the ranks talk over. Reading it connects nowhere, so mistakes "
        "show at once:"
    ),
    code(
        "from pathlib import Path\n"
        "from nbdist.notebook.cluster.hosts import cluster_config\n\n"
        "Path('gpu-cluster.toml').write_text('''\\\n"
        "# Two GPU hosts, one engine per GPU: ranks 0-3 on gpu1, 4-7 on gpu2.\n"
        'python = "/opt/conda/envs/train/bin/python"   # the same environment on every host\n'
        'interface = "ib0"                             # ranks talk over InfiniBand\n'
        'ssh_options = ["-i", "~/.ssh/id_ed25519"]\n\n'
        "[[hosts]]\n"
        'host = "gpu1.example.org"\n'
        'user = "alice"\n'
        "engines = 4\n\n"
        "[[hosts]]\n"
        'host = "gpu2.example.org"\n'
        'user = "alice"\n'
        "engines = 4\n"
        'environment = { NCCL_DEBUG = "WARN" }\n'
        "''')\n"
        "cfg = cluster_config(cluster_file='gpu-cluster.toml')\n"
        "for h in cfg.remote.hosts:\n"
        "    print(f'{h.location}: {h.engines} engines, {h.python}, interface {h.interface}')\n"
        "print(f'{cfg.n} ranks in all')"
    ),
    md(
        "With it, `%nbdist start --cluster-file gpu-cluster.toml` starts 8 engines; "
        "`%nbdist start --hosts alice@gpu1.example.org:4,alice@gpu2.example.org:4` does the same "
        "without a file when ssh's defaults (and `~/.ssh/config`) suffice. On those hosts every "
        "rank has a GPU of its own, so ranks train on `cuda:LOCAL_RANK` with NCCL, and "
        "`%nbdist status` shows each rank's GPU and its memory. More engines than GPUs on a host "
        "is refused (or, with `--allow-mixed`, runs on CPU with gloo, with a warning). "
        "`MASTER_ADDR` is rank 0's address on `ib0`, as the other host reaches it.\n\n"
        "On a cluster with a scheduler, ipyparallel's launchers start the engines, with their "
        "options passed through:\n\n"
        "```\n"
        "%nbdist start -n 8 --launcher slurm --launcher-opt account=ml "
        "--launcher-opt timelimit=1:00:00 --ip 10.0.0.5\n"
        "```"
    ),
    md(
        "## The same, against this machine over SSH\n\n"
        "To run this part yourself: have sshd running here, your key in "
        "`~/.ssh/authorized_keys`, and write `localhost.toml`:\n\n"
        "```toml\n"
        'python = "/path/to/this/environment/bin/python"   # sys.executable\n\n'
        "[[hosts]]\n"
        'host = "127.0.0.1"\n'
        "engines = 2\n"
        "```\n\n"
        "(The tests run this notebook with a cluster file of their own, for an sshd they start.)"
    ),
    code(
        "import os\n"
        "demo = os.environ.get('NBDIST_DEMO_CLUSTER', 'localhost.toml')\n"
        "print(Path(demo).read_text())"
    ),
    code("%load_ext nbdist\n%nbdist start --cluster-file {demo}"),
    code("%nbdist status"),
    md("Where each rank runs, as torchrun would tell it:"),
    code(
        "%%distributed --all-output\n"
        "import os, socket\n"
        "print(f\"rank {nbdist.rank()} on {os.environ.get('NBDIST_HOST')}: device \"\n"
        "      f\"{nbdist.device()}, LOCAL_RANK {os.environ['LOCAL_RANK']}, \"\n"
        "      f\"MASTER_ADDR {os.environ['MASTER_ADDR']}\")"
    ),
    md("Train across the hosts; every rank ends with the same parameters:"),
    code(
        "%%distributed\n"
        "import torch\n"
        "torch.manual_seed(0)\n"
        "model = nbdist.prepare(torch.nn.Linear(8, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.05)\n"
        "g = torch.Generator().manual_seed(nbdist.rank())   # each rank its own data\n"
        "X = torch.randn(256, 8, generator=g)\n"
        "y = X @ torch.arange(1.0, 9.0).unsqueeze(1)\n"
        "losses = []\n"
        "for step in range(60):\n"
        "    opt.zero_grad()\n"
        "    loss = torch.nn.functional.mse_loss(model(X), y)\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    losses.append(loss.item())\n"
        "flat = torch.cat([p.detach().flatten() for p in model.parameters()])\n"
        "everyone = [torch.zeros_like(flat) for _ in range(nbdist.world_size())]\n"
        "torch.distributed.all_gather(everyone, flat)\n"
        "hosts = [None] * nbdist.world_size()\n"
        "torch.distributed.all_gather_object(hosts, os.environ.get('NBDIST_HOST'))\n"
        "{'identical_parameters': all(torch.equal(everyone[0], t) for t in everyone),\n"
        " 'hosts': hosts, 'first_loss': round(losses[0], 3), 'final_loss': round(losses[-1], 5)}"
    ),
    code("%nbdist stop"),
]
nb = nbf.v4.new_notebook(cells=cells)
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, "notebooks/remote_hosts.ipynb")
