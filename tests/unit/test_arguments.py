"""A magic's line is read as a shell reads it: a ``#`` that begins a word starts a comment."""

from __future__ import annotations

import pytest

from nbdist.errors import UsageError
from nbdist.notebook.arguments import Parser, parse


def _parser() -> Parser:
    p = Parser(prog="%nbdist")
    p.add_argument("-n", type=int)
    p.add_argument("--name", default="")
    return p


@pytest.mark.parametrize(
    "line, n, name",
    [
        ("-n 2   # two engines", 2, ""),
        ("-n 2 --name run#1", 2, "run#1"),  # inside a word: no comment
        ("-n 3 --name 'a # b'", 3, "a # b"),  # inside quotes: no comment
        ('--name "x" -n 4 #-n 5', 4, "x"),
        ("# nothing but a comment", None, ""),
    ],
)
def test_a_comment_ends_the_line_where_a_shell_would_end_it(line, n, name):
    args = parse(_parser(), line)
    assert (args.n, args.name) == (n, name)


def test_a_mistake_is_one_line_and_help_is_none():
    with pytest.raises(UsageError, match=r"^%nbdist: unrecognized arguments: --bogus"):
        parse(_parser(), "-n 2 --bogus # note")
    with pytest.raises(UsageError, match="closing quotation"):
        parse(_parser(), "--name 'unclosed")
    assert parse(_parser(), "--help") is None
