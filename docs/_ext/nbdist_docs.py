"""What the tests produced, shown in the docs when it is there.

- The example notebooks (notebooks/*.ipynb) become docs/examples/*.ipynb at each build: as
  tests/integration/shipped/test_notebooks.py executed them (test-artifacts/notebooks/) when that
  copy exists and holds the committed notebook's cells, otherwise the committed notebook,
  unexecuted. A note under the title says which, and why.
- The guide's table of contents is a glob (``*`` in guide/index.md: a page added to docs/guide/
  is in it without more), put in reading order: the pages named in ``nbdist_guide_order``
  first, in that order, then the others by name.
- ``{screenshot} NAME.png`` with ``:test: PATH::NAME``: the browser test's screenshot
  (test-artifacts/screenshots/NAME.png) as a figure, else the committed copy in docs/_static/,
  else a line naming the test that takes it. The page is read again at the next build while the
  screenshot is missing, and whenever it changes.

Both are written only when their content changed, so an incremental build stays incremental.

- The frameworks of ``nbdist_mocked`` (the adapters' Lightning, Accelerate, Transformers: 5-12 s
  to import, most of a build) are mocked for the whole build, not only while autodoc imports
  (``autodoc_mock_imports``): autodoc looks for members along a class's bases afterwards, and
  would import a mocked base's real module then.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
from docutils import nodes
from docutils.parsers.rst import directives
from docutils.parsers.rst.directives.images import Figure
from sphinx import addnodes
from sphinx.ext.autodoc.mock import MockFinder
from sphinx.util.docutils import SphinxDirective

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
ARTIFACTS = ROOT / "test-artifacts"
NOTEBOOKS = ROOT / "notebooks"
NOTEBOOK_TESTS = "tests/integration/shipped/test_notebooks.py"
SHOTS = "_generated/screenshots"


def notebook_tests() -> dict[str, str]:
    """Each notebook's test in NOTEBOOK_TESTS: ``{"quickstart.ipynb": "test_quickstart_..."}``."""
    source = (ROOT / NOTEBOOK_TESTS).read_text()
    found: dict[str, str] = {}
    for test, body in re.findall(r"^def (test_\w+)\(.*?\n(.*?)(?=^def |\Z)", source, re.M | re.S):
        for name in re.findall(r'_execute\("([\w.-]+\.ipynb)"', body):
            found[name] = test
    return found


def _cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


def _note(name: str, executed, test: str | None) -> str:
    run = f"`python -m pytest {NOTEBOOK_TESTS}` (part of `make test`)"
    if test is None:
        return (
            "No test executes this notebook (it needs machines of your own), so it is shown as "
            "committed, without outputs."
        )
    if executed is None:
        return (
            "This build found no outputs from the tests, so the notebook is shown as committed, "
            f"without outputs: {run} saves it executed into `test-artifacts/notebooks/`, and the "
            "next docs build shows that."
        )
    if executed is False:
        return (
            "The tests' executed copy of this notebook is of an earlier version, so it is shown "
            f"as committed, without outputs: {run} executes it again."
        )
    return (
        f"The outputs below are those of `{NOTEBOOK_TESTS}::{test}`, which executed this notebook "
        "in a fresh kernel on a local CPU cluster and checked what it shows."
    )


def write_if_changed(path: Path, data: bytes) -> None:
    if not path.exists() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def render_notebooks(app, config) -> None:
    """notebooks/*.ipynb -> docs/examples/*.ipynb, executed by the tests when that copy fits."""
    tests = notebook_tests()
    out = DOCS / "examples"
    for committed in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(committed, as_version=4)
        test = tests.get(committed.name)
        ran = ARTIFACTS / "notebooks" / committed.name
        executed = None
        if test is not None and ran.exists():
            candidate = nbformat.read(ran, as_version=4)
            executed = _cells(candidate) == _cells(nb)
            if executed:
                nb = candidate
        note = nbformat.v4.new_markdown_cell(
            ":::{note}\n" + _note(committed.name, executed, test) + "\n:::"
        )
        at = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
        nb.cells.insert(at, note)
        nb.nbformat_minor = max(nb.nbformat_minor, 5)  # cells carry ids from 4.5 on
        for i, cell in enumerate(nb.cells):
            cell.setdefault("id", f"cell-{i}")
        write_if_changed(out / committed.name, nbformat.writes(nb, version=4).encode())
    for stale in out.glob("*.ipynb"):
        if not (NOTEBOOKS / stale.name).exists():
            stale.unlink()


class Screenshot(SphinxDirective):
    """``{screenshot} NAME.png`` with ``:test: PATH::NAME``, an ``:alt:`` and a caption."""

    required_arguments = 1
    has_content = True
    option_spec = {"test": directives.unchanged_required, "alt": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        test = self.options["test"]
        taken = ARTIFACTS / "screenshots" / name
        committed = DOCS / "_static" / name
        self.env.note_dependency(str(taken))  # missing or changed: this page is read again
        if taken.exists():
            copy = DOCS / SHOTS / name
            write_if_changed(copy, taken.read_bytes())
            uri = f"/{SHOTS}/{name}"
        elif committed.exists():
            uri = f"/_static/{name}"
        else:
            para = nodes.paragraph()
            para += nodes.emphasis(text=f"The screenshot {name} is taken by ")
            para += nodes.literal(text=test)
            para += nodes.emphasis(text=": this build found none; run that test to see it here.")
            return [para]
        figure = Figure(
            "figure",
            [uri],
            {"alt": self.options.get("alt", name), "class": ["screenshot"]},
            self.content,
            self.lineno,
            self.content_offset,
            self.block_text,
            self.state,
            self.state_machine,
        )
        made = figure.run()
        for node in made:
            if isinstance(node, nodes.figure):
                caption = nodes.paragraph()
                caption += nodes.Text("Taken by ")
                caption += nodes.literal(text=test)
                legend = nodes.legend("", caption)
                node += legend
        return made


def order_guide(app, doctree) -> None:
    """Sort a globbed toctree of guide pages by ``nbdist_guide_order`` (before Sphinx notes it)."""
    order = [f"guide/{name}" for name in app.config.nbdist_guide_order]

    def key(docname: str) -> tuple[int, str]:
        return (order.index(docname) if docname in order else len(order), docname)

    for node in doctree.findall(addnodes.toctree):
        names = [docname for _, docname in node["entries"]]
        if node.get("glob") and names and all(n.startswith("guide/") for n in names):
            node["entries"] = sorted(node["entries"], key=lambda entry: key(entry[1]))
            node["includefiles"] = sorted(node["includefiles"], key=key)


def mock_frameworks(app, config) -> None:
    if config.nbdist_mocked and not any(isinstance(f, MockFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MockFinder(config.nbdist_mocked))


def setup(app):
    app.add_config_value("nbdist_guide_order", [], "env", list)
    app.add_config_value("nbdist_mocked", [], "env", list)
    app.connect("config-inited", mock_frameworks)
    app.connect("config-inited", render_notebooks)
    app.connect("doctree-read", order_guide, priority=400)  # Sphinx's toctree collector: 500
    app.add_directive("screenshot", Screenshot)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
