"""The docs site: Sphinx with the PyData theme and MyST (myst-nb), as JupyterLab, ipywidgets and
ipyparallel build theirs. ``make docs`` builds it into docs/_build/html and opens it; ``make test``
builds it with warnings as errors (tests/unit/test_docs.py).

Nothing is fetched: no intersphinx, no remote images, notebooks never executed here. What the
tests produced is shown when it is there (docs/_ext/nbdist_docs.py): the example notebooks as
tests/integration/shipped/test_notebooks.py executed them (test-artifacts/notebooks/), and the
browser tests' screenshots (test-artifacts/screenshots/); without them, the committed notebooks
unexecuted, and a line naming the test that takes each screenshot.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import nbdist  # noqa: E402  (the editable install: the version, and autodoc's imports)

project = "nbdist"
author = "the nbdist developers"
copyright = "the nbdist developers"  # noqa: A001  (Sphinx's name)
release = version = nbdist.__version__

extensions = [
    "myst_nb",  # Markdown (MyST) pages and .ipynb notebooks; brings myst_parser with it
    "sphinx.ext.autodoc",
    "nbdist_docs",  # the notebooks and screenshots the tests produced
]

exclude_patterns = ["_build", "**.ipynb_checkpoints"]
suppress_warnings: list[str] = []

# -- MyST and myst-nb ------------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # links to a section by its slug: page.md#fault-tolerance
nb_execution_mode = "off"  # notebooks show the outputs they carry; the tests execute them
nb_merge_streams = True  # a cell's stdout (many prints) as one block
# nbdist's tracebacks fold library frames into lines ("… in torch.distributed barrier") that the
# IPython traceback lexer cannot read: shown as text
nb_render_error_lexer = "text"
# The dashboard is a widget; its cell also carries the finished board as an SVG picture, for
# renderers without widgets: the site shows that, and loads no widget code from a CDN.
nb_ipywidgets_js: dict = {}
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]

# -- the guide: one page per capability, in this order; pages added later follow, by name ---------
nbdist_guide_order = [
    "starting-clusters",
    "front-ends",
    "cells-and-scripts",
    "data",
    "dashboard-and-runs",
    "trackers",
    "fault-tolerance",
    "remote-hosts",
    "training-options",
    "pipelines-and-meshes",
    "sweeps",
    "debugging",
    "housekeeping",
]

# -- autodoc ---------------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# The framework adapters' frameworks would take most of a build to import (Lightning alone 5-12
# s): mocked for the whole build (docs/_ext/nbdist_docs.py), and docs/api.md gives the adapters'
# signatures.
nbdist_mocked = ["lightning", "accelerate", "transformers"]

# -- HTML: the PyData theme, nothing remote --------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "nbdist"
html_static_path = ["_static"]
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version", "theme-version"],
}
# pages without sub-pages: no empty navigation column beside them
html_sidebars = {page: [] for page in ("index", "api", "how-it-fails", "comparison", "measured")}
html_show_sourcelink = False
html_last_updated_fmt = None
