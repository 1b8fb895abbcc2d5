"""Checkpoint atomicity, pruning, RNG capture, formats that cannot run code (JSON, safetensors, a typed refill
codec, weights-only loading of old files and of DeepSpeed's), the resumable data order, the stop-signal flag,
the start-up guard and the deadline before a job's time limit."""

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
    assert not list(second.glob("*.pt"))  # nothing of ours is pickled


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


def test_stop_flag_catches_sigterm_and_sigusr1_and_gives_back_the_handler_it_found():
    def outer(signum, frame):  # what was installed before the loop: StartupGuard in `dapo train`
        pass

    signal.signal(signal.SIGTERM, outer)
    with StopFlag() as flag:
        assert not flag.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        assert flag.requested and flag.signum == signal.SIGUSR1
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal keeps the first
        assert flag.signum == signal.SIGUSR1
    assert signal.getsignal(signal.SIGTERM) is outer


# ------------------------------------------------------------------------------------------ no pickles
def _refill_state():
    """What the step hands the checkpoint when a stop comes mid-refill: an accumulator holding real groups, every
    generated group's outcome and the phases' seconds so far."""
    from dapo.algos.dynamic_sampling import RefillAccumulator
    from dapo.trainer.metrics import outcome_of
    from dapo.trainer.step import PartialStep
    from dapo.types import Group, Problem, Sample

    def group(i, correct):
        samples = [
            Sample([3, 4 + i], [-0.5, -0.25], "stop", f"Answer: {i}"),
            Sample([5], None, "length", ""),
        ]
        return Group(Problem(f"p{i}", f"What is {i}?", str(i)), [1, 2], samples, [1.0, -1.0], correct, [0.0, -0.5])

    acc = RefillAccumulator(target_groups=3, max_gen_batches=4, at_cap="partial")
    acc.add([group(0, [True, False]), group(1, [True, True])], [True, False], tokens_generated=7)
    outcomes = [outcome_of(group(0, [True, False])), outcome_of(group(1, [True, True]))]
    outcomes[0].kind = "easy"
    return PartialStep(refill=acc, generated=outcomes, timings={"generate": 0.5})


def _partial_step():
    """What the step hands the checkpoint when a stop comes before an update: the refill done, the batch with its
    old log-probs (tensors), the updates done and their metrics."""
    from dapo.algos.dynamic_sampling import RefillAccumulator
    from dapo.learner.batch import PolicyBatch

    partial = _refill_state()
    kept = partial.refill.state_dict()["kept"]
    partial.refill = RefillAccumulator(target_groups=1)
    partial.refill.add(kept, [True], tokens_generated=3)  # full: the batch is built
    partial.batch = PolicyBatch(
        prompt_ids=[[1, 2], [1, 2]],
        response_ids=[[3, 4], [5]],
        advantages=torch.tensor([0.7, -0.7]),
        loss_mask=torch.tensor([[1.0, 1.0], [0.0, 0.0]]),
        group_ids=torch.tensor([0, 0]),
        old_logp=torch.tensor([[-0.5, -0.25], [-1.0, 0.0]]),
        truncated=torch.tensor([False, True]),
        response_mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
    )
    partial.update_stats = [{"actor/pg_loss": 0.25}]
    return partial


def test_rng_and_a_part_done_step_round_trip_through_json_and_safetensors(tmp_path):
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    partial = _partial_step()
    path = _save(tmp_path, 1, refill=partial)
    assert {p.name for p in path.iterdir()} == {
        "learner",
        "trainer_state.json",
        "rng.json",
        "rng.safetensors",
        "partial.json",
        "partial.safetensors",
        "COMPLETE",
    }
    expect = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    _, rng, back = ck.load_checkpoint_state(path)
    ck.set_rng_state(rng)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expect
    assert type(back) is type(partial) and back.update_stats == partial.update_stats
    assert back.refill.result() == partial.refill.result() and back.generated == partial.generated
    assert back.refill.result()[0][0].samples[0].logprobs == [-0.5, -0.25]
    for f in ("group_ids", "advantages", "truncated", "response_mask", "loss_mask", "old_logp", "sample_ids"):
        a, b = getattr(back.batch, f), getattr(partial.batch, f)
        assert a.dtype == b.dtype and torch.equal(a, b), f
    assert back.batch.entropy is None and back.batch.response_ids == [[3, 4], [5]]


def test_a_refill_cut_off_between_generation_batches_resumes_where_it_stopped(tmp_path):
    partial = _refill_state()
    back = ck.load_checkpoint_state(_save(tmp_path, 1, refill=partial))[2]
    acc, kept = back.refill, back.refill.state_dict()["kept"]
    assert acc.stats == partial.refill.stats and kept == partial.refill.state_dict()["kept"]
    assert (
        kept[0].problem.answer == "0"
        and back.generated == partial.generated
        and back.generated[0].lengths == [2, 1]
        and back.generated[0].kind == "easy"
        and back.timings == {"generate": 0.5}
    )
    acc.add(kept, [True], tokens_generated=1)  # the restored accumulator goes on where the stopped one was
    assert acc.stats.gen_batches == 2 and acc.stats.groups_kept == 2


def test_a_refill_state_with_an_unknown_type_is_refused_at_save(tmp_path):
    with pytest.raises(TypeError, match="cannot store a .*Path in a checkpoint"):
        _save(tmp_path, 1, refill={"acc": tmp_path})
    assert ck.latest_checkpoint(tmp_path) is None  # nothing half-written was published


def _pickled_instead(path, refill):
    """Replace a checkpoint's JSON and safetensors files by pickles (torch.save), as a crafted folder could."""
    _, rng, _ = ck.load_checkpoint_state(path)
    for f in ("rng.json", "rng.safetensors", "partial.json", "partial.safetensors"):
        (path / f).unlink(missing_ok=True)
    torch.save(rng, path / "rng.pt")
    torch.save(refill, path / "refill.pt")


@pytest.mark.parametrize("name", ["rng.pt", "refill.pt"])
def test_a_checkpoint_of_pickles_is_refused_and_never_unpickled(tmp_path, name):
    path = _save(tmp_path, 3)
    marker = tmp_path / "pwned"
    _pickled_instead(path, {"acc": 1})
    torch.save({"python": _Payload(marker)}, path / name)
    with pytest.raises(ck.CheckpointError) as err:
        ck.load_checkpoint_state(path)
    assert not marker.exists()
    assert "rng.json" in str(err.value) and "Delete the folder" in str(err.value)


class _Payload:
    """What a malicious checkpoint file carries: unpickling it runs a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def deepspeed_checkpoint(tmp_path_factory):
    """A real ZeRO-2 learner checkpoint of a small Qwen2 (what a run's checkpoints/step_*/learner holds)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from dapo.learner import Learner, LossSpec

    tmp = tmp_path_factory.mktemp("ds")
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(tmp / "model")
    learner = Learner(
        str(tmp / "model"),
        loss=LossSpec(),
        lr=1e-3,
        warmup_steps=1,
        weight_decay=0.0,
        betas=(0.9, 0.999),
        grad_clip=1.0,
        zero_stage=2,
        dtype="float32",
        micro_batch_tokens=64,
        logprob_chunk_size=8,
        gradient_checkpointing=False,
    )
    ckpt = tmp / "checkpoints" / "step_000001"
    learner.save_checkpoint(ckpt / ck.LEARNER_DIR)
    return learner, ckpt


def test_deepspeed_state_loads_weights_only(deepspeed_checkpoint):
    learner, ckpt = deepspeed_checkpoint
    before = {k: v.clone() for k, v in learner.named_parameters_for_sync()}
    ck.load_learner(learner, ckpt)
    assert all(torch.equal(before[k], v) for k, v in learner.named_parameters_for_sync())


def test_a_crafted_deepspeed_file_is_refused(deepspeed_checkpoint, tmp_path):
    import shutil

    learner, ckpt = deepspeed_checkpoint
    bad = tmp_path / "step_000001"
    shutil.copytree(ckpt, bad)
    marker = tmp_path / "pwned"
    (state_file,) = bad.rglob("mp_rank_00_model_states.pt")
    torch.save({"module": _Payload(marker)}, state_file)
    with pytest.raises(ck.CheckpointError, match="refused to load"):
        ck.load_learner(learner, bad)
    assert not marker.exists()


# ------------------------------------------------------------------------------------- start-up and deadline
def test_a_stop_signal_during_start_up_exits_with_the_resume_code():
    from dapo.trainer.signals import StartupGuard, StartupStop

    guard = StartupGuard(RESUME_EXIT_CODE).install()
    try:
        with pytest.raises(StartupStop) as stop:
            os.kill(os.getpid(), signal.SIGTERM)
        assert stop.value.code == RESUME_EXIT_CODE and isinstance(stop.value, SystemExit)
        with StopFlag() as flag:  # the loop takes over: a signal only sets its flag
            os.kill(os.getpid(), signal.SIGUSR1)
            assert flag.requested
        guard.disarm()  # after the loop: a late signal changes nothing
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.received == signal.SIGTERM
    finally:
        for s in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(s, signal.SIG_DFL)


def test_deadline_stops_when_the_next_step_would_cross_the_margin():
    from dapo.trainer.signals import Deadline

    now = [1000.0]
    d = Deadline(end_time=1000.0 + 700, margin_s=600, clock=lambda: now[0])
    assert not d.should_stop(last_step_s=50)  # 700 s left >= 50 + 600
    now[0] += 60
    assert d.should_stop(last_step_s=10)  # 640 s left < the longest step (50) + 600
    assert not Deadline(None, 600).should_stop(1e9)  # outside a job with a limit: never


def test_job_end_time_from_the_environment_or_squeue():
    import datetime as dt
    import subprocess as sp

    from dapo.trainer.signals import job_end_time

    assert job_end_time({}) is None
    assert job_end_time({"SLURM_JOB_END_TIME": "1700000000"}) == 1700000000.0
    end = dt.datetime(2026, 11, 22, 16, 29, 44)

    def squeue(cmd, **kw):
        assert cmd[:4] == ["squeue", "-h", "-j", "42"]
        return sp.CompletedProcess(cmd, 0, stdout=end.isoformat() + "\n")

    assert job_end_time({"SLURM_JOB_ID": "42"}, run=squeue) == end.timestamp()

    def unlimited(cmd, **kw):
        return sp.CompletedProcess(cmd, 0, stdout="UNLIMITED\n")

    assert job_end_time({"SLURM_JOB_ID": "42"}, run=unlimited) is None
