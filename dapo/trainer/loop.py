"""The run around the rollout steps: resume, evaluation, checkpoints, stop signals, failures, MLflow and progress.

`step.rollout_step` is the algorithm; this module is the bookkeeping of one run of it, on every rank:

    restore the newest checkpoint (or start) -> [evaluate the base model]
    -> repeat: rollout step -> log -> [evaluate] -> [checkpoint]
    -> final evaluation (unless the last step had one) -> final model, DONE.json

Safety: checkpoints every `checkpoint_every` steps (atomic, see `checkpoint.py`). A stop signal (SIGTERM, SIGUSR1)
is honoured between phases: generation batches, updates, evaluation shards, and before the run is declared done;
the trainer checkpoints what it has (a part-done step or a pending evaluation included), exits with
RESUME_EXIT_CODE, and the restarted run redoes what was cut off. A signal seen by any rank stops every rank at
the same point. Non-finite updates are skipped by the learner and counted; `max_consecutive_nonfinite` in a row
fails the run without overwriting the last good checkpoint. An exception on any rank ends every rank with the
failure code, naming the rank and the error (`dapo.distributed.FailureWatch`).

Several ranks (torchrun / srun): every rank generates (its rollout replica's share), trains its shard, and writes
its part of each checkpoint; rank 0 alone talks to MLflow, shows progress and writes the run directory's own files.

Test hooks, read from the environment here and nowhere else (`TestHooks`): a non-finite loss from a step on, a
stop signal after a step, an exception on one rank at a step.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dapo import distributed as dist
from dapo import metric_names as M
from dapo.algos.dynamic_sampling import RefillCapReached
from dapo.config import RunConfig
from dapo.evaluation.evaluate import evaluate_on_replicas, write_samples
from dapo.fsio import atomic_write
from dapo.learner.batch import PolicyBatch
from dapo.rollout.replicas import ReplicaLayout, sampling_seed
from dapo.trainer import FAILURE_EXIT_CODE, RESUME_EXIT_CODE
from dapo.trainer import checkpoint as ck
from dapo.trainer.collect import EVAL_STREAM, ReplicaSampler, RolloutSettings, StopDuringRefill
from dapo.trainer.components import Components, MetricsTracker, NullTracker, PolicyLearner
from dapo.trainer.data_order import PromptOrder
from dapo.trainer.progress import Progress
from dapo.trainer.setup import run_tags
from dapo.trainer.signals import Deadline, StopFlag, job_end_time
from dapo.trainer.step import Counters, PartialStep, StepSettings, StopMidStep, rollout_step
from dapo.types import Problem

log = logging.getLogger("dapo.train")

# Test hook: from this rollout step on, advantages are NaN, so every update's loss is non-finite.
POISON_ENV = "DAPO_TEST_POISON_STEP"
# Test hook: raise SIGTERM at the end of this rollout step (as SLURM would), to test the stop path.
SIGTERM_ENV = "DAPO_TEST_SIGTERM_STEP"
# Test hook: "RANK:STEP": that rank raises in the middle of that rollout step (its first update); step 0: while the
# run's parts are built, before the learner joins the others in its first collective.
FAIL_ENV = "DAPO_TEST_FAIL_AT"


class NonFiniteError(RuntimeError):
    """Too many non-finite updates in a row."""


class _StopInEval(Exception):  # noqa: N818 (control flow)
    pass


@dataclass(frozen=True)
class TestHooks:
    """Ways for tests to make a run fail or stop at a chosen point (0 / None: off)."""

    __test__ = False  # not a pytest class

    poison_from_step: int = 0
    sigterm_after_step: int = 0
    fail_at: tuple[int, int] | None = None  # (rank, step)

    @classmethod
    def from_env(cls) -> TestHooks:
        fail = os.environ.get(FAIL_ENV, "")
        return cls(
            poison_from_step=int(os.environ.get(POISON_ENV, "0") or 0),
            sigterm_after_step=int(os.environ.get(SIGTERM_ENV, "0") or 0),
            fail_at=tuple(int(x) for x in fail.split(":")) if fail else None,  # type: ignore[arg-type]
        )

    def fail_while_building(self) -> None:
        if self.fail_at is not None and self.fail_at == (dist.rank(), 0):
            raise RuntimeError(f"test hook {FAIL_ENV}: rank {dist.rank()} fails while the run is built")


class _HookedLearner:
    """The learner with the test hooks' faults injected into `update` (a `PolicyLearner`; the rest delegates)."""

    def __init__(self, inner: PolicyLearner, hooks: TestHooks) -> None:
        self._inner, self._hooks = inner, hooks
        self.step = 0  # the rollout step in progress (set by the trainer)

    def update(self, batch: PolicyBatch) -> dict[str, float]:
        h = self._hooks
        if h.fail_at is not None and h.fail_at == (dist.rank(), self.step):
            raise RuntimeError(f"test hook {FAIL_ENV}: rank {dist.rank()} fails in rollout step {self.step}")
        if h.poison_from_step and self.step >= h.poison_from_step:
            batch = replace(batch, advantages=torch.full_like(batch.advantages, float("nan")))
        return self._inner.update(batch)

    @property
    def lr(self) -> float:
        return self._inner.lr

    def compute_logprobs(self, batch: PolicyBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self._inner.compute_logprobs(batch)

    def lr_step(self) -> float:
        return self._inner.lr_step()

    def named_parameters_for_sync(self) -> Iterable[tuple[str, torch.Tensor]]:
        return self._inner.named_parameters_for_sync()

    def offload_states(self) -> None:
        self._inner.offload_states()

    def reload_states(self) -> None:
        self._inner.reload_states()

    def save_checkpoint(self, directory: Path) -> None:
        self._inner.save_checkpoint(directory)

    def load_checkpoint(self, directory: Path) -> None:
        self._inner.load_checkpoint(directory)

    def save_hf(self, directory: Path) -> None:
        self._inner.save_hf(directory)


class Trainer:
    """One run of `total_steps` rollout steps (or the rest of it, when resuming)."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        components: Components,
        *,
        progress: bool | None = None,
        hooks: TestHooks | None = None,
    ) -> None:
        self.cfg, self.run_dir, self.c = cfg, Path(run_dir), components
        self.progress_rich = progress
        self.hooks = TestHooks.from_env() if hooks is None else hooks
        t, a, r = cfg.trainer, cfg.algorithm, cfg.rollout
        self.settings = StepSettings(
            rollout=RolloutSettings(
                n=r.n,
                max_tokens=r.max_response_length,
                temperature=r.temperature,
                top_p=r.top_p,
                overlong_penalty=a.overlong_penalty,
                overlong_buffer_len=a.overlong_buffer_len,
                overlong_penalty_factor=a.overlong_penalty_factor,
                dynamic_sampling=a.dynamic_sampling,
                train_batch_size=t.train_batch_size,
                gen_batch_size=a.gen_batch_size,
                max_num_gen_batches=a.max_num_gen_batches,
                at_refill_cap=a.at_refill_cap,
            ),
            norm_adv_by_std=a.norm_adv_by_std,
            overlong_filter=a.overlong_filter,
            mini_batch_size=t.mini_batch_size,
            epochs=t.epochs,
            seed=t.seed,
            max_consecutive_nonfinite=t.max_consecutive_nonfinite,
            pack_prompts=t.pack_prompts,
        )
        self.layout = ReplicaLayout.of_this_process(components.tensor_parallel_size)
        self.learner = _HookedLearner(components.learner, self.hooks)
        self.sampler = ReplicaSampler(
            components.engine,
            components.scorer,
            self.layout,
            self.settings.rollout,
            t.seed + r.sampling_seed_offset,
            components.tagger,
        )
        self.order = PromptOrder(len(components.problems), t.seed)
        self.counters = Counters()
        self.elapsed_before = 0.0  # wall time of earlier attempts (resume)
        self.run_id: str | None = None
        self.partial: PartialStep | None = None  # a step cut off by a stop, to finish first
        self.eval_due = False  # an evaluation of the current weights is owed (at start, or cut off by a stop)
        self.last_eval: dict[str, float] | None = None
        self.tracker: MetricsTracker = NullTracker()
        self.progress: Progress | None = None
        self._stop = StopFlag()
        # stop before the SLURM job's time limit, not only at its signal (rank 0 asks squeue, once)
        self.deadline = Deadline(dist.broadcast(job_end_time() if dist.is_main() else None), t.stop_margin_s)
        self._t0 = time.monotonic()

    # ---------------------------------------------------------------------------------------------- state
    def state(self) -> dict[str, Any]:
        return {
            **asdict(self.counters),
            "elapsed": self.elapsed(),
            "data_order": self.order.state_dict(),
            "mlflow_run_id": self.run_id,
            "config_hash": self.cfg.config_hash(),
            "eval_due": self.eval_due,
        }

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self._t0

    def save(self, *, partial: PartialStep | None = None, state: dict | None = None, rng: Any = None) -> Path:
        self.learner.reload_states()  # DeepSpeed saves the states from where they live in training
        path = ck.save_checkpoint(
            self.run_dir,
            self.counters.step,
            state or self.state(),
            self.learner.save_checkpoint,
            refill=partial,
            keep=self.cfg.trainer.keep_checkpoints,
            rng=rng,
        )
        if dist.is_main():
            log.info("checkpoint %s", path)
        return path

    def restore(self) -> bool:
        """Load the newest complete checkpoint, if any. True when resuming."""
        path = ck.latest_checkpoint(self.run_dir)
        if path is None:
            return False
        state, rng, partial = ck.load_checkpoint_state(path)
        if state.get("config_hash") != self.cfg.config_hash():
            log.warning(
                "resuming %s with a different config (hash %s, checkpoint %s)",
                path,
                self.cfg.config_hash(),
                state.get("config_hash"),
            )
        ck.load_learner(self.learner, path)  # weights-only: a checkpoint folder cannot run code
        self.counters = Counters(**{k: state[k] for k in asdict(Counters())})
        self.elapsed_before = state["elapsed"]
        self.order.load_state_dict(state["data_order"])
        self.run_id = state["mlflow_run_id"]
        self.eval_due = bool(state.get("eval_due", False))
        # a checkpoint written mid-refill by an earlier version holds collect's state itself
        self.partial = partial if isinstance(partial, PartialStep) or partial is None else PartialStep(refill=partial)
        ck.set_rng_state(rng)
        self.c.engine.sync_weights(self.learner.named_parameters_for_sync())
        log.info(
            "resumed from %s at rollout step %d (%d updates)", path, self.counters.step, self.counters.grad_updates
        )
        return True

    # ---------------------------------------------------------------------------------------------- run
    def run(self) -> int:
        """Train to `total_steps` (or resume and finish). Returns the process exit code (0, 1 or 75); an
        exception on this rank propagates after every rank has been told."""
        with dist.FailureWatch(on_peer_failure=self._peer_failed) as watch:
            try:
                return self._run()
            except BaseException as e:
                first = watch.report(e)
                if first is not None:
                    log.error("%s failed first; this rank then failed too", first)
                self._mark("failed", "FAILED")
                raise
            finally:
                if self.progress is not None:
                    self.progress.close()

    def _run(self) -> int:
        cfg = self.cfg
        if dist.broadcast((self.run_dir / "DONE.json").is_file()):
            log.info("%s/DONE.json exists: this run is finished, nothing to do", self.run_dir)
            return 0
        self.run_dir.mkdir(parents=True, exist_ok=True)
        resumed = self.restore()
        if dist.is_main():
            self.tracker = self.c.make_tracker(self.run_id)
            self.progress = Progress(cfg.trainer.total_steps, self.counters.step, rich=self.progress_rich)
        if self.run_id is None:
            self.run_id = self.tracker.run_id
            self.tracker.log_params(cfg.flat())
        self.tracker.set_tags({**run_tags(cfg), M.TAG_REPLICAS: str(self.layout.num_replicas), M.TAG_STATUS: "running"})
        if not resumed and cfg.eval.every > 0:
            self.eval_due = True  # the base model's point
        with self._stop:
            try:
                while True:
                    if self.eval_due:
                        self._evaluate()
                    if self.counters.step >= cfg.trainer.total_steps:
                        break
                    code = self._one_step()
                    if code is not None:
                        return code
                if self._stop_requested():  # a signal during the final evaluation: leave DONE.json to the restart
                    self.save()
                    return self._preempted()
                return self._finish()
            except _StopInEval:
                self.save()  # eval_due stays set: the restarted run evaluates these weights first
                return self._preempted()
            except NonFiniteError as e:
                log.error("%s", e)
                self._note(f"FAILED: {e}")
                self._mark("failed", "FAILED")
                return FAILURE_EXIT_CODE

    def _one_step(self) -> int | None:
        cfg, n = self.cfg, self.counters
        t_start = time.monotonic()
        step = n.step + 1
        start_state, start_rng = self.state(), ck.rng_state()
        resume, self.partial = self.partial, None
        self.learner.step = step
        try:
            metrics = rollout_step(
                step,
                self.sampler.for_step(step),
                self._next_prompts,
                self.c.engine,
                self.learner,
                self.settings,
                n,
                reference=self.c.reference,
                tagger=self.c.tagger,
                should_stop=self._stop_requested,
                resume=resume,
            )
        except StopDuringRefill as e:
            self.save(partial=PartialStep(refill=e.state))
            return self._preempted()
        except StopMidStep as e:
            self.save(partial=e.partial)
            return self._preempted()
        except RefillCapReached as e:
            # Never fail at the cap without saved state. The step never updated the model, so the checkpoint is
            # the state at its start: rerun with a higher cap (or at_refill_cap=partial) to go on.
            self.save(rng=start_rng, state=start_state)
            log.error("%s", e)
            self._mark("failed", "FAILED")
            return FAILURE_EXIT_CODE
        metrics[M.TIME_TOTAL] = self.elapsed()
        self.tracker.log_metrics(_finite(metrics), step=n.step)
        if self.progress is not None:
            self.progress.update(n.step, metrics)
        if n.nonfinite_streak >= cfg.trainer.max_consecutive_nonfinite:
            last = ck.latest_checkpoint(self.run_dir)
            raise NonFiniteError(
                f"{n.nonfinite_streak} non-finite updates in a row (trainer.max_consecutive_nonfinite="
                f"{cfg.trainer.max_consecutive_nonfinite}) at rollout step {n.step}: the loss or gradients are "
                f"NaN/inf. Last good checkpoint: {last or 'none'}. Lower trainer.lr, check the data, or resume "
                f"from that checkpoint."
            )
        every = cfg.eval.every
        self.eval_due = self.c.eval_set is not None and (
            (every > 0 and n.step % every == 0) or n.step == cfg.trainer.total_steps
        )
        if self.eval_due:
            self._evaluate()
        if self.hooks.sigterm_after_step and n.step == self.hooks.sigterm_after_step:
            self._stop.request()
        if self.deadline.should_stop(time.monotonic() - t_start):  # the next step would end past the margin
            self._stop.request()
        if self._stop_requested():
            self.save()
            return self._preempted()
        every = cfg.trainer.checkpoint_every
        # while updates are being skipped, keep the last good checkpoint rather than overwrite it
        if every and n.step % every == 0 and n.nonfinite_streak == 0:
            self.save()
            self._note(f"checkpoint at step {n.step}")
        return None

    def _next_prompts(self, k: int) -> tuple[list[Problem], list[list[int]]]:
        idx = self.order.take(k)
        return [self.c.problems[i] for i in idx], [self.c.prompts[i] for i in idx]

    def _stop_requested(self) -> bool:
        """Collective: True on every rank when any rank got a stop signal."""
        return dist.any_rank(self._stop.requested)

    # ---------------------------------------------------------------------------------------------- eval
    def _evaluate(self) -> None:
        """Evaluate the current weights on every replica and log at the current step; raises `_StopInEval` when a
        stop request cuts it off (between shards)."""
        es = self.c.eval_set
        if es is None:
            self.eval_due = False
            return
        t0 = time.perf_counter()
        step, layout, r = self.counters.step, self.layout, self.cfg.rollout
        self.learner.offload_states()
        self.c.engine.wake_up()
        result = evaluate_on_replicas(
            self.c.engine,
            layout,
            es.problems,
            es.prompts,
            es.settings,
            seed_for=lambda shard: sampling_seed(self.cfg.trainer.seed, EVAL_STREAM, step, shard, layout.replica),
            # shards of the train batch: the same shards, and so the same sampling seeds, in every row of a ladder
            # (dynamic sampling's larger generation batch would otherwise draw a different eval of the same
            # model); no longer than a training generation batch, so evaluation adds nothing to the worst-case
            # signal-to-checkpoint latency
            shard_sequences=self.settings.rollout.train_batch_size * r.n,
            should_stop=self._stop_requested,
        )
        if result is None:
            raise _StopInEval()
        self.eval_due = False
        metrics = dict(result.metrics)
        metrics[M.TIME_EVAL] = time.perf_counter() - t0
        self.tracker.log_metrics(_finite(metrics), step=step)
        self.last_eval = metrics
        if dist.is_main():  # the samples behind the metrics: Table 1's intervals over problems read them
            samples = write_samples(result.samples, self.run_dir / M.EVAL_SAMPLES_ARTIFACT)
            self.tracker.log_artifact(samples, artifact_path=M.EVAL_SAMPLES_FOLDER)
        shown = {k: v for k, v in metrics.items() if k.startswith(M.EVAL_PREFIX + "/") and "_ci_" not in k}
        self._note(f"eval at step {step}: " + "  ".join(f"{k} {v:.3f}" for k, v in shown.items()))

    # ---------------------------------------------------------------------------------------------- endings
    def _preempted(self) -> int:
        self._note(
            f"stopped by signal at rollout step {self.counters.step}; checkpoint written, exit "
            f"{RESUME_EXIT_CODE} (run the same command to resume)"
        )
        self.tracker.set_tags({M.TAG_STATUS: "preempted"})
        self.tracker.flush()
        return RESUME_EXIT_CODE

    def _finish(self) -> int:
        final = self.run_dir / "final"
        self.learner.reload_states()
        self.learner.save_hf(final)
        last = ck.latest_checkpoint(self.run_dir)
        if dist.broadcast(last is None or ck.load_checkpoint_state(last)[0]["step"] != self.counters.step):
            self.save()
        if self._stop_requested():  # a signal during the final save: the restart redoes it
            return self._preempted()
        if not dist.is_main():
            return 0
        n = self.counters
        summary = {
            "run_id": self.run_id,
            "step": n.step,
            "grad_updates": n.grad_updates,
            "nonfinite_skipped": n.nonfinite_total,
            "elapsed_s": self.elapsed(),
            "final_model": str(final),
            "eval": self.last_eval or {},
        }
        atomic_write(self.run_dir / "metrics.json", json.dumps(summary, indent=1, sort_keys=True))
        atomic_write(self.run_dir / "DONE.json", json.dumps(summary, indent=1, sort_keys=True))
        self.tracker.log_artifact(self.run_dir / "metrics.json")
        self._mark("finished", "FINISHED")
        self._note(f"done: {n.step} rollout steps, {n.grad_updates} updates; model in {final}")
        return 0

    def _mark(self, status: str, mlflow_status: str) -> None:
        self.tracker.set_tags({M.TAG_STATUS: status})
        self.tracker.finish(mlflow_status)

    def _peer_failed(self, report: str) -> None:
        self._note(f"FAILED: {report}")
        self._mark("failed", "FAILED")

    def _note(self, text: str) -> None:
        if self.progress is not None:
            self.progress.note(text)


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    """MLflow charts break on NaN: leave out points that have no value this step (e.g. Fig 3a with nothing
    clipped)."""
    return {k: float(v) for k, v in metrics.items() if v is not None and np.isfinite(float(v))}
