"""The rollout half of a trainer step with a scripted fake engine and the real verifier: scoring, the soft overlong
penalty, the dynamic-sampling refill accounting (the paper's sections 3.2 and 3.4) and a stop between generation
batches, in one process (one replica), through `rollout_step` itself. Several replicas: tests/test_trainer_dist.py."""

from __future__ import annotations

import pytest
import torch

from dapo import metric_names as M
from dapo.algos.dynamic_sampling import RefillCapReached
from dapo.learner import UPDATE_SKIPPED
from dapo.rollout.base import per_prompt_counts
from dapo.rollout.replicas import ReplicaLayout
from dapo.trainer import step as S
from dapo.trainer.data_order import PromptSource
from dapo.trainer.signals import StopFlag
from dapo.trainer.step import Counters, StepIO, StepSettings, StopMidStep, rollout_step
from dapo.types import Problem, Sample


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class ScriptedEngine:
    """Problem k's prompt is [k]; its G responses are scripted as (answer, length, finish_reason) lists. Each generate
    call advances the fake clock by 1 s per prompt (so timers are checkable)."""

    def __init__(self, script: dict[int, list[tuple[str, int, str]]], clock: FakeClock) -> None:
        self.script, self.clock = script, clock
        self.calls: list[list[int]] = []

    def generate(self, prompt_ids, n, max_tokens, temperature=1.0, top_p=1.0, seeds=None):
        self.calls.append([p[0] for p in prompt_ids])
        self.clock.t += len(prompt_ids)
        out = []
        for p, k in zip(prompt_ids, per_prompt_counts(n, len(prompt_ids)), strict=True):
            rows = self.script[p[0]]
            assert len(rows) == k
            out.append([Sample([7] * ln, None, fr, f"Answer: {a}") for a, ln, fr in rows])
        return out

    def wake_up(self):
        pass

    def sleep(self):
        pass

    def sync_weights(self, named):
        list(named)


class RecordingLearner:
    """Keeps the step's batch (in group order) and every update's mini-batch, and changes nothing."""

    def __init__(self) -> None:
        self.batch, self.batches = None, []

    def offload_states(self):
        pass

    def reload_states(self):
        pass

    def compute_logprobs(self, batch):
        self.batch = batch
        return torch.zeros_like(batch.loss_mask), torch.zeros_like(batch.loss_mask)

    def padded_fraction(self, batch, *, forward_only):
        return 0.0

    def schedule(self, rollout_step):
        return 0.0

    def update(self, batch, *, salt=0):
        self.batches.append(batch)
        return {UPDATE_SKIPPED: 0.0}

    def named_parameters_for_sync(self):
        return []


ALL_RIGHT = [("1", 5, "stop")] * 4
ALL_WRONG = [("2", 5, "stop")] * 4
MIXED = [("1", 5, "stop"), ("2", 5, "stop"), ("1", 5, "stop"), ("2", 5, "stop")]
# all wrong, but lengths differ inside the penalty band: shaped rewards differ, correctness does not
WRONG_VARIED_LEN = [("2", 2, "stop"), ("2", 12, "stop"), ("2", 14, "stop"), ("2", 16, "length")]


def step_io(engine, n_problems: int, stop: StopFlag | None = None) -> StepIO:
    problems = [Problem(id=str(k), problem=f"p{k}", answer="1") for k in range(n_problems)]
    source = PromptSource(problems, [[k] for k in range(n_problems)], seed=0)
    source.order._perm = list(range(n_problems))  # the problems in order, epoch after epoch
    source.order._permutation = lambda epoch: list(range(n_problems))
    return StepIO(engine, RecordingLearner(), source, ReplicaLayout(1, 1, 0), stop or StopFlag())


def trained(io: StepIO) -> list[str]:
    """The problems of the groups the step trained on, in batch order (each group's first row)."""
    batch = io.learner.batch
    return [str(p[0]) for p in batch.prompt_ids[:: len(batch) // (int(batch.group_ids.max()) + 1)]]


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(S.time, "perf_counter", c)
    return c


def test_without_dynamic_sampling_every_group_trains(clock):
    io = step_io(ScriptedEngine({0: ALL_RIGHT, 1: MIXED, 2: ALL_WRONG}, clock), 3)
    s = StepSettings(n=4, max_tokens=16, train_batch_size=3, mini_batch_size=3, gen_batch_size=2)
    m = rollout_step(1, io, s, Counters())
    batch = io.learner.batch
    assert batch.advantages.view(3, 4)[1].sign().tolist() == [1, -1, 1, -1]  # scored: "Answer: 1" is right
    assert batch.advantages.view(3, 4)[[0, 2]].eq(0).all()
    assert m[M.DS_GEN_BATCHES] == 1 and m[M.DS_GROUPS_KEPT] == 3 and m[M.DS_TOKENS_GENERATED] == 3 * 4 * 5
    assert m[M.OVERLONG_PENALTY_MEAN] == 0  # no penalty when off
    assert m[M.TIME_GENERATE] == 3.0


def test_soft_overlong_penalty_shapes_rewards_eq13(clock):
    # L_max 16, L_cache 8: |y| <= 8 -> 0; 12 -> (8-12)/8 = -0.5; 14 -> -0.75; 16 -> -1.0 (at the cap, in band)
    io = step_io(ScriptedEngine({0: WRONG_VARIED_LEN}, clock), 1)
    s = StepSettings(
        n=4, max_tokens=16, train_batch_size=1, mini_batch_size=1, overlong_penalty=True, overlong_buffer_len=8
    )
    m = rollout_step(1, io, s, Counters())
    assert m[M.OVERLONG_PENALTY_MEAN] == pytest.approx((0 - 0.5 - 0.75 - 1.0) / 4)
    assert m[M.REWARD_MEAN] == pytest.approx(-1 + (0 - 0.5 - 0.75 - 1.0) / 4)
    rewards = torch.tensor([-1.0, -1.5, -1.75, -2.0])
    torch.testing.assert_close(io.learner.batch.advantages, (rewards - rewards.mean()) / (rewards.std() + 1e-6))


def test_refill_accounting_counts_every_batch(clock):
    # gen batches of 3 prompts, target 2 informative groups
    # batch 1: prompts 0,1,2 -> right, mixed, wrong-with-varied-lengths (dropped: correctness is constant)
    # batch 2: prompts 3,4,5 -> mixed, mixed (surplus), right
    script = {0: ALL_RIGHT, 1: MIXED, 2: WRONG_VARIED_LEN, 3: MIXED, 4: MIXED, 5: ALL_RIGHT}
    engine = ScriptedEngine(script, clock)
    io = step_io(engine, 6)
    s = StepSettings(
        n=4,
        max_tokens=16,
        train_batch_size=2,
        mini_batch_size=2,
        dynamic_sampling=True,
        gen_batch_size=3,
        max_num_gen_batches=5,
        overlong_penalty=True,
        overlong_buffer_len=8,
    )
    m = rollout_step(1, io, s, Counters())
    assert trained(io) == ["1", "3"]
    assert (m[M.DS_GEN_BATCHES], m[M.DS_GROUPS_KEPT], m[M.DS_GROUPS_DROPPED]) == (2, 2, 4)
    # tokens of every generated response, dropped groups included: 5 groups of 4x5 + (2+12+14+16)
    assert m[M.DS_TOKENS_GENERATED] == 5 * 20 + 44
    # Fig 3b over all 6 generated groups before filtering: 2 all-correct, 1 all-wrong
    assert m[M.ALL_CORRECT_FRAC] == pytest.approx(2 / 6) and m[M.ALL_WRONG_FRAC] == pytest.approx(1 / 6)
    # timers include both generation batches (3 s each on the fake clock), not just the last
    assert m[M.TIME_GENERATE] == 6.0
    assert engine.calls == [[0, 1, 2], [3, 4, 5]]


def test_refill_cap_partial_trains_on_what_was_kept(clock):
    io = step_io(ScriptedEngine({0: ALL_RIGHT, 1: MIXED, 2: ALL_WRONG}, clock), 3)
    s = StepSettings(
        n=4,
        max_tokens=16,
        train_batch_size=3,
        mini_batch_size=3,
        dynamic_sampling=True,
        gen_batch_size=3,
        max_num_gen_batches=2,
        at_refill_cap="partial",
    )
    m = rollout_step(1, io, s, Counters())
    assert trained(io) == ["1", "1"]
    assert m[M.DS_GEN_BATCHES] == 2 and m[M.DS_GROUPS_KEPT] == 2


def test_refill_cap_fail_raises_with_counts(clock):
    io = step_io(ScriptedEngine({0: ALL_RIGHT, 1: ALL_WRONG}, clock), 2)
    s = StepSettings(
        n=4,
        max_tokens=16,
        train_batch_size=2,
        mini_batch_size=2,
        dynamic_sampling=True,
        gen_batch_size=2,
        max_num_gen_batches=3,
        at_refill_cap="fail",
    )
    with pytest.raises(RefillCapReached, match="max_num_gen_batches=3") as e:
        rollout_step(1, io, s, Counters())
    assert e.value.stats.gen_batches == 3 and e.value.stats.groups_kept == 0


def test_stop_mid_refill_then_resume_gives_the_uninterrupted_result(clock):
    script = {0: ALL_RIGHT, 1: MIXED, 2: ALL_WRONG, 3: MIXED, 4: MIXED, 5: MIXED}
    s = StepSettings(n=4, max_tokens=16, train_batch_size=3, mini_batch_size=3, dynamic_sampling=True, gen_batch_size=2)
    ref_io = step_io(ScriptedEngine(script, clock), 6)
    ref = rollout_step(1, ref_io, s, Counters())

    class StopAfterFirstBatch(StopFlag):
        def anywhere(self) -> bool:
            return True

    engine = ScriptedEngine(script, clock)
    io = step_io(engine, 6, stop=StopAfterFirstBatch())
    with pytest.raises(StopMidStep) as e:
        rollout_step(1, io, s, Counters())
    assert engine.calls == [[0, 1]] and io.prompts.order.position == 2  # stopped after the first batch
    io.stop = StopFlag()
    out = rollout_step(1, io, s, Counters(), resume=e.value.partial)
    assert trained(io) == trained(ref_io) == ["1", "3", "4"]
    for key in (M.DS_GEN_BATCHES, M.DS_GROUPS_KEPT, M.DS_TOKENS_GENERATED, M.ALL_CORRECT_FRAC, M.TIME_GENERATE):
        assert out[key] == ref[key], key
