"""Writes notebooks/quickstart.ipynb (kept as code so the notebook's source is reviewable)."""

import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
cells = [
    md(
        "# nbdist quickstart: DDP on two CPU engines\n\n"
        "Train a small network on scikit-learn's digits (it ships with scikit-learn: nothing to "
        "download) with synchronous data-parallel training on two engines on this machine: "
        "send the data, train with a live dashboard and checkpoints, bring the model back."
    ),
    md("Start two local engines, one rank each, with their process group ready."),
    code("%load_ext nbdist\n%nbdist start -n 2"),
    md("The data lives in the notebook: load it and keep a quarter aside for testing."),
    code(
        "import nbdist\n"
        "from sklearn.datasets import load_digits\n"
        "from sklearn.model_selection import train_test_split\n\n"
        "X, y = load_digits(return_X_y=True)\n"
        "X = (X / 16).astype('float32')\n"
        "X_train, X_test, y_train, y_test = train_test_split(\n"
        "    X, y, test_size=0.25, random_state=0, stratify=y)"
    ),
    md(
        "Send each rank a shard of the training set, stratified: the report shows that every "
        "shard keeps the label balance. The test set goes in order, half to each rank."
    ),
    code(
        'nbdist.scatter("train", (X_train, y_train), stratify=y_train)\n'
        'nbdist.scatter("test", (X_test, y_test), shuffle=False);'
    ),
    md(
        "Define the model on the engines: `nbdist.prepare` wraps it in DDP. "
        "Names defined in a `%%distributed` cell stay on the engines for the next cell."
    ),
    code(
        "%%distributed\n"
        "import torch\n"
        "torch.manual_seed(0)\n"
        "model = nbdist.prepare(torch.nn.Sequential(\n"
        "    torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)))\n"
        "opt = torch.optim.Adam(model.parameters(), lr=1e-2)"
    ),
    md(
        "Train: `nbdist.loader` gives every rank as many batches, `nbdist.report` draws the "
        "live dashboard under the cell, and a checkpoint is written every 100 steps. If a "
        "worker dies, nbdist replaces it (`--restarts 1`) and `restore` resumes from the "
        "latest checkpoint."
    ),
    code(
        "%%distributed --name quickstart --restarts 1\n"
        'batches = nbdist.loader("train", batch_size=32)\n'
        "epochs = 20\n"
        "total = epochs * len(batches)\n"
        "start = nbdist.restore(model=model, opt=opt)  # the step to continue from: 0 when fresh\n"
        "for epoch in range(start // len(batches), epochs):\n"
        "    batches.set_epoch(epoch)  # each epoch's shuffle, the same after a resume\n"
        "    for i, (xb, yb) in enumerate(batches):\n"
        "        step = epoch * len(batches) + i\n"
        "        if step < start:\n"
        "            continue  # done before the restart\n"
        "        opt.zero_grad()\n"
        "        loss = torch.nn.functional.cross_entropy(model(xb), yb)\n"
        "        loss.backward()  # gradients are averaged across ranks here\n"
        "        opt.step()\n"
        "        nbdist.report(step=step, loss=loss, samples=len(xb), total=total)\n"
        "        nbdist.checkpoint(step, every=100, model=model, opt=opt)\n"
        "print(f'{total} steps, last loss {loss.item():.4f}')"
    ),
    md(
        "Synchronous training leaves the same parameters on every rank: check it, then measure "
        "test accuracy, each rank on its half of the test set."
    ),
    code(
        "%%distributed\n"
        "flat = torch.cat([p.detach().flatten() for p in model.parameters()])\n"
        "copies = [torch.empty_like(flat) for _ in range(nbdist.world_size())]\n"
        "torch.distributed.all_gather(copies, flat)\n"
        "X_mine, y_mine = (torch.as_tensor(a) for a in test)\n"
        "with torch.no_grad():\n"
        "    right = (model(X_mine).argmax(1) == y_mine).sum()\n"
        "counts = torch.stack([right, torch.tensor(len(y_mine))])\n"
        "torch.distributed.all_reduce(counts)  # right answers and samples, summed over ranks\n"
        "{'identical_parameters': all(torch.equal(copies[0], c) for c in copies),\n"
        " 'test_accuracy': round((counts[0] / counts[1]).item(), 4)}"
    ),
    md("Bring the trained model into the notebook (DDP's inner module) and use it here."),
    code(
        "%nbdist pull model\n"
        "import torch\n"
        "with torch.no_grad():\n"
        "    predicted = model(torch.from_numpy(X_test)).argmax(1).numpy()\n"
        "print(f'test accuracy of the pulled model: {(predicted == y_test).mean():.4f}')"
    ),
    md("Every run is kept, with its name, metrics and events (the checkpoints among them)."),
    code(
        "runs = nbdist.runs()\n"
        "print(runs)\n"
        "run = next(r for r in runs if r['name'] == 'quickstart')\n"
        "print(f\"run {run.id} {run['name']!r}: {run['status']}, {len(run.metrics())} metric rows\")\n"  # noqa: E501
        "print(*(e['message'] for e in run.events() if e['kind'] == 'checkpoint'), sep='\\n')"
    ),
    md("Stop the engines and the controller: nothing is left running."),
    code("%nbdist stop"),
]
nb = nbf.v4.new_notebook(cells=cells)
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, "notebooks/quickstart.ipynb")
