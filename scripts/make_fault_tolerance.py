"""Writes notebooks/fault_tolerance.ipynb (kept as code so the notebook's source is reviewable)."""

import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
TRAIN = (
    "import time, torch\n"
    "torch.manual_seed(0)\n"
    "model = nbdist.prepare(torch.nn.Sequential(\n"
    "    torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.05)\n"
    "g = torch.Generator().manual_seed(nbdist.rank())     # each rank its own data\n"
    "start = nbdist.restore(model=model, opt=opt, g=g)    # 0 on a fresh run\n"
    "if start:\n"
    "    print(f'resumed at step {start}')\n"
    "for step in range(start, 80):\n"
    "    x = torch.randn(32, 16, generator=g)\n"
    "    opt.zero_grad()\n"
    "    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))\n"
    "    loss.backward()\n"
    "    opt.step()\n"
    "    nbdist.checkpoint(step, every=10, model=model, opt=opt, g=g)\n"
    "    nbdist.report(step=step, loss=loss, samples=32, total=80)\n"
    "    time.sleep(0.05)   # stands in for a real step's work\n"
    "params = [p.detach().clone() for p in model.parameters()]\n"
    "round(loss.item(), 6)"
)
cells = [
    md(
        "# Fault tolerance: a worker dies, training goes on\n\n"
        "A `%%distributed --restarts R` cell survives the loss of a worker: nbdist notices the "
        "death at once, stops the other ranks, starts a fresh engine for the lost rank, re-runs "
        "the earlier cells on every rank (so the new engine has their names), re-forms the "
        "process group and runs the cell again. `nbdist.restore()` then continues from the "
        "latest checkpoint, so at most `every` steps are computed twice, and the run ends with "
        "the parameters an uninterrupted run would have had."
    ),
    code("%load_ext nbdist\n%nbdist start -n 2"),
    md("First, an uninterrupted run, for reference."),
    code("%%distributed --no-dashboard\n" + TRAIN),
    code("%nbdist pull params --as reference"),
    md(
        "Now the same training, and after two seconds this notebook kills rank 1's engine with "
        "SIGKILL, as the out-of-memory killer would."
    ),
    code(
        "import os, signal, threading\n"
        "import nbdist\n"
        "victim = nbdist.current().slots[1].pid\n"
        "threading.Timer(2.0, os.kill, (victim, signal.SIGKILL)).start()\n"
        "print(f'rank 1 (pid {victim}) will be killed in 2 s')"
    ),
    code("%%distributed --restarts 2\n" + TRAIN),
    md(
        "The dashboard above shows the failure, the restart and the step the run resumed from. "
        "The run ends with the same parameters as the uninterrupted one:"
    ),
    code(
        "%nbdist pull params\n"
        "import torch\n"
        "print('rank 1 now runs in pid', nbdist.current().slots[1].pid)\n"
        "all(torch.allclose(a, b) for a, b in zip(params, reference))"
    ),
    code("%nbdist stop"),
]
nb = nbf.v4.new_notebook(cells=cells)
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, "notebooks/fault_tolerance.ipynb")
