"""``--profile [STEPS]``: alone, the whole cell; with a number, that many steps; before a script's
name (``%nbdist run --profile train.py``), the name is the script's, not STEPS; 0 is one line."""

from __future__ import annotations

import pytest

from nbdist.config import CellOptions
from nbdist.errors import UsageError
from nbdist.notebook.arguments import parse as _parse
from nbdist.notebook.magics import (
    _cell_options,
    _distributed_parser,
    _explicit_profile,
    _nbdist_parser,
)


def test_profile_alone_with_steps_and_before_a_script():
    assert _parse(_distributed_parser(), "--profile").profile is True
    assert _parse(_distributed_parser(), "--profile 7 --timeout 3").profile == 7
    assert _parse(_distributed_parser(), "").profile is False
    run = _parse(_nbdist_parser(), "run --profile train.py --lr 3", _explicit_profile)
    assert (run.profile, run.file, run.args) == (True, "train.py", ["--lr", "3"])
    run = _parse(_nbdist_parser(), "run --profile 5 train.py", _explicit_profile)
    assert (run.profile, run.file) == (5, "train.py")


@pytest.mark.parametrize("value", [0, -2, 2.5, "many"])
def test_a_bad_number_of_steps_is_one_line(value):
    with pytest.raises(UsageError, match=r"--profile STEPS must be a whole number >= 1"):
        CellOptions(profile=value)


def test_the_magic_hands_the_option_over():
    assert _cell_options(_parse(_distributed_parser(), "--profile 3")).profile == 3


def test_an_option_is_a_word_of_the_line_because_config_declares_it():
    """``--refresh`` is declared once, in ``config.CellOptions``: the magic's parser has it."""
    opts = _cell_options(_parse(_distributed_parser(), "--refresh 2 --name r"))
    assert (opts.refresh, opts.name) == (2.0, "r")
    assert _cell_options(_parse(_distributed_parser(), "")).refresh == 0.5
