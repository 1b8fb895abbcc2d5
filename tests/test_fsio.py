"""dapo.fsio.atomic_write: the old file or the new one, never a torn one, whatever fails on the way."""

from __future__ import annotations

import os

import pytest

from dapo import fsio


def test_a_failed_rename_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "DONE.json"
    fsio.atomic_write(path, "old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(fsio.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        fsio.atomic_write(path, "new")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DONE.json"]


def test_two_writers_of_one_path_use_their_own_temporaries(tmp_path, monkeypatch):
    path = tmp_path / "EXIT.json"
    seen: list[str] = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append(os.path.basename(src))
        real_replace(src, dst)

    monkeypatch.setattr(fsio.os, "replace", spy)
    fsio.atomic_write(path, "a")
    other = os.getpid() + 1
    monkeypatch.setattr(fsio.os, "getpid", lambda: other)
    fsio.atomic_write(path, "b")
    assert path.read_text() == "b" and len(set(seen)) == 2
