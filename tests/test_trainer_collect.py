"""The rollout half of a trainer step with a scripted fake engine: scoring, the soft overlong penalty, and the
dynamic-sampling refill accounting (the paper's sections 3.2 and 3.4), in one process (one replica). Several replicas:
tests/test_trainer_dist.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dapo.algos.dynamic_sampling import RefillCapReached
from dapo.rollout.base import per_prompt_counts
from dapo.rollout.replicas import ReplicaLayout
from dapo.trainer import collect as C
from dapo.trainer.collect import RolloutSettings, Sampler, StopDuringRefill, collect
from dapo.types import Problem, Sample


@dataclass
class Score:
    score: float
    correct: bool
    extracted: str | None = None


def score_fn(texts: list[str], answers: list[str]) -> list[Score]:
    return [Score(1.0 if t == a else -1.0, t == a) for t, a in zip(texts, answers, strict=True)]


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class ScriptedEngine:
    """Problem k's prompt is [k]; its G responses are scripted as (text, length, finish_reason) lists.
    Each generate call advances the fake clock by 1 s per prompt (so timers are checkable)."""

    def __init__(self, script: dict[int, list[tuple[str, int, str]]], clock: FakeClock) -> None:
        self.script = script
        self.clock = clock
        self.calls: list[list[int]] = []

    def generate(self, prompt_ids, n, max_tokens, temperature=1.0, top_p=1.0, seeds=None):
        self.calls.append([p[0] for p in prompt_ids])
        self.clock.t += len(prompt_ids)
        out = []
        for p, k in zip(prompt_ids, per_prompt_counts(n, len(prompt_ids)), strict=True):
            rows = self.script[p[0]]
            assert len(rows) == k
            out.append(
                [
                    Sample(prompt_ids=p, response_ids=[7] * ln, logprobs=None, finish_reason=fr, text=t)
                    for t, ln, fr in rows
                ]
            )
        return out


def make_source(n_problems: int):
    problems = [Problem(id=str(k), problem=f"p{k}", answer="A") for k in range(n_problems)]
    pos = {"i": 0}

    def next_batch(k: int):
        idx = [(pos["i"] + j) % n_problems for j in range(k)]
        pos["i"] += k
        return [problems[i] for i in idx], [[i] for i in idx]

    return next_batch, pos


ALL_RIGHT = [("A", 5, "stop")] * 4
ALL_WRONG = [("B", 5, "stop")] * 4
MIXED = [("A", 5, "stop"), ("B", 5, "stop"), ("A", 5, "stop"), ("B", 5, "stop")]
# all wrong, but lengths differ inside the penalty band: shaped rewards differ, correctness does not
WRONG_VARIED_LEN = [("B", 2, "stop"), ("B", 12, "stop"), ("B", 14, "stop"), ("B", 16, "length")]


def sampler(engine, s: RolloutSettings):
    return Sampler(engine, score_fn, ReplicaLayout(1, 1, 0), s, seed=0)


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(C.time, "perf_counter", c)
    return c


def test_without_dynamic_sampling_every_group_trains(clock):
    engine = ScriptedEngine({0: ALL_RIGHT, 1: MIXED, 2: ALL_WRONG}, clock)
    next_batch, _ = make_source(3)
    s = RolloutSettings(n=4, max_tokens=16, train_batch_size=3)
    out = collect(sampler(engine, s), 1, next_batch, s)
    assert [g.problem.id for g in out.groups] == ["0", "1", "2"]
    assert out.groups[1].scores == [1.0, -1.0, 1.0, -1.0]
    assert out.groups[1].rewards == out.groups[1].scores  # no penalty when off
    assert out.stats.gen_batches == 1 and out.stats.groups_kept == 3 and out.stats.tokens_generated == 3 * 4 * 5
    assert out.timings["generate"] == 3.0


def test_soft_overlong_penalty_shapes_rewards_eq13(clock):
    # L_max 16, L_cache 8: |y| <= 8 -> 0; 12 -> (8-12)/8 = -0.5; 14 -> -0.75; 16 -> -1.0 (at the cap, in band)
    engine = ScriptedEngine({0: WRONG_VARIED_LEN}, clock)
    next_batch, _ = make_source(1)
    s = RolloutSettings(
        n=4,
        max_tokens=16,
        train_batch_size=1,
        overlong_penalty=True,
        overlong_buffer_len=8,
        overlong_penalty_factor=1.0,
    )
    g = collect(sampler(engine, s), 1, next_batch, s).groups[0]
    assert g.penalties == [0.0, -0.5, -0.75, -1.0]
    assert g.rewards == [-1.0, -1.5, -1.75, -2.0]


def test_refill_accounting_counts_every_batch(clock):
    # gen batches of 3 prompts, target 2 informative groups
    # batch 1: prompts 0,1,2 -> right, mixed, wrong-with-varied-lengths (dropped: correctness is constant)
    # batch 2: prompts 3,4,5 -> mixed, mixed (surplus), right
    script = {0: ALL_RIGHT, 1: MIXED, 2: WRONG_VARIED_LEN, 3: MIXED, 4: MIXED, 5: ALL_RIGHT}
    engine = ScriptedEngine(script, clock)
    next_batch, pos = make_source(6)
    s = RolloutSettings(
        n=4,
        max_tokens=16,
        dynamic_sampling=True,
        train_batch_size=2,
        gen_batch_size=3,
        max_num_gen_batches=5,
        overlong_penalty=True,
        overlong_buffer_len=8,
    )
    out = collect(sampler(engine, s), 1, next_batch, s)
    assert [g.problem.id for g in out.groups] == ["1", "3"]
    st = out.stats
    assert (st.gen_batches, st.groups_generated, st.groups_kept, st.groups_filtered, st.groups_surplus) == (
        2,
        6,
        2,
        3,
        1,
    )
    assert st.groups_dropped == 4
    # tokens of every generated response, dropped groups included: 5 groups of 4x5 + (2+12+14+16)
    assert st.tokens_generated == 5 * 20 + 44
    # Fig 3b over all 6 generated groups before filtering: 2 all-correct, 1 all-wrong
    assert len(out.all_correct) == 6
    assert sum(all(c) for c in out.all_correct) == 2 and sum(not any(c) for c in out.all_correct) == 1
    # timers include both generation batches (3 s each on the fake clock), not just the last
    assert out.timings["generate"] == 6.0
    assert pos["i"] == 6 and engine.calls == [[0, 1, 2], [3, 4, 5]]


def test_refill_cap_partial_trains_on_what_was_kept(clock):
    engine = ScriptedEngine({0: ALL_RIGHT, 1: MIXED, 2: ALL_WRONG}, clock)
    next_batch, _ = make_source(3)
    s = RolloutSettings(
        n=4,
        max_tokens=16,
        dynamic_sampling=True,
        train_batch_size=3,
        gen_batch_size=3,
        max_num_gen_batches=2,
        at_refill_cap="partial",
    )
    out = collect(sampler(engine, s), 1, next_batch, s)
    assert [g.problem.id for g in out.groups] == ["1", "1"]
    assert out.stats.hit_cap and not out.stats.full and out.stats.gen_batches == 2


def test_refill_cap_fail_raises_with_counts(clock):
    engine = ScriptedEngine({0: ALL_RIGHT, 1: ALL_WRONG}, clock)
    next_batch, _ = make_source(2)
    s = RolloutSettings(
        n=4,
        max_tokens=16,
        dynamic_sampling=True,
        train_batch_size=2,
        gen_batch_size=2,
        max_num_gen_batches=3,
        at_refill_cap="fail",
    )
    with pytest.raises(RefillCapReached, match="max_num_gen_batches=3") as e:
        collect(sampler(engine, s), 1, next_batch, s)
    assert e.value.stats.gen_batches == 3 and e.value.stats.groups_kept == 0


def test_stop_mid_refill_then_resume_gives_the_uninterrupted_result(clock):
    script = {0: ALL_RIGHT, 1: MIXED, 2: ALL_WRONG, 3: MIXED, 4: MIXED, 5: MIXED}
    s = RolloutSettings(
        n=4, max_tokens=16, dynamic_sampling=True, train_batch_size=3, gen_batch_size=2, max_num_gen_batches=0
    )
    ref = collect(sampler(ScriptedEngine(script, clock), s), 1, make_source(6)[0], s)

    import pickle

    next_batch, pos = make_source(6)
    engine = ScriptedEngine(script, clock)
    stops = iter([True])
    with pytest.raises(StopDuringRefill) as e:
        collect(sampler(engine, s), 1, next_batch, s, should_stop=lambda: next(stops, False))
    assert engine.calls == [[0, 1]] and pos["i"] == 2  # stopped after the first batch, before the next
    state = pickle.loads(pickle.dumps(e.value.state))  # it goes through a checkpoint file
    out = collect(sampler(engine, s), 1, next_batch, s, resume=state)
    assert [g.problem.id for g in out.groups] == [g.problem.id for g in ref.groups] == ["1", "3", "4"]
    assert out.stats == ref.stats
    assert out.all_correct == ref.all_correct
