"""Execute a notebook headless in a real kernel and print what its cells printed.

Usage: python scripts/run_notebook.py notebooks/quickstart.ipynb [--out executed.ipynb]
Exits non-zero if a cell fails.
"""

from __future__ import annotations

import argparse
import sys
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("notebook")
    ap.add_argument("--out", default=None, help="write the executed notebook here")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = ap.parse_args()
    nb = nbformat.read(args.notebook, as_version=4)
    t0 = time.perf_counter()
    client = NotebookClient(nb, timeout=args.timeout, kernel_name="python3")
    try:
        client.execute()
        ok = True
    except CellExecutionError as e:
        print(e, file=sys.stderr)
        ok = False
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/plain")
            if text:
                print(text.rstrip())
    if args.out:
        nbformat.write(nb, args.out)
    print(f"[{args.notebook}: {'ok' if ok else 'FAILED'} in {time.perf_counter() - t0:.1f} s]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
