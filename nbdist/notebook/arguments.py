"""The magics' lines read as a shell reads a command: words, quotes, and a ``#`` comment.

``parse`` splits a magic's line into words and hands them to an argparse ``Parser`` that reports
a mistake as one ``UsageError`` line instead of exiting the kernel. A ``#`` that begins a word
outside quotes starts a comment, as in a shell, so ``%nbdist start -n 2  # two engines`` works
(``--name run#1`` keeps its ``#``).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable

from ..errors import UsageError


class Parser(argparse.ArgumentParser):
    """argparse that reports a mistake as one UsageError line instead of exiting."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            raise UsageError(message.strip())
        raise _HelpShown()


class _HelpShown(Exception):
    pass


def parse(
    parser: Parser, line: str, rewrite: Callable[[list[str]], list[str]] | None = None
) -> argparse.Namespace | None:
    """``line`` parsed by ``parser`` (its words passed through ``rewrite`` first, if given);
    None when it asked for ``--help`` (shown already)."""
    try:
        words = shlex.split(_uncommented(line))
        return parser.parse_args(rewrite(words) if rewrite else words)
    except _HelpShown:
        return None
    except ValueError as e:  # unbalanced quotes
        raise UsageError(f"{parser.prog}: {e}") from None


def _uncommented(line: str) -> str:
    """``line`` up to a ``#`` that begins a word outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line
