"""The object collectives (`dapo.distributed.broadcast`, `all_gather`: the samples dynamic sampling gathers from every
replica, the evaluation's shards) never stage their bytes on the GPU: over NCCL they run on a gloo group of the same
ranks, made once. No GPU here, so the NCCL group is torch.distributed's own API answering as a NCCL job would;
what is checked is which group, backend and device every call is given."""

from __future__ import annotations

import pytest
import torch

from dapo import distributed as D


@pytest.fixture
def nccl_job(monkeypatch):
    """torch.distributed as rank 0 of a 4-rank NCCL job sees it; records every group made and every collective."""
    calls: list[tuple] = []
    world_group = object()

    class Dist:
        group = type("group", (), {"WORLD": world_group})

        @staticmethod
        def is_initialized():
            return True

        @staticmethod
        def get_world_size(group=None):
            return 4

        @staticmethod
        def get_rank(group=None):
            return 0

        @staticmethod
        def get_backend(group=None):
            return "nccl" if group is None or group is world_group else "gloo"

        @staticmethod
        def new_group(backend=None, **kw):
            calls.append(("new_group", backend))
            return f"{backend}-group"

        @staticmethod
        def all_gather_object(out, obj, group=None):
            calls.append(("all_gather_object", group))
            out[:] = [obj] * len(out)

        @staticmethod
        def broadcast_object_list(box, src=0, group=None, device=None):
            calls.append(("broadcast_object_list", group, device))

    monkeypatch.setattr(D, "dist", Dist)
    monkeypatch.setattr(D, "_OBJECT_GROUP", None)
    return calls


def test_object_collectives_of_a_nccl_job_run_on_one_gloo_group(nccl_job):
    samples = {"prompt": 3, "tokens": list(range(100))}
    assert D.all_gather(samples) == [samples] * 4
    D.broadcast({"seed": 1})
    D.all_gather("again")
    made = [c for c in nccl_job if c[0] == "new_group"]
    assert made == [("new_group", "gloo")]  # once, for every later call
    for call in nccl_job:
        if call[0] == "all_gather_object":
            assert call[1] == "gloo-group"
        if call[0] == "broadcast_object_list":
            assert call[1] == "gloo-group" and call[2] == torch.device("cpu")


def test_a_gloo_job_uses_its_default_group(monkeypatch):
    """Where the default group is gloo already (every CPU job), no second group is made."""
    made = []
    monkeypatch.setattr(D.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(D.dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(D.dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(D.dist, "new_group", lambda **kw: made.append(kw))
    monkeypatch.setattr(D, "_OBJECT_GROUP", None)
    assert D.object_group() is None and made == []
