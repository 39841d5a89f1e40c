"""Whether others may write a folder: by its mode and, for group-writable ones, by its group."""

from __future__ import annotations

import grp
import os
import pwd

import pytest

from nbdist.paths import others_may_write


def _folder(tmp_path, mode: int, gid: int | None = None):
    d = tmp_path / "d"
    d.mkdir()
    if gid is not None:
        os.chown(d, -1, gid)
    d.chmod(mode)
    return os.stat(d)


def test_a_folder_only_its_owner_may_write_is_theirs(tmp_path):
    assert not others_may_write(_folder(tmp_path, 0o755))


def test_a_world_writable_folder_is_not(tmp_path):
    assert others_may_write(_folder(tmp_path, 0o777))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another group needs root")
@pytest.mark.parametrize("group,writable", [("own", False), ("staff", True)])
def test_a_group_writable_folder_is_theirs_when_the_group_is_their_own(tmp_path, group, writable):
    """775 with the user's private group (named after them, no one else in it, as systems with
    umask 002 make): theirs; with a shared group (staff): others may write it."""
    me = pwd.getpwuid(os.geteuid())
    gid = grp.getgrnam(me.pw_name if group == "own" else group).gr_gid
    assert others_may_write(_folder(tmp_path, 0o775, gid)) is writable
