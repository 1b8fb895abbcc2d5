"""Checkpoint atomicity, pruning, RNG capture, the resumable data order and the stop-signal flag."""

from __future__ import annotations

import os
import random
import signal

import numpy as np
import pytest
import torch

from dapo.trainer import RESUME_EXIT_CODE
from dapo.trainer import checkpoint as ck
from dapo.trainer.data_order import PromptOrder
from dapo.trainer.signals import StopFlag


def _save(run_dir, step, keep=2, **kw):
    def save_learner(path):
        path.mkdir()
        torch.save({"w": torch.full((2,), float(step))}, path / "model.pt")

    return ck.save_checkpoint(run_dir, step, {"step": step}, save_learner, keep=keep, **kw)


def test_exit_code_is_ex_tempfail():
    assert RESUME_EXIT_CODE == 75


def test_latest_and_pruning_keep_the_newest(tmp_path):
    for step in (1, 2, 3):
        _save(tmp_path, step, keep=2)
    names = [p.name for p in ck.list_checkpoints(tmp_path)]
    assert names == ["step_000002", "step_000003"]
    state, _, refill = ck.load_checkpoint_state(ck.latest_checkpoint(tmp_path))
    assert state == {"step": 3} and refill is None
    assert torch.load(ck.latest_checkpoint(tmp_path) / "learner" / "model.pt")["w"].tolist() == [3.0, 3.0]


def test_same_step_twice_gets_a_suffix_and_wins(tmp_path):
    _save(tmp_path, 4)
    second = _save(tmp_path, 4, refill={"acc": [1, 2]})
    assert second.name == "step_000004.1"
    assert ck.latest_checkpoint(tmp_path) == second
    assert ck.load_checkpoint_state(second)[2] == {"acc": [1, 2]}


def test_half_written_checkpoint_is_never_loaded(tmp_path):
    _save(tmp_path, 5)
    # a crash mid-save leaves a temp folder, and a renamed folder without COMPLETE must not count either
    (ck.checkpoints_dir(tmp_path) / ".tmp-step_000006-123").mkdir()
    (ck.checkpoints_dir(tmp_path) / "step_000007").mkdir()
    assert ck.latest_checkpoint(tmp_path).name == "step_000005"

    def crashing_learner(path):
        path.mkdir()
        raise OSError("disk full")

    with pytest.raises(OSError):
        ck.save_checkpoint(tmp_path, 8, {}, crashing_learner)
    assert ck.latest_checkpoint(tmp_path).name == "step_000005"
    _save(tmp_path, 9)  # the next save sweeps the stale temp folders
    assert not list(ck.checkpoints_dir(tmp_path).glob(".tmp-*"))


def test_rng_state_round_trip():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state = ck.rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    ck.set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


def test_prompt_order_is_seeded_resumable_and_covers_each_epoch():
    a = PromptOrder(10, seed=3)
    first = a.take(7) + a.take(3)
    assert sorted(first) == list(range(10))  # epoch 0 is a permutation
    assert first != list(range(10))
    b = PromptOrder(10, seed=3)
    b.take(4)
    saved = b.state_dict()
    c = PromptOrder(10, seed=3)
    c.load_state_dict(saved)
    assert c.take(13) == b.take(13)  # crosses into epoch 1 identically
    assert PromptOrder(10, seed=4).take(10) != first
    with pytest.raises(ValueError, match="same config"):
        PromptOrder(11, seed=3).load_state_dict(saved)


def test_stop_flag_catches_sigterm_and_sigusr1():
    with StopFlag() as flag:
        assert not flag.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        assert flag.requested and flag.signum == signal.SIGUSR1
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal keeps the first
        assert flag.signum == signal.SIGUSR1
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
