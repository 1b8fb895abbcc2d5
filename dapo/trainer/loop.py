"""The run around the rollout steps: resume, evaluation, checkpoints, stop signals, failures, MLflow and progress.

`step.rollout_step` is the algorithm; this module is the bookkeeping of one run of it, on every rank:

    restore the newest checkpoint (or start) -> [evaluate the base model]
    -> repeat: rollout step -> log -> [evaluate] -> [checkpoint]
    -> final evaluation (unless the last step had one) -> final model, DONE.json

A stop signal (SIGTERM, SIGUSR1) on any rank stops every rank at the same safe point (between generation batches,
updates, eval shards, before DONE): checkpoint, exit RESUME_EXIT_CODE, the restart redoes what was cut off. Rank 0
alone talks to MLflow and writes the run directory's files. docs/failure-modes.md: every failure handled, its test.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from dapo import distributed as dist
from dapo import metric_names as M
from dapo.algos.dynamic_sampling import RefillCapReached
from dapo.evaluation.evaluate import evaluate_on_replicas, write_samples
from dapo.fsio import atomic_write
from dapo.rollout.base import SyncError
from dapo.rollout.replicas import ReplicaLayout, sampling_seed
from dapo.trainer import DONE_FILE, FAILURE_EXIT_CODE, RESUME_EXIT_CODE, TRIPWIRE_EXIT_CODE
from dapo.trainer import checkpoint as ck
from dapo.trainer.carry import Carry
from dapo.trainer.components import Components, MetricsTracker, NullTracker
from dapo.trainer.data_order import PromptSource
from dapo.trainer.progress import Progress
from dapo.trainer.signals import Deadline, StopFlag, job_end_time
from dapo.trainer.step import EVAL_STREAM, Counters, PartialStep, StepIO, StepSettings, StopMidStep, rollout_step
from dapo.trainer.tripwires import TripwireError, Tripwires

log = logging.getLogger("dapo.train")


class NonFiniteError(RuntimeError):
    """Too many non-finite updates in a row."""


class _StopInEval(Exception):  # noqa: N818 (control flow)
    pass


@dataclass(frozen=True)
class RunSettings:
    """Plain values for one run (the run config stops here: `setup.run_settings` reads it)."""

    step: StepSettings
    total_steps: int
    eval_every: int  # 0: evaluate only at the end
    checkpoint_every: int
    keep_checkpoints: int
    stop_margin_s: float  # stop this long before the SLURM job's end
    seed: int
    config_hash: str
    params: dict[str, Any] = field(default_factory=dict)  # logged once, as MLflow params
    tags: dict[str, str] = field(default_factory=dict)  # MLflow tags that line runs up in the UI
    tripwires: Tripwires = field(default_factory=lambda: Tripwires(logprob_gap=None))  # checked after each step
    heartbeat_timeout_s: float | None = None  # several ranks: a peer silent this long is lost (exit 75)


@dataclass
class RunState:
    """What survives a checkpoint (its trainer_state.json): one owner for each of the run's counters."""

    counters: Counters = field(default_factory=Counters)
    elapsed_s: float = 0.0  # wall time of the attempts before this one
    data_order: dict[str, Any] = field(default_factory=dict)  # the seeded prompt order's position
    mlflow_run_id: str | None = None
    config_hash: str = ""
    eval_due: bool = False  # an evaluation of the current weights is owed (at start, or cut off by a stop)

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self.counters),
            "elapsed": self.elapsed_s,
            "data_order": self.data_order,
            "mlflow_run_id": self.mlflow_run_id,
            "config_hash": self.config_hash,
            "eval_due": self.eval_due,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunState:
        return cls(
            counters=Counters(**{k: d[k] for k in asdict(Counters())}),
            elapsed_s=d["elapsed"],
            data_order=d["data_order"],
            mlflow_run_id=d["mlflow_run_id"],
            config_hash=d.get("config_hash", ""),
            eval_due=bool(d.get("eval_due", False)),
        )


class Trainer:
    """One run of `total_steps` rollout steps (or the rest of it, when resuming)."""

    def __init__(
        self,
        settings: RunSettings,
        run_dir: Path,
        components: Components,
        *,
        progress: bool | None = None,
    ) -> None:
        self.settings, self.run_dir, self.components = settings, Path(run_dir), components
        self.progress_rich = progress
        self.layout = ReplicaLayout.of_this_process(components.tensor_parallel_size)
        self.learner = components.learner
        self.prompts = PromptSource(components.problems, components.prompts, settings.seed)
        self._stop = StopFlag()
        self.io = StepIO(
            components.engine,
            self.learner,
            self.prompts,
            self.layout,
            self._stop,
            reference=components.reference,
            tagger=components.tagger,
        )
        self.run_state = RunState(config_hash=settings.config_hash)
        self.partial: PartialStep | None = None  # a step cut off by a stop, to finish first
        self.last_eval: dict[str, float] | None = None
        self.tracker: MetricsTracker = NullTracker()
        self.progress: Progress | None = None
        # stop before the SLURM job's time limit, not only at its signal (rank 0 asks squeue, once)
        self.deadline = Deadline(dist.broadcast(job_end_time() if dist.is_main() else None), settings.stop_margin_s)
        self._t0 = time.monotonic()

    # ---------------------------------------------------------------------------------------------- state
    @property
    def counters(self) -> Counters:
        return self.run_state.counters

    @property
    def run_id(self) -> str | None:
        return self.run_state.mlflow_run_id

    def state(self) -> RunState:
        """The run's state now, as a checkpoint stores it."""
        return replace(
            self.run_state,
            counters=replace(self.run_state.counters),
            elapsed_s=self.elapsed(),
            data_order=self.prompts.order.state_dict(),
        )

    def elapsed(self) -> float:
        return self.run_state.elapsed_s + time.monotonic() - self._t0

    def save(
        self,
        *,
        partial: PartialStep | None = None,
        state: RunState | None = None,
        rng: Any = None,
        carry: Carry | None = None,
    ) -> Path:
        """A checkpoint of the run now (or of `state`, `rng` and `carry`: a step's start); with carry-over, the groups
        in flight beside the data order's position."""
        self.learner.reload_states()  # DeepSpeed saves the states from where they live in training
        state = state or self.state()
        if self.settings.step.max_staleness:
            carry = carry or self.io.carry
        path = ck.save_checkpoint(
            self.run_dir,
            state.counters.step,
            state.to_json(),
            self.learner.save_checkpoint,
            refill=partial,
            keep=self.settings.keep_checkpoints,
            rng=rng,
            carry=carry,
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
        saved = RunState.from_json(state)
        if saved.config_hash != self.settings.config_hash:
            log.warning(
                "resuming %s with a different config (hash %s, checkpoint %s)",
                path,
                self.settings.config_hash,
                saved.config_hash,
            )
        ck.load_learner(self.learner, path)  # weights-only: a checkpoint folder cannot run code
        self.run_state = replace(saved, config_hash=self.settings.config_hash)
        self.prompts.order.load_state_dict(saved.data_order)
        self.io.carry = ck.load_carry(path) or Carry()  # the groups in flight, where the data order left them
        self.partial = partial
        ck.set_rng_state(rng)
        self.components.engine.sync_weights(self.learner.named_parameters_for_sync())
        log.info(
            "resumed from %s at rollout step %d (%d updates)", path, self.counters.step, self.counters.grad_updates
        )
        return True

    # ---------------------------------------------------------------------------------------------- run
    def run(self) -> int:
        """Train (or resume) to `total_steps`; the exit code (0, 1 or 75). An exception propagates once all know."""
        with dist.FailureWatch(
            on_peer_failure=self._peer_failed,
            heartbeat_timeout_s=self.settings.heartbeat_timeout_s,
            on_peer_lost=self._peer_lost,
            lost_exit_code=RESUME_EXIT_CODE,
        ) as watch:
            try:
                return self._run()
            except BaseException as e:
                lost = watch.peer_lost(e)
                if lost is not None:  # a peer vanished mid-collective: resume from the last checkpoint, not a failure
                    self._peer_lost(lost)
                    raise dist.PeerLost(lost) from e
                first = watch.report(e)
                if first is not None and first.startswith(dist.LOST_MARK):
                    # the judge had already found a peer lost (its heartbeat or store gone): this rank's error is
                    # that loss seen from here (NCCL's own words for it vary), so resume, as every rank does
                    self._peer_lost(first[len(dist.LOST_MARK) :])
                    raise dist.PeerLost(first[len(dist.LOST_MARK) :]) from e
                if first is not None:
                    log.error("%s failed first; this rank then failed too", first)
                self._mark("failed", "FAILED")
                raise
            finally:
                if self.progress is not None:
                    self.progress.close()

    def _run(self) -> int:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        resumed = self.restore()
        if dist.is_main():
            self.tracker = self.components.make_tracker(self.run_id)
            self.progress = Progress(self.settings.total_steps, self.counters.step, rich=self.progress_rich)
        if self.run_id is None:
            self.run_state.mlflow_run_id = self.tracker.run_id
            self.tracker.log_params(self.settings.params)
        self.tracker.set_tags(
            {**self.settings.tags, M.TAG_REPLICAS: str(self.layout.num_replicas), M.TAG_STATUS: "running"}
        )
        if not resumed and self.settings.eval_every > 0:
            self.run_state.eval_due = True  # the base model's point
        with self._stop:
            try:
                while True:
                    if self.run_state.eval_due:
                        self._evaluate()
                    if self.counters.step >= self.settings.total_steps:
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
            except (TripwireError, SyncError) as e:  # no checkpoint: the state it would save came from a broken path
                log.error("%s", e)
                self._note(f"STOPPED by a tripwire: {e}")
                self._mark("failed", "FAILED")
                return TRIPWIRE_EXIT_CODE

    def _one_step(self) -> int | None:
        n = self.counters
        t_start = time.monotonic()
        step = n.step + 1
        start_state, start_rng = self.state(), ck.rng_state()
        start_carry = copy.deepcopy(self.io.carry) if self.settings.step.max_staleness else None
        resume, self.partial = self.partial, None
        try:
            metrics = rollout_step(step, self.io, self.settings.step, n, resume)
        except StopMidStep as e:
            self.save(partial=e.partial)
            return self._preempted()
        except RefillCapReached as e:
            # Save the step's start state (it never updated): rerun with a higher cap or at_refill_cap=partial.
            self.save(rng=start_rng, state=start_state, carry=start_carry)
            log.error("%s", e)
            self._mark("failed", "FAILED")
            return FAILURE_EXIT_CODE
        metrics[M.TIME_TOTAL] = self.elapsed()
        self.tracker.log_metrics(_finite(metrics), step=n.step)
        if self.progress is not None:
            self.progress.update(n.step, metrics)
        problem = self.settings.tripwires.check(n.step, metrics)  # every rank holds the same metrics: all stop together
        if problem is not None:
            raise TripwireError(problem)
        limit = self.settings.step.max_consecutive_nonfinite
        if n.gave_up(limit):
            last = ck.latest_checkpoint(self.run_dir)
            raise NonFiniteError(
                f"{n.nonfinite_streak} non-finite updates in a row (trainer.max_consecutive_nonfinite="
                f"{limit}) at rollout step {n.step}: the loss or gradients are "
                f"NaN/inf. Last good checkpoint: {last or 'none'}. Lower trainer.lr, check the data, or resume "
                f"from that checkpoint."
            )
        every = self.settings.eval_every
        self.run_state.eval_due = self.components.eval_set is not None and (
            (every > 0 and n.step % every == 0) or n.step == self.settings.total_steps
        )
        if self.run_state.eval_due:
            self._evaluate()
        if self.deadline.should_stop(time.monotonic() - t_start):  # the next step would end past the margin
            self._stop.request()
        if self._stop_requested():
            self.save()
            return self._preempted()
        every = self.settings.checkpoint_every
        # while updates are being skipped, keep the last good checkpoint rather than overwrite it
        if every and n.step % every == 0 and n.nonfinite_streak == 0:
            self.save()
            self._note(f"checkpoint at step {n.step}")
        return None

    def _stop_requested(self) -> bool:
        """Collective: True on every rank when any rank got a stop signal."""
        return self._stop.anywhere()

    # ---------------------------------------------------------------------------------------------- eval
    def _evaluate(self) -> None:
        """Evaluate on every replica, log at the current step; `_StopInEval` when a stop cuts it (between shards)."""
        es = self.components.eval_set
        if es is None:
            self.run_state.eval_due = False
            return
        t0 = time.perf_counter()
        step, layout, s = self.counters.step, self.layout, self.settings.step
        self.learner.offload_states()
        self.components.engine.wake_up()
        result = evaluate_on_replicas(
            self.components.engine,
            layout,
            es.problems,
            es.prompts,
            es.settings,
            seed_base=sampling_seed(self.settings.seed, EVAL_STREAM, step),
            # shards of a generation batch at most: no worse signal-to-checkpoint latency (samples: `seed_base`)
            shard_sequences=s.train_batch_size * s.n,
            should_stop=self._stop_requested,
        )
        if result is None:
            raise _StopInEval()
        self.run_state.eval_due = False
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
        atomic_write(self.run_dir / DONE_FILE, json.dumps(summary, indent=1, sort_keys=True))
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

    def _peer_lost(self, report: str) -> None:
        """A peer is gone (its host, link or process): the run resumes from its last checkpoint when the job is
        requeued; the MLflow run stays RUNNING, tagged as a preempted one is."""
        log.error("a peer is lost (%s): exit %d, to resume from the last checkpoint", report, RESUME_EXIT_CODE)
        self._note(f"a peer is lost: {report}; exit {RESUME_EXIT_CODE} to resume from the last checkpoint")
        self.tracker.set_tags({M.TAG_STATUS: "preempted"})
        self.tracker.flush()

    def _note(self, text: str) -> None:
        if self.progress is not None:
            self.progress.note(text)


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    """MLflow charts break on NaN: leave out points without a value this step (e.g. Fig 3a with nothing clipped)."""
    return {k: float(v) for k, v in metrics.items() if v is not None and np.isfinite(float(v))}
