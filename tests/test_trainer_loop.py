"""The trainer loop with fakes (engine, learner, tracker): counters, mini-batch plan, overlong filtering reaching
the learner, the stop signal, resume after a crash, the non-finite guard. Real pieces: tests/test_trainer_e2e.py."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest
import torch

from dapo import metric_names as M
from dapo.config import load_config
from dapo.learner import UPDATE_SKIPPED
from dapo.trainer import FAILURE_EXIT_CODE, RESUME_EXIT_CODE
from dapo.trainer import checkpoint as ck
from dapo.trainer.loop import POISON_ENV, SIGTERM_ENV, Components, Trainer
from dapo.types import Problem, Sample


@dataclass
class Score:
    score: float
    correct: bool


def score_fn(texts, answers):
    return [Score(1.0 if t == a else -1.0, t == a) for t, a in zip(texts, answers, strict=True)]


class FakeEngine:
    """Answers "1" or "0" at random (torch's global RNG, like the HF engine); every third response is long
    and truncated. `crash_at` raises on that generate call (a simulated kill)."""

    def __init__(self, crash_at: int | None = None) -> None:
        self.calls = 0
        self.crash_at = crash_at
        self.synced: list[float] = []

    def generate(self, prompt_ids, n, max_tokens, temperature=1.0, top_p=1.0):
        self.calls += 1
        if self.crash_at is not None and self.calls == self.crash_at:
            raise KeyboardInterrupt("simulated kill")
        out = []
        for p in prompt_ids:
            bits = torch.randint(0, 2, (n,)).tolist()
            out.append(
                [
                    Sample(
                        prompt_ids=p,
                        response_ids=[5] * (max_tokens if j % 3 == 2 else 3),
                        logprobs=None,
                        finish_reason="length" if j % 3 == 2 else "stop",
                        text=str(b),
                    )
                    for j, b in enumerate(bits)
                ]
            )
        return out

    def sleep(self):
        pass

    def wake_up(self):
        pass

    def sync_weights(self, named):
        self.synced.append(float(dict(named)["w"].sum()))


class FakeLearner:
    """w moves by lr * sum(advantage * loss-mask tokens) per update; non-finite advantages skip the update."""

    def __init__(self) -> None:
        self.w = torch.zeros(2, dtype=torch.float64)
        self.lr = 0.0
        self.lr_steps = 0
        self.minibatches = []

    def compute_logprobs(self, batch):
        return torch.zeros_like(batch.loss_mask), torch.full_like(batch.loss_mask, 0.5)

    def update(self, mb):
        self.minibatches.append(mb)
        g = (mb.advantages.double()[:, None] * mb.loss_mask.double()).sum()
        if not torch.isfinite(g):
            return {UPDATE_SKIPPED: 1.0}
        self.w += 0.01 * g
        return {M.POLICY_LOSS: float(-g), M.GRAD_NORM: float(g.abs()), M.CLIPFRAC_HIGH: 0.0, M.CLIP_HIGH_PROB: math.nan}

    def lr_step(self):
        self.lr_steps += 1
        self.lr = 1e-3 * min(1.0, self.lr_steps / 2)

    def named_parameters_for_sync(self):
        return [("w", self.w.clone())]

    def save_checkpoint(self, path):
        path.mkdir(parents=True)
        torch.save({"w": self.w, "lr_steps": self.lr_steps, "lr": self.lr}, path / "s.pt")

    def load_checkpoint(self, path):
        d = torch.load(path / "s.pt")
        self.w, self.lr_steps, self.lr = d["w"], d["lr_steps"], d["lr"]

    def save_hf(self, path):
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.w, path / "w.pt")


class FakeTracker:
    store: dict[str, dict] = {}

    def __init__(self, run_id):
        self.run_id = run_id or f"run{len(self.store)}"
        self.rec = self.store.setdefault(self.run_id, {"metrics": {}, "params": {}, "tags": {}, "status": None})

    def log_params(self, p):
        self.rec["params"].update(p)

    def set_tags(self, t):
        self.rec["tags"].update(t)

    def log_metrics(self, m, step):
        for k, v in m.items():
            self.rec["metrics"].setdefault(k, {})[step] = v

    def log_artifact(self, path):
        pass

    def flush(self):
        return True

    def finish(self, status="FINISHED"):
        self.rec["status"] = status


PROBLEMS = [Problem(id=str(i), problem=f"p{i}", answer="1") for i in range(20)]


def make(tmp_path, *overrides, engine=None, learner=None, evaluate=None):
    cfg = load_config(
        "configs/ablations/00_naive_grpo.yaml",
        preset="tiny",
        overrides=[
            "trainer.total_steps=6",
            "trainer.train_batch_size=4",
            "trainer.mini_batch_size=2",
            "trainer.epochs=2",
            "rollout.n=3",
            "rollout.max_response_length=8",
            "trainer.checkpoint_every=2",
            "eval.every=0",
            *overrides,
        ],
    )
    comps = Components(
        engine=engine or FakeEngine(),
        learner=learner or FakeLearner(),
        problems=PROBLEMS,
        prompts=[[i] for i in range(20)],
        score_fn=score_fn,
        make_tracker=FakeTracker,
        evaluate=evaluate,
    )
    return Trainer(cfg, tmp_path / "run", comps, progress=False)


@pytest.fixture(autouse=True)
def _no_git(monkeypatch):
    FakeTracker.store = {}
    monkeypatch.setattr("dapo.trainer.setup.git_commit", lambda: "test")


def test_counters_minibatches_and_metrics(tmp_path):
    tr = make(tmp_path)
    assert tr.run() == 0
    lrn = tr.c.learner
    # 4 prompts / 2 per mini-batch x 2 epochs = 4 updates per rollout step, never counting generation batches
    assert tr.step == 6 and tr.grad_updates == 24 and lrn.lr_steps == 6
    assert len(lrn.minibatches) == 24 and all(len(mb) == 2 * 3 for mb in lrn.minibatches)
    # each epoch covers every group once: the two mini-batches of an epoch hold distinct prompts
    a, b = lrn.minibatches[0].prompt_ids, lrn.minibatches[1].prompt_ids
    assert not {tuple(x) for x in a} & {tuple(x) for x in b}
    rec = FakeTracker.store[tr.run_id]
    m = rec["metrics"]
    assert sorted(m[M.ROLLOUT_STEP]) == list(range(1, 7))
    assert m[M.GRAD_UPDATES][6] == 24
    assert m[M.LR][1] == 0.0 and m[M.LR][2] == 5e-4 and m[M.LR][3] == 1e-3  # lr logged before its step
    assert m[M.RESP_TRUNC_FRAC][1] == pytest.approx(1 / 3)
    assert m[M.ENTROPY][1] == pytest.approx(0.5)
    assert M.CLIP_HIGH_PROB not in m  # NaN (nothing clipped) is left out, not logged as 0
    assert m[M.DS_GEN_BATCHES][1] == 1 and m[M.DS_TOKENS_GENERATED][1] == 4 * (3 + 3 + 8)
    assert rec["params"]["algorithm.eps_high"] == 0.2 and rec["tags"][M.TAG_ROW] == "00_naive_grpo"
    assert rec["tags"][M.TAG_STATUS] == "finished" and rec["status"] == "FINISHED"
    done = json.loads((tmp_path / "run" / "DONE.json").read_text())
    assert done["step"] == 6 and done["grad_updates"] == 24 and (tmp_path / "run" / "final" / "w.pt").is_file()
    assert tr.c.engine.synced[-1] == pytest.approx(float(lrn.w.sum()))  # the engine holds the final weights


def test_overlong_filter_zeroes_truncated_rows_in_what_the_learner_sees(tmp_path):
    for row, expect_zero in (("00_naive_grpo", False), ("01_overlong_filtering", True)):
        tr = make(tmp_path / row, "trainer.total_steps=1")
        tr.cfg = load_config(
            f"configs/ablations/{row}.yaml",
            preset="tiny",
            overrides=[
                "trainer.total_steps=1",
                "trainer.train_batch_size=4",
                "trainer.mini_batch_size=2",
                "rollout.n=3",
                "rollout.max_response_length=8",
                "eval.every=0",
            ],
        )
        assert tr.run() == 0
        for mb in tr.c.learner.minibatches:
            truncated = torch.tensor([len(r) == 8 for r in mb.response_ids])  # the fake's cap-length responses
            trunc_rows = mb.loss_mask[truncated]
            assert trunc_rows.numel() > 0
            assert bool((trunc_rows.sum(1) == 0).all()) == expect_zero
            assert bool((mb.loss_mask[~truncated].sum(1) == 3).all())  # the others keep their 3 tokens


def test_sigterm_checkpoints_and_exits_for_resume(tmp_path, monkeypatch):
    monkeypatch.setenv(SIGTERM_ENV, "3")
    tr = make(tmp_path)
    assert tr.run() == RESUME_EXIT_CODE
    latest = ck.latest_checkpoint(tmp_path / "run")
    state, _, _ = ck.load_checkpoint_state(latest)
    assert state["step"] == 3 and state["mlflow_run_id"] == tr.run_id
    assert FakeTracker.store[tr.run_id]["tags"][M.TAG_STATUS] == "preempted"
    monkeypatch.delenv(SIGTERM_ENV)
    tr2 = make(tmp_path)
    assert tr2.run() == 0 and tr2.run_id == tr.run_id and tr2.step == 6


def test_resume_after_a_crash_matches_the_uninterrupted_run(tmp_path):
    ref = make(tmp_path / "ref")
    assert ref.run() == 0
    crashed = make(tmp_path / "cut", engine=FakeEngine(crash_at=5))  # dies in step 5 (checkpoint at 4)
    with pytest.raises(KeyboardInterrupt):
        crashed.run()
    resumed = make(tmp_path / "cut")
    assert resumed.run() == 0
    assert torch.equal(resumed.c.learner.w, ref.c.learner.w)
    a = FakeTracker.store[ref.run_id]["metrics"]
    b = FakeTracker.store[resumed.run_id]["metrics"]
    for key in a:
        if not key.startswith(("time/", "perf/")):
            assert a[key] == b[key], key


def test_nonfinite_updates_are_counted_then_fail_keeping_the_good_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv(POISON_ENV, "3")  # every update from step 3 on is NaN
    tr = make(tmp_path, "trainer.max_consecutive_nonfinite=6", "trainer.checkpoint_every=1")
    assert tr.run() == FAILURE_EXIT_CODE
    m = FakeTracker.store[tr.run_id]["metrics"]
    assert m[M.NONFINITE_SKIPPED] == {1: 0, 2: 0, 3: 4, 4: 6}  # 4 updates a step; stops and fails at 6
    assert ck.latest_checkpoint(tmp_path / "run").name == "step_000002"
    assert FakeTracker.store[tr.run_id]["status"] == "FAILED"


def test_dynamic_sampling_refill_cap_fail_leaves_a_checkpoint(tmp_path):
    tr = make(
        tmp_path,
        "algorithm.dynamic_sampling=true",
        "algorithm.max_num_gen_batches=1",
        "algorithm.at_refill_cap=fail",
        "algorithm.gen_batch_size=1",
    )
    assert tr.run() == FAILURE_EXIT_CODE
    state, _, _ = ck.load_checkpoint_state(ck.latest_checkpoint(tmp_path / "run"))
    assert state["step"] == 0 and state["data_order"]["position"] == 0  # the state before the failed step


def test_every_logged_name_comes_from_metric_names_and_the_docs_are_current(tmp_path):
    from dapo.trainer.metrics_doc import main as metrics_doc

    tr = make(tmp_path, "trainer.total_steps=1")
    assert tr.run() == 0
    logged = set(FakeTracker.store[tr.run_id]["metrics"])
    assert logged <= set(M.all_training_metrics())
    assert metrics_doc(["--check"]) == 0, "docs/metrics.md is stale: python -m dapo.trainer.metrics_doc"
