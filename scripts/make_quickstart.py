"""Writes notebooks/quickstart.ipynb (kept as code so the notebook's source is reviewable)."""

import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
cells = [
    md(
        "# nbdist quickstart: DDP on two CPU engines\n\n"
        "Train a small network on scikit-learn's digits (it ships with scikit-learn: nothing to "
        "download) with synchronous data-parallel training across two engines on this machine."
    ),
    code("%load_ext nbdist\n%nbdist start -n 2"),
    code("%nbdist status"),
    md(
        "Every rank loads the data and keeps its own shard of the training set. "
        "Names defined in a `%%distributed` cell stay on the engines for the next cell."
    ),
    code(
        "%%distributed\n"
        "import torch\n"
        "from sklearn.datasets import load_digits\n"
        "from sklearn.model_selection import train_test_split\n\n"
        "X, y = load_digits(return_X_y=True)\n"
        "X = torch.tensor(X / 16.0, dtype=torch.float32)\n"
        "y = torch.tensor(y)\n"
        "X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)\n"  # noqa: E501
        "# this rank's shard: every world_size-th sample, starting at its rank\n"
        "X_mine = X_train[nbdist.rank()::nbdist.world_size()]\n"
        "y_mine = y_train[nbdist.rank()::nbdist.world_size()]\n"
        "print(f'rank {nbdist.rank()} of {nbdist.world_size()}: {len(X_mine)} training samples')"
    ),
    code(
        "%%distributed\n"
        "torch.manual_seed(0)\n"
        "model = nbdist.prepare(torch.nn.Sequential(\n"
        "    torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)))\n"
        "opt = torch.optim.Adam(model.parameters(), lr=1e-2)\n"
        "loss_fn = torch.nn.CrossEntropyLoss()\n"
        "g = torch.Generator().manual_seed(nbdist.rank())\n"
        "for epoch in range(20):\n"
        "    order = torch.randperm(len(X_mine), generator=g)\n"
        "    for i in range(0, len(order) - 31, 32):  # same number of batches on both ranks\n"
        "        idx = order[i:i + 32]\n"
        "        opt.zero_grad()\n"
        "        loss = loss_fn(model(X_mine[idx]), y_mine[idx])\n"
        "        loss.backward()  # gradients are averaged across ranks here\n"
        "        opt.step()\n"
        "    if epoch % 5 == 4:\n"
        "        print(f'epoch {epoch + 1}: loss {loss.item():.4f}')"
    ),
    md(
        "Every rank holds the same parameters after synchronous training; check it, "
        "then measure test accuracy."
    ),
    code(
        "%%distributed\n"
        "flat = torch.cat([p.detach().flatten() for p in model.parameters()])\n"
        "copies = [torch.empty_like(flat) for _ in range(nbdist.world_size())]\n"
        "torch.distributed.all_gather(copies, flat)\n"
        "identical = all(torch.equal(copies[0], c) for c in copies)\n"
        "with torch.no_grad():\n"
        "    accuracy = (model(X_test).argmax(1) == y_test).float().mean().item()\n"
        "{'identical_parameters': identical, 'test_accuracy': round(accuracy, 4)}"
    ),
    md("Bring the trained weights into the notebook."),
    code(
        "%nbdist pull model\n"
        "print(type(model).__name__, {k: tuple(v.shape) for k, v in model.state_dict().items()})"
    ),
    code("%nbdist stop"),
]
nb = nbf.v4.new_notebook(cells=cells)
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, "notebooks/quickstart.ipynb")
