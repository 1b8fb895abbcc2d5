"""The trainer loop with fakes (engine, learner, tracker): counters, mini-batch plan, overlong filtering reaching
the learner, colocation order, stop signals between phases (generation batches, updates, evaluation shards, the
final save), resume after a crash, the non-finite guard. Real pieces: tests/test_trainer_e2e.py."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dapo_faults import Faults, FaultyLearner, install

from dapo import metric_names as M
from dapo.config import REPO_ROOT, load_config
from dapo.evaluation.evaluate import EvalSettings
from dapo.learner import UPDATE_SKIPPED
from dapo.rollout.base import per_prompt_counts
from dapo.rollout.replicas import call_seed
from dapo.trainer import FAILURE_EXIT_CODE, RESUME_EXIT_CODE
from dapo.trainer import checkpoint as ck
from dapo.trainer.components import Components, EvalSet
from dapo.trainer.loop import Trainer
from dapo.trainer.setup import run_settings
from dapo.trainer.step import PartialStep
from dapo.types import Problem, Sample


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # what SLURM sends; the trainer's handler only sets its stop flag


class FakeEngine:
    """Answers "Answer: 1" or "Answer: 0" at random (seeded by each call's seeds); every third response is long and
    truncated. `crash_at` raises on that generate call (a simulated kill), `sigterm_at` signals during it. Checks
    that it never samples asleep or with weights not synced since it slept (colocation order)."""

    def __init__(self, crash_at: int | None = None, sigterm_at: int | None = None) -> None:
        self.calls = 0
        self.crash_at, self.sigterm_at = crash_at, sigterm_at
        self.synced: list[float] = []
        self.events: list[str] = []
        self.asleep = False
        self.weights_valid = True

    def generate(self, prompt_ids, n, max_tokens, temperature=1.0, top_p=1.0, seeds=None):
        self.calls += 1
        self.events.append("generate")
        assert not self.asleep and self.weights_valid, "generate on a sleeping engine"
        if self.crash_at is not None and self.calls == self.crash_at:
            raise KeyboardInterrupt("simulated kill")
        if self.sigterm_at is not None and self.calls == self.sigterm_at:
            sigterm()
        g = torch.Generator().manual_seed(call_seed(seeds))
        out = []
        for k in per_prompt_counts(n, len(prompt_ids)):
            bits = torch.randint(0, 2, (k,), generator=g).tolist()
            out.append(
                [
                    Sample(
                        response_ids=[5] * (max_tokens if j % 3 == 2 else 3),
                        logprobs=None,
                        finish_reason="length" if j % 3 == 2 else "stop",
                        text=f"Answer: {b}",
                    )
                    for j, b in enumerate(bits)
                ]
            )
        return out

    def sleep(self):
        self.events.append("sleep")
        self.asleep, self.weights_valid = True, False

    def wake_up(self):
        self.events.append("wake_up")
        assert self.weights_valid, "wake_up before the weights were synced"
        self.asleep = False

    def sync_weights(self, named):
        self.events.append("sync")
        self.synced.append(float(dict(named)["w"].sum()))
        self.weights_valid = True

    def close(self):
        pass


class FakeLearner:
    """w moves by lr * sum(advantage * loss-mask tokens) per update; non-finite advantages skip the update. Its
    states must be on the accelerator (not offloaded) for every call but the weight stream."""

    def __init__(
        self, sigterm_at_update: int | None = None, sigterm_in_save_hf: bool = False, sigterm_at_sync: int = 0
    ) -> None:
        self.w = torch.zeros(2, dtype=torch.float64)
        self.lr = 0.0
        self.lr_steps = 0
        self.minibatches = []
        self.offloaded = False
        self.updates = 0
        self.sigterm_at_update, self.sigterm_in_save_hf = sigterm_at_update, sigterm_in_save_hf
        self.sigterm_at_sync, self.syncs = sigterm_at_sync, 0

    def offload_states(self):
        self.offloaded = True

    def reload_states(self):
        self.offloaded = False

    def compute_logprobs(self, batch):
        assert not self.offloaded
        return torch.zeros_like(batch.loss_mask), torch.full_like(batch.loss_mask, 0.5)

    def padded_fraction(self, batch, *, forward_only):
        return 0.0

    def update(self, mb, *, salt=0):
        assert not self.offloaded
        self.updates += 1
        if self.updates == self.sigterm_at_update:
            sigterm()
        self.minibatches.append(mb)
        g = (mb.advantages.double()[:, None] * mb.loss_mask.double()).sum()
        if not torch.isfinite(g):
            return {UPDATE_SKIPPED: 1.0}
        self.w += 0.01 * g
        return {M.POLICY_LOSS: float(-g), M.GRAD_NORM: float(g.abs()), M.CLIPFRAC_HIGH: 0.0, M.CLIP_HIGH_PROB: math.nan}

    def schedule(self, rollout_step):
        self.lr_steps += 1
        self.lr = 1e-3 * min(1.0, rollout_step / 2)
        return self.lr

    def named_parameters_for_sync(self):
        self.syncs += 1
        if self.syncs == self.sigterm_at_sync:  # as SLURM would, at the end of that rollout step
            sigterm()
        return [("w", self.w.clone())]

    def save_checkpoint(self, path):
        assert not self.offloaded
        path.mkdir(parents=True)
        torch.save({"w": self.w, "lr_steps": self.lr_steps, "lr": self.lr}, path / "s.pt")

    def load_checkpoint(self, path):
        d = torch.load(path / "s.pt")
        self.w, self.lr_steps, self.lr = d["w"], d["lr_steps"], d["lr"]

    def save_hf(self, path):
        if self.sigterm_in_save_hf:
            self.sigterm_in_save_hf = False
            sigterm()
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
        self.rec.setdefault("log", []).append((step, sorted(m)))

    def log_artifact(self, path, artifact_path=None):
        self.rec.setdefault("artifacts", []).append((artifact_path, path.name))

    def flush(self):
        return True

    def finish(self, status="FINISHED"):
        self.rec["status"] = status


PROBLEMS = [Problem(id=str(i), problem=f"p{i}", answer="1") for i in range(20)]
# 20 eval problems x n=2: shards of (train batch 4 x rollout.n 3) // 2 = 6 problems, so 4 shards
EVAL = EvalSet(PROBLEMS, [[i] for i in range(20)], EvalSettings(n=2, max_tokens=8, pass_k=(1, 2), bootstrap=10))


def make(tmp_path, *overrides, engine=None, learner=None, eval_set=None, row="00_naive_grpo"):
    cfg = load_config(
        f"configs/ablations/{row}.yaml",
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
        make_tracker=FakeTracker,
        eval_set=eval_set,
    )
    return Trainer(run_settings(cfg), tmp_path / "run", comps, progress=False)


def metrics_of(tr: Trainer) -> dict:
    return FakeTracker.store[tr.run_id]["metrics"]


def same_run(a: Trainer, b: Trainer) -> None:
    """The same final weights and the same logged values (timings aside) at every step."""
    assert torch.equal(a.components.learner.w, b.components.learner.w)
    ma, mb = metrics_of(a), metrics_of(b)
    assert {k for k in ma if not k.startswith(("time/", "perf/"))} == {
        k for k in mb if not k.startswith(("time/", "perf/"))
    }
    for key in ma:
        if not key.startswith(("time/", "perf/")):
            assert ma[key] == mb[key], key


@pytest.fixture(autouse=True)
def _no_git(monkeypatch):
    FakeTracker.store = {}
    monkeypatch.setattr("dapo.trainer.setup.git_commit", lambda: "test")


def test_counters_minibatches_and_metrics(tmp_path):
    tr = make(tmp_path)
    assert tr.run() == 0
    lrn = tr.components.learner
    # 4 prompts / 2 per mini-batch x 2 epochs = 4 updates per rollout step, never counting generation batches
    assert tr.counters.step == 6 and tr.counters.grad_updates == 24 and lrn.lr_steps == 6
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
    assert rec["tags"][M.TAG_REPLICAS] == "1"
    assert rec["tags"][M.TAG_STATUS] == "finished" and rec["status"] == "FINISHED"
    done = json.loads((tmp_path / "run" / "DONE.json").read_text())
    assert done["step"] == 6 and done["grad_updates"] == 24 and (tmp_path / "run" / "final" / "w.pt").is_file()
    assert tr.components.engine.synced[-1] == pytest.approx(float(lrn.w.sum()))  # the engine holds the final weights


def test_engine_and_learner_take_turns_on_the_accelerator(tmp_path):
    """Colocation: each step the engine samples awake with current weights, sleeps through the updates (the
    fakes assert the learner's states are back for every learner call), and is synced before it wakes."""
    tr = make(tmp_path, "trainer.total_steps=3", eval_set=EVAL)
    assert tr.run() == 0
    ev = tr.components.engine.events
    step = ["wake_up", "generate", "sleep", "sync"]
    # the final evaluation (eval.every=0): 4 shards after the last step's sync
    assert ev == step * 3 + ["wake_up"] + ["generate"] * 4


def test_overlong_filter_zeroes_truncated_rows_in_what_the_learner_sees(tmp_path):
    for row, expect_zero in (("00_naive_grpo", False), ("01_overlong_filtering", True)):
        tr = make(tmp_path / row, "trainer.total_steps=1", "trainer.epochs=1", row=row)
        assert tr.run() == 0
        for mb in tr.components.learner.minibatches:
            truncated = torch.tensor([len(r) == 8 for r in mb.response_ids])  # the fake's cap-length responses
            trunc_rows = mb.loss_mask[truncated]
            assert trunc_rows.numel() > 0
            assert bool((trunc_rows.sum(1) == 0).all()) == expect_zero
            assert bool((mb.loss_mask[~truncated].sum(1) == 3).all())  # the others keep their 3 tokens


def test_sigterm_checkpoints_and_exits_for_resume(tmp_path):
    tr = make(tmp_path, learner=FakeLearner(sigterm_at_sync=3))
    assert tr.run() == RESUME_EXIT_CODE
    latest = ck.latest_checkpoint(tmp_path / "run")
    state, _, _ = ck.load_checkpoint_state(latest)
    assert state["step"] == 3 and state["mlflow_run_id"] == tr.run_id
    assert FakeTracker.store[tr.run_id]["tags"][M.TAG_STATUS] == "preempted"
    tr2 = make(tmp_path)
    assert tr2.run() == 0 and tr2.run_id == tr.run_id and tr2.counters.step == 6


def test_sigterm_between_updates_resumes_to_the_uninterrupted_run(tmp_path):
    """A stop before an update saves the step's batch and the updates done; the restart finishes the step with
    the remaining updates: same weights and metrics as a run never stopped."""
    ref = make(tmp_path / "ref")
    assert ref.run() == 0
    cut = make(tmp_path / "cut", learner=FakeLearner(sigterm_at_update=11))  # step 3, its third update
    assert cut.run() == RESUME_EXIT_CODE
    latest = ck.latest_checkpoint(tmp_path / "cut" / "run")
    state, _, partial = ck.load_checkpoint_state(latest)
    assert isinstance(partial, PartialStep) and len(partial.update_stats) == 3 and state["step"] == 2
    assert state["grad_updates"] == 2 * 4 + 3
    generated = cut.components.engine.calls
    resumed = make(tmp_path / "cut")
    assert resumed.run() == 0
    assert resumed.components.engine.calls == 3  # steps 4-6: step 3's generation was not redone
    assert generated == 3
    same_run(ref, resumed)


def test_sigterm_between_generation_batches_resumes_to_the_uninterrupted_run(tmp_path):
    ds = ("algorithm.dynamic_sampling=true", "algorithm.gen_batch_size=2", "algorithm.max_num_gen_batches=0")
    ref = make(tmp_path / "ref", *ds)
    assert ref.run() == 0
    calls = ref.components.engine.calls
    # 2 prompts a batch, 4 groups to keep: every step needs 2 batches or more; stop in step 2's first one
    first_of_step2 = int(metrics_of(ref)[M.DS_GEN_BATCHES][1]) + 1
    cut = make(tmp_path / "cut", *ds, engine=FakeEngine(sigterm_at=first_of_step2))
    assert cut.run() == RESUME_EXIT_CODE
    _, _, partial = ck.load_checkpoint_state(ck.latest_checkpoint(tmp_path / "cut" / "run"))
    assert isinstance(partial, PartialStep) and not partial.refill.done and partial.batch is None
    resumed = make(tmp_path / "cut", *ds)
    assert resumed.run() == 0
    assert cut.components.engine.calls + resumed.components.engine.calls == calls  # no generation batch done twice
    same_run(ref, resumed)


def test_sigterm_during_evaluation_redoes_that_evaluation_after_resume(tmp_path):
    ref = make(tmp_path / "ref", "eval.every=2", eval_set=EVAL)
    assert ref.run() == 0
    # every step makes one generate call (no dynamic sampling), every eval 4 (shards): step 2's eval is calls
    # 1 (step 0's eval: 4 calls) + 2 steps -> calls 7-10; a signal in call 8 stops it after its second shard
    cut = make(tmp_path / "cut", "eval.every=2", eval_set=EVAL, engine=FakeEngine(sigterm_at=8))
    assert cut.run() == RESUME_EXIT_CODE
    state, _, _ = ck.load_checkpoint_state(ck.latest_checkpoint(tmp_path / "cut" / "run"))
    assert state["step"] == 2 and state["eval_due"] is True
    assert cut.components.engine.calls == 8  # the shards after the signal were not sampled
    assert M.eval_avg(2) not in metrics_of(cut) or 2 not in metrics_of(cut)[M.eval_avg(2)]
    resumed = make(tmp_path / "cut", "eval.every=2", eval_set=EVAL)
    assert resumed.run() == 0
    assert resumed.components.engine.events[:2] == ["sync", "wake_up"]  # restore syncs, then the owed eval runs first
    assert sorted(metrics_of(resumed)[M.eval_avg(2)]) == [0, 2, 4, 6]
    same_run(ref, resumed)
    done = json.loads((tmp_path / "cut" / "run" / "DONE.json").read_text())
    assert done["eval"][M.eval_avg(2)] == metrics_of(ref)[M.eval_avg(2)][6]  # DONE.json carries the final eval


class SeedRecordingEngine(FakeEngine):
    """FakeEngine that records the sampling seed each prompt was generated with, call by call."""

    def __init__(self) -> None:
        super().__init__()
        self.seeds: list[dict[int, int]] = []

    def generate(self, prompt_ids, n, max_tokens, temperature=1.0, top_p=1.0, seeds=None):
        self.seeds.append({p[0]: tuple(s) for p, s in zip(prompt_ids, seeds, strict=True)})
        return super().generate(prompt_ids, n, max_tokens, temperature, top_p, seeds)


def test_every_row_draws_the_same_evaluation_of_the_same_model(tmp_path):
    """Row 05 generates in larger batches (dynamic sampling's gen_batch_size); its evaluation must still split and
    seed the eval exactly as row 00's, or the same base model scores differently at step 0 in the two rows."""
    first_eval = {}
    for row in ("00_naive_grpo", "05_dynamic_sampling"):
        engine = SeedRecordingEngine()
        tr = make(
            tmp_path / row,
            "eval.every=2",
            "trainer.total_steps=2",
            "algorithm.gen_batch_size=12",
            "algorithm.overlong_buffer_len=4",
            row=row,
            eval_set=EVAL,
            engine=engine,
        )
        assert tr.run() == 0
        seeds: dict[int, int] = {}
        for call in engine.seeds:  # the step-0 evaluation: the calls until every eval prompt was sampled once
            if len(seeds) == len(EVAL.problems):
                break
            seeds.update(call)
        first_eval[row] = seeds
        # each evaluation's samples are written for the run's artifact (Table 1's per-problem intervals)
        lines = (tmp_path / row / "run" / M.EVAL_SAMPLES_ARTIFACT).read_text().splitlines()
        assert len(lines) == len(EVAL.problems) * EVAL.settings.n
        assert ("eval", "samples.jsonl") in FakeTracker.store[tr.run_id]["artifacts"]
    assert len(first_eval["00_naive_grpo"]) == len(EVAL.problems)
    assert first_eval["00_naive_grpo"] == first_eval["05_dynamic_sampling"]


def test_sigterm_during_the_final_save_exits_for_resume_then_finishes(tmp_path):
    tr = make(tmp_path, learner=FakeLearner(sigterm_in_save_hf=True))
    assert tr.run() == RESUME_EXIT_CODE
    assert not (tmp_path / "run" / "DONE.json").exists()
    again = make(tmp_path)
    assert again.run() == 0 and again.components.engine.calls == 0  # nothing trained twice
    assert json.loads((tmp_path / "run" / "DONE.json").read_text())["step"] == 6


def test_resume_after_a_crash_matches_the_uninterrupted_run(tmp_path):
    ref = make(tmp_path / "ref")
    assert ref.run() == 0
    crashed = make(tmp_path / "cut", engine=FakeEngine(crash_at=5))  # dies in step 5 (checkpoint at 4)
    with pytest.raises(KeyboardInterrupt):
        crashed.run()
    assert FakeTracker.store[crashed.run_id]["status"] == "FAILED"
    resumed = make(tmp_path / "cut")
    assert resumed.run() == 0
    same_run(ref, resumed)


def test_an_error_after_a_peer_was_judged_lost_resumes_not_fails(tmp_path, monkeypatch):
    """On a GPU cluster a rank whose peer vanished may see it as any NCCL error, not a closed connection; when rank 0
    had already judged the peer lost (the job's first report is a loss), this rank's error is that loss: PeerLost
    (`dapo train` exits 75, the job requeues), the MLflow run left to resume, not FAILED. Any other first report
    stays a failure."""
    from dapo import distributed as dist

    lost = "rank 1 sent no heartbeat for 121 s (trainer.heartbeat_timeout_s=120): its process, its host or its link"
    monkeypatch.setattr(dist.FailureWatch, "report", lambda self, error: dist.LOST_MARK + lost)
    tr = make(tmp_path / "lost", engine=FakeEngine(crash_at=5))
    with pytest.raises(dist.PeerLost, match="rank 1 sent no heartbeat"):
        tr.run()
    rec = FakeTracker.store[tr.run_id]
    assert rec["status"] != "FAILED" and rec["tags"][M.TAG_STATUS] == "preempted"
    monkeypatch.setattr(dist.FailureWatch, "report", lambda self, error: "rank 1: RuntimeError: CUDA out of memory")
    tr = make(tmp_path / "failed", engine=FakeEngine(crash_at=5))
    with pytest.raises(KeyboardInterrupt):
        tr.run()
    assert FakeTracker.store[tr.run_id]["status"] == "FAILED"


def test_nonfinite_updates_are_counted_then_fail_keeping_the_good_checkpoint(tmp_path, monkeypatch):
    # every update from step 3 on is NaN (the tests' fault injection, as DAPO_TEST_POISON_STEP=3 would do)
    faults = Faults(poison_from_step=3)
    install(faults, monkeypatch.setattr)
    learner = FaultyLearner(FakeLearner(), faults)
    tr = make(tmp_path, "trainer.max_consecutive_nonfinite=6", "trainer.checkpoint_every=1", learner=learner)
    assert tr.run() == FAILURE_EXIT_CODE
    m = metrics_of(tr)
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


def test_faults_come_from_the_environment():
    assert Faults.from_env({}) == Faults()
    env = {"DAPO_TEST_POISON_STEP": "3", "DAPO_TEST_FAIL_AT": "1:4", "DAPO_TEST_KILL_AT": "checkpoint.published:2"}
    assert Faults.from_env(env) == Faults(kill_at=("checkpoint.published", 2), fail_at=(1, 4), poison_from_step=3)
    with pytest.raises(ValueError, match="no such point"):
        Faults.from_env({"DAPO_TEST_KILL_AT": "checkpoint.publishd"})


def test_every_logged_name_comes_from_metric_names_and_the_docs_are_current(tmp_path):
    tr = make(tmp_path, "trainer.total_steps=1")
    assert tr.run() == 0
    logged = set(metrics_of(tr))
    assert logged <= set(M.all_training_metrics())
    doc = subprocess.run([sys.executable, "scripts/metrics_doc.py", "--check"], cwd=REPO_ROOT, capture_output=True)
    assert doc.returncode == 0, f"docs/metrics.md is stale: python scripts/metrics_doc.py\n{doc.stderr.decode()}"
    text = (REPO_ROOT / "docs" / "metrics.md").read_text()
    assert "| `reward/accuracy_generated` | `ACC_GENERATED` | accuracy of every response" in text  # comment above


def test_the_completion_marker_is_on_disk_before_the_run_reports_done(tmp_path, monkeypatch):
    """DONE.json tells the workflow a row is finished (it is the rule's output), so it must survive a power loss
    right after the run exits 0: the file's bytes and the rename that publishes it are both fsynced."""
    import dapo.fsio

    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(dapo.fsio.os, "fsync", recording_fsync)
    tr = make(tmp_path)
    assert tr.run() == 0
    run = tmp_path / "run"
    done_tmp = [p for p in synced if Path(p).name.startswith(".DONE.json.tmp")]
    assert done_tmp, synced  # the content, under its temporary name, before the rename
    last_done = max(i for i, p in enumerate(synced) if Path(p).name.startswith(".DONE.json.tmp"))
    assert str(run) in synced[last_done + 1 :]  # then the folder that holds the rename
    assert not list(run.glob(".*.tmp-*"))
