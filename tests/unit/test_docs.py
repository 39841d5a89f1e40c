"""The docs site builds with warnings as errors, offline, and says only what is so.

The build shows what the notebook and browser tests produced (test-artifacts/) when it is there:
``python -m pytest`` collects tests/integration before tests/unit, so in ``make test`` this build
comes after them and shows their outputs; alone (``make test-fast``, a fresh clone) it builds from
the committed notebooks and says so on their pages. Both are correct builds: the order decides
only what the pages show.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from paths import ROOT

import nbdist

DOCS = ROOT / "docs"
#: a test named by path and name, as the docs and the README cite them
CITED = re.compile(r"(tests/[\w/]+\.py)::(\w+(?:::\w+)?)")
#: what a page would fetch when opened: a script, a stylesheet or an image from the network
REMOTE = re.compile(r"""<(?:script|img|link)\b[^>]*\b(?:src|href)=["'](?:https?:)?//""", re.I)


@pytest.fixture(scope="module")
def sources() -> list[Path]:
    """The pages, as they stand when the site is built."""
    return sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)


@pytest.fixture(scope="module")
def site(tmp_path_factory, sources) -> Path:
    out = tmp_path_factory.mktemp("docs")
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(out / "doctrees"), str(DOCS), str(out / "html")],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )  # fmt: skip
    print(f"docs built in {time.monotonic() - t0:.1f} s")  # pytest -s shows it
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return out / "html"


def test_every_page_is_built_and_fetches_nothing(site, sources):
    pages = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    built = [p.relative_to(DOCS).with_suffix(".html").as_posix() for p in sources]
    notebooks = [f"examples/{p.stem}.html" for p in (ROOT / "notebooks").glob("*.ipynb")]
    wanted = {page for page in built if not page.startswith("_")} | set(notebooks)
    assert wanted <= pages, sorted(wanted - pages)
    for page in sorted(pages):
        remote = REMOTE.findall((site / page).read_text())
        assert not remote, (page, remote)


def test_every_guide_page_is_in_the_guides_contents(site, sources):
    contents = (site / "guide" / "index.html").read_text()
    for page in (p for p in sources if p.parent == DOCS / "guide" and p.stem != "index"):
        assert f'href="{page.stem}.html"' in contents, page.name


def test_the_api_reference_has_every_public_name_with_its_docstring(site):
    api = (site / "api.html").read_text()
    for name in nbdist._PUBLIC:  # read from the page: importing every name costs seconds
        entry = re.search(rf'id="nbdist\.{name}">.*?</dt>\s*<dd>(.*?)</dd>', api, re.S)
        assert entry, f"nbdist.{name} is not on the API page"
        assert entry.group(1).startswith("<p>"), f"nbdist.{name}: no docstring shown"


def test_each_notebook_page_shows_the_tests_outputs_when_they_match(site):
    executed = ROOT / "test-artifacts" / "notebooks"
    for committed in (ROOT / "notebooks").glob("*.ipynb"):
        page = (site / "examples" / f"{committed.stem}.html").read_text()
        ran = executed / committed.name
        fits = ran.exists() and [c.source for c in nbformat.read(ran, 4).cells] == [
            c.source for c in nbformat.read(committed, 4).cells
        ]
        assert ("The outputs below are those of" in page) is fits, committed.name
        if fits:
            assert 'class="cell_output' in page, committed.name


def test_every_test_the_docs_and_the_readme_cite_exists(sources):
    cited = {
        m.groups()
        for text in [p.read_text() for p in sources] + [(ROOT / "README.md").read_text()]
        for m in CITED.finditer(text)
    }
    assert len(cited) >= 8, cited  # the comparison's tests and the screenshots' at least
    for path, name in sorted(cited):
        tree = ast.parse((ROOT / path).read_text())
        scope: list[ast.stmt] = tree.body
        for part in name.split("::"):
            found = [n for n in scope if getattr(n, "name", None) == part]
            assert found, f"{path}::{name}: no {part}"
            scope = getattr(found[0], "body", [])


def test_the_readme_links_only_to_files_that_exist():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the docs"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert missing == [], missing
