"""Carry-over (`rollout.max_staleness` >= 1) through the real trainer loop with fake engine, learner and tracker: the
stop rule and the oldest-first offer (pure functions), a round that stops early and carries, a group that may not wait
finished first, the checkpoint's groups in flight, and one property over random lengths, stop signals and kills: no
trained token older than eta, no token lost or trained twice, no prompt started twice in an epoch, and the resumed run
equal to the uninterrupted one. The engines' own `generate_partial`: tests/test_rollout.py; `dapo train` end to end:
tests/test_trainer_staleness.py."""

from __future__ import annotations

import os
import random
import signal
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dapo import metric_names as M
from dapo.algos.staleness import staleness_violation
from dapo.config import load_config
from dapo.learner import UPDATE_SKIPPED
from dapo.trainer import RESUME_EXIT_CODE
from dapo.trainer import checkpoint as ck
from dapo.trainer.carry import Carry, must_finish, plan_offer, should_stop
from dapo.trainer.components import Components
from dapo.trainer.loop import Trainer
from dapo.trainer.setup import run_settings
from dapo.types import Problem, Sample

EOS = 0
LOGP = -0.5  # every token's log-prob, the engine's and the learner's (the gap is tested on its own, below)


class Killed(BaseException):  # noqa: N818 (a simulated SIGKILL: nothing of the process survives but its files)
    pass


class PartialEngine:
    """A deterministic fake of `generate_partial`: each request draws its tokens from a generator seeded by its own
    seed, one token a decode step for every request in lockstep, ending with EOS with probability `p_end` a token
    (else at its cap); a response's answer is the parity of its tokens' sum ("Answer: 1" is right). It logs what it
    emitted, so a test can check that every continued prefix is exactly an earlier aborted response, continued once
    (`ledger`: an engine that lives the whole run).
    `kill_at` raises `Killed` on that poll (counted over the engine's life), `sigterm_at` signals there."""

    def __init__(self, p_end: float = 0.2, kill_at: int = 0, sigterm_at: int = 0, ledger: bool = True) -> None:
        self.p_end, self.kill_at, self.sigterm_at, self.ledger = p_end, kill_at, sigterm_at, ledger
        self.polls = 0
        self.version = 0  # syncs seen
        self.aborted: Counter = Counter()  # (prompt, prefix) of aborted responses not continued yet
        self.finished: Counter = Counter()  # (prompt, response) of every finished response
        self.emitted = 0  # tokens sampled
        self.fresh_prompts: list[tuple[int, ...]] = []  # prompts of responses started from nothing

    def generate_partial(self, requests, temperature, top_p, poll):
        rngs = [random.Random(r.seed) for r in requests]
        toks = [[] for _ in requests]
        reasons: list[str | None] = [None] * len(requests)
        for r in requests:
            if r.prefix_ids and self.ledger:  # (a resumed run's engine did not return what the checkpoint holds)
                key = (tuple(r.prompt_ids), tuple(r.prefix_ids))
                assert self.aborted[key] > 0, "a continued prefix the engine did not return, or continued twice"
                self.aborted[key] -= 1
            elif not r.prefix_ids:
                self.fresh_prompts.append(tuple(r.prompt_ids))
        while True:
            finished = []
            for k, r in enumerate(requests):
                if reasons[k] is not None:
                    continue
                end = rngs[k].random() < self.p_end
                toks[k].append(EOS if end else rngs[k].randint(1, 9))
                self.emitted += 1
                if end or len(toks[k]) >= r.max_tokens:
                    reasons[k] = "stop" if end else "length"
                    finished.append((k, self._whole(r, toks[k], reasons[k])))
            self.polls += 1
            if self.polls == self.kill_at:
                raise Killed()
            if self.polls == self.sigterm_at:
                os.kill(os.getpid(), signal.SIGTERM)
            if poll(finished):
                break
        out = [self._whole(r, toks[k], reasons[k] or "abort") for k, r in enumerate(requests)]
        for r, x in zip(requests, out, strict=True):
            (self.finished if x.finished else self.aborted)[(tuple(r.prompt_ids), tuple(x.response_ids))] += 1
        return out

    def _whole(self, r, toks, reason):
        ids = list(r.prefix_ids) + toks
        lps = list(r.prefix_logprobs) + [LOGP] * len(toks)
        return Sample(ids, lps, reason, f"Answer: {sum(ids) % 2}")

    def generate(self, prompt_ids, n, max_tokens, temperature=1.0, top_p=1.0, seeds=None):
        raise AssertionError("a carry-over step samples through generate_partial only")

    def sleep(self):
        pass

    def wake_up(self):
        pass

    def sync_weights(self, named):
        dict(named)
        self.version += 1

    def close(self):
        pass


class StalenessLearner:
    """w moves by lr x sum(advantage x loss-mask tokens) per update; every update's batch is kept, and checked as the
    real learner checks it (`staleness_violation` against the version `schedule` set). Its log-probs are the engine's
    (`LOGP`): the correction's weights are 1."""

    def __init__(self, max_staleness: int, kill_at_update: int = 0) -> None:
        self.w = torch.zeros(2, dtype=torch.float64)
        self.max_staleness, self.kill_at_update = max_staleness, kill_at_update
        self.version = -1
        self.batches: list = []
        self.updates = 0

    def offload_states(self):
        pass

    def reload_states(self):
        pass

    def compute_logprobs(self, batch):
        return torch.full_like(batch.loss_mask, LOGP), torch.full_like(batch.loss_mask, 0.5)

    def padded_fraction(self, batch, *, forward_only):
        return 0.0

    def schedule(self, rollout_step):
        self.version = rollout_step
        return 1e-3

    def update(self, mb, *, salt=0):
        self.updates += 1
        if self.updates == self.kill_at_update:
            raise Killed()
        if self.max_staleness:
            problem = staleness_violation(mb.versions, mb.loss_mask, self.version, self.max_staleness)
            assert problem is None, problem
        self.batches.append((self.version, mb))
        w = mb.loss_mask if mb.is_weights is None else mb.loss_mask * mb.is_weights
        g = (mb.advantages.double()[:, None] * w.double()).sum()
        self.w += 0.01 * g
        return {M.POLICY_LOSS: float(-g), M.GRAD_NORM: float(g.abs()), UPDATE_SKIPPED: 0.0}

    def named_parameters_for_sync(self):
        return [("w", self.w.clone())]

    def save_checkpoint(self, path):
        path.mkdir(parents=True)
        torch.save({"w": self.w, "updates": self.updates}, path / "s.pt")

    def load_checkpoint(self, path):
        d = torch.load(path / "s.pt")
        self.w = d["w"]

    def save_hf(self, path):
        path.mkdir(parents=True, exist_ok=True)


class Tracker:
    store: dict[str, dict] = {}

    def __init__(self, run_id):
        self.run_id = run_id or f"run{len(self.store)}"
        self.rec = self.store.setdefault(self.run_id, {})

    def log_params(self, p):
        pass

    def set_tags(self, t):
        pass

    def log_metrics(self, m, step):
        for k, v in m.items():
            self.rec.setdefault(k, {})[step] = v

    def log_artifact(self, path, artifact_path=None):
        pass

    def flush(self):
        return True

    def finish(self, status="FINISHED"):
        pass


PROBLEMS = [Problem(id=str(i), problem=f"p{i}", answer="1") for i in range(120)]


def trainer(run_dir, engine, learner, *overrides, eta=1, row="00_naive_grpo"):
    cfg = load_config(
        f"configs/ablations/{row}.yaml",
        preset="tiny",
        overrides=[
            "trainer.total_steps=6",
            "trainer.train_batch_size=4",
            "trainer.mini_batch_size=2",
            "rollout.n=3",
            "rollout.max_response_length=12",
            "trainer.checkpoint_every=1",
            "trainer.keep_checkpoints=1",
            "eval.every=0",
            f"rollout.max_staleness={eta}",
            "algorithm.rollout_correction=token_tis",
            *overrides,
        ],
    )
    comps = Components(
        engine=engine,
        learner=learner,
        problems=PROBLEMS,
        prompts=[[1000 + i] for i in range(120)],
        make_tracker=Tracker,
    )
    return Trainer(run_settings(cfg), run_dir, comps, progress=False)


@pytest.fixture(autouse=True)
def _no_git(monkeypatch):
    Tracker.store = {}
    monkeypatch.setattr("dapo.trainer.setup.git_commit", lambda: "test")


# ------------------------------------------------------------------------------------------------ the rules
def test_a_group_that_may_not_wait_is_the_one_whose_next_step_would_pass_the_bound():
    # version 5 now: trained at the next step (proximal 6), born 4 is 2 versions old
    assert not must_finish(born=5, version=5, max_staleness=1) and must_finish(born=4, version=5, max_staleness=1)
    assert not must_finish(born=4, version=5, max_staleness=2) and must_finish(born=3, version=5, max_staleness=2)


def test_finished_groups_are_offered_oldest_first():
    complete, born = [True, False, True, True, True], [3, 2, 2, 3, 1]
    offered, waiting = plan_offer(complete, born, needed=2, dynamic_sampling=False)
    assert offered == [4, 2] and waiting == [0, 1, 3]  # the two oldest finished; a finished young one waits
    offered, waiting = plan_offer(complete, born, needed=2, dynamic_sampling=True)
    assert offered == [4, 2, 0, 3] and waiting == [1]  # dynamic sampling: the refill sees every finished group


def test_a_round_does_not_stop_before_the_old_groups_finish_or_with_too_many_waiting():
    kw = dict(needed=2, version=5, max_staleness=1, capacity=2, dynamic_sampling=False, left=3)
    # enough finished, but the group born at 4 (must finish now) has not
    assert not should_stop([True, True, False], [None] * 3, [5, 5, 4], **kw)
    assert should_stop([True, True, False], [None] * 3, [5, 5, 5], **kw)
    # three groups would wait to a step where they must finish, in a batch of two
    assert not should_stop([True, True, False, False, False], [None] * 5, [5] * 5, **kw)
    # dynamic sampling counts informative groups only; nothing left to decode always stops
    ds = {**kw, "dynamic_sampling": True}
    assert not should_stop([True, True, False], [True, False, None], [5, 5, 5], **ds)
    assert should_stop([True, True, True], [True, False, False], [5, 5, 5], **{**ds, "left": 0})


def test_an_empty_response_does_not_switch_the_staleness_check_off():
    """The batch's token versions come from every response's segments; a response with no token has none, and the
    batch still carries versions, so a stale token beside it is refused (it once needed every response to have one)."""
    from dapo.trainer.step import policy_batch
    from dapo.types import Group

    stale = Sample([5, 6, EOS], [LOGP] * 3, "stop", "", [[0, 2], [2, 4]])  # tokens of versions 2, 2, 4
    empty = Sample([], [], "length", "", [])
    group = Group(Problem("p0", "q", "1"), [1, 2], [stale, empty], [1.0, -1.0], [True, False], [0.0, 0.0])
    batch = policy_batch([group], torch.tensor([1.0, -1.0]))
    assert batch.versions is not None and batch.versions[0, :3].tolist() == [2, 2, 4]
    assert batch.versions[1].tolist() == [-1] * batch.versions.shape[1]
    assert "2 weight versions before" in staleness_violation(batch.versions, batch.loss_mask, 4, 1)


# ------------------------------------------------------------------------------------------- through the loop
def test_a_step_stops_early_carries_the_rest_and_the_next_finishes_them(tmp_path):
    eng, lrn = PartialEngine(p_end=0.15), StalenessLearner(1)
    tr = trainer(tmp_path / "run", eng, lrn)
    assert tr.run() == 0
    m = Tracker.store[tr.run_id]
    # 4 + 1 groups in flight, 4 trained: something waits after every step, and some responses span two versions
    assert all(m[M.STALENESS_GROUPS_CARRIED][k] >= 1 for k in range(1, 7))
    assert max(m[M.STALENESS_MAX].values()) == 1 and max(m[M.STALENESS_SPANNING_FRAC].values()) > 0
    assert sum(m[M.STALENESS_TOKENS_CARRIED].values()) > 0
    assert M.STALENESS_PROXIMAL_GAP in m and m[M.CORRECTION_WEIGHT_MEAN][2] == 1.0
    # a carried response is continued under the next version: its versions rise along it
    versions = [row for _, mb in lrn.batches for row, mask in zip(mb.versions, mb.response_mask, strict=True)]
    spanning = [v[v >= 0] for v in versions if len(set(v[v >= 0].tolist())) > 1]
    assert spanning and all(bool((v[1:] >= v[:-1]).all()) for v in spanning)
    # at the end, the checkpoint holds what was in flight (and only a carry-over run writes it)
    carry = ck.load_carry(ck.latest_checkpoint(tmp_path / "run"))
    assert isinstance(carry, Carry) and len(carry.groups) == m[M.STALENESS_GROUPS_CARRIED][6]
    assert carry.tokens() == m[M.STALENESS_TOKENS_CARRIED][6]


def test_a_long_group_is_never_dropped_for_its_age(tmp_path):
    """eta = 1 with responses that rarely end: the groups carried from a step are finished in the next before it
    stops, so every group started is trained (or still in flight at the end); none is left behind."""
    eng, lrn = PartialEngine(p_end=0.08), StalenessLearner(1)
    tr = trainer(tmp_path / "run", eng, lrn)
    assert tr.run() == 0
    trained = [tuple(p) for _, mb in lrn.batches for p in mb.prompt_ids[::3]]
    started = sorted(set(eng.fresh_prompts))
    in_flight = {tuple(g.prompt_ids) for g in tr.io.carry.groups}
    # every update is 2 groups of one mini-batch each epoch: each trained group appears once (epochs=1)
    assert len(trained) == len(set(trained)) == 6 * 4
    assert set(trained) | in_flight == set(started) and not set(trained) & in_flight


def test_eta_zero_never_reaches_the_partial_path(tmp_path):
    """At max_staleness 0 the step samples through `generate` as before: the fake refuses generate_partial."""

    class SyncOnly(PartialEngine):
        def generate(self, prompt_ids, n, max_tokens, temperature=1.0, top_p=1.0, seeds=None):
            return [[Sample([5, EOS], [LOGP] * 2, "stop", "Answer: 1") for _ in range(k)] for k in n]

        def generate_partial(self, *a, **k):
            raise AssertionError("carry-over path at max_staleness 0")

    tr = trainer(tmp_path / "run", SyncOnly(), StalenessLearner(0), "algorithm.rollout_correction=none", eta=0)
    assert tr.run() == 0
    m = Tracker.store[tr.run_id]
    assert not [k for k in m if k.startswith("staleness/")]
    assert tr.components.learner.batches and all(mb.versions is None for _, mb in tr.components.learner.batches)
    assert ck.load_carry(ck.latest_checkpoint(tmp_path / "run")) is None


# ------------------------------------------------------------------------------------------------ the property
def run_to_the_end(run_dir, make_engine, make_learner, overrides, eta, attempts):
    """Run, and after every kill or stop a fresh process (fresh fakes; the learner's weights from the checkpoint)
    until the run is done; the last attempt's trainer, and every attempt's learner."""
    learners = []
    for k in range(attempts + 1):
        lrn = make_learner(k)
        learners.append(lrn)
        tr = trainer(run_dir, make_engine(k), lrn, *overrides, eta=eta)
        try:
            code = tr.run()
        except Killed:
            continue
        if code == 0:
            return tr, learners
        assert code == RESUME_EXIT_CODE
    raise AssertionError("the run did not finish")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    eta=st.integers(1, 2),
    p_end=st.floats(0.05, 0.6),
    dynamic=st.booleans(),
    faults=st.lists(st.tuples(st.sampled_from(["kill", "sigterm", "kill_update"]), st.integers(1, 120)), max_size=3),
)
def test_no_token_too_old_lost_or_repeated_and_kills_resume_to_the_same_run(
    tmp_path_factory, seed, eta, p_end, dynamic, faults
):
    tmp = tmp_path_factory.mktemp("prop")
    overrides = [f"trainer.seed={seed}", "trainer.total_steps=5"]
    if dynamic:
        overrides += [
            "algorithm.dynamic_sampling=true",
            "algorithm.gen_batch_size=4",
            "algorithm.max_num_gen_batches=3",
        ]
    engines = []

    def engine(k: int, plan=()) -> PartialEngine:
        kind, at = plan[k] if k < len(plan) else ("", 0)
        e = PartialEngine(p_end, at if kind == "kill" else 0, at if kind == "sigterm" else 0, ledger=not plan)
        engines.append(e)
        return e

    ref, (ref_lrn,) = run_to_the_end(tmp / "ref", engine, lambda k: StalenessLearner(eta), overrides, eta, 0)
    ref_engine = engines[-1]
    ref_metrics = Tracker.store[ref.run_id]
    # no trained token older than eta: the learner's check ran on every update (StalenessLearner.update), and
    assert all(0 <= v <= eta for v in ref_metrics.get(M.STALENESS_MAX, {}).values())
    # no prompt started twice in an epoch (120 prompts; at most 5 steps x 3 rounds x 5 groups drawn: epoch 0)
    assert Counter(Counter(ref_engine.fresh_prompts).values()) <= Counter({3: 120})  # each its 3 samples, once
    # no token lost or trained twice: every token sampled is counted once; every trained response is one the engine
    # finished (trained at most as often); every aborted response was continued (the engine checks: from exactly
    # what it had) or is still in flight
    assert sum(ref_metrics[M.DS_TOKENS_GENERATED].values()) == ref_engine.emitted
    trained = Counter(
        (tuple(p), tuple(r)) for _, mb in ref_lrn.batches for p, r in zip(mb.prompt_ids, mb.response_ids, strict=True)
    )
    assert not trained - ref_engine.finished
    in_flight = Counter(
        (tuple(g.prompt_ids), tuple(x.response_ids)) for g in ref.io.carry.groups for x in g.samples if not x.finished
    )
    assert +ref_engine.aborted == in_flight

    plan = [(kind, at) for kind, at in faults]
    n_kills = len(plan)
    cut, lrns = run_to_the_end(
        tmp / "cut",
        lambda k: engine(k, [p if p[0] != "kill_update" else ("", 0) for p in plan]),
        lambda k: StalenessLearner(
            eta, kill_at_update=plan[k][1] if k < n_kills and plan[k][0] == "kill_update" else 0
        ),
        overrides,
        eta,
        n_kills,
    )
    assert torch.equal(cut.components.learner.w, ref.components.learner.w)
    got = Tracker.store[cut.run_id]
    for key, points in ref_metrics.items():
        if not key.startswith(("time/", "perf/")):
            assert {s: got[key][s] for s in points} == points, key
