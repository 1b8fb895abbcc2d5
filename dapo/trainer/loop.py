"""The training loop of one ablation row (SPEC sections 2-5); rows 0-5 differ only in config.

One rollout step:

    prompts (seeded order) -> generate G each -> score (+1/-1) -> shape (soft overlong penalty, row 3)
      -> dynamic-sampling refill (row 5) -> group advantages -> overlong-filter loss mask (row 1)
      -> old log-probs (learner) -> updates_per_step mini-batch updates -> metrics -> lr step -> weight sync

Counters: `step` counts rollout steps (the lr schedule's unit), `grad_updates` counts optimizer updates (the
paper's x-axis); generation batches are counted separately and never advance either.

Safety: checkpoints every `checkpoint_every` steps (atomic, see `checkpoint.py`); a stop signal ends the step at
the next safe point (a signal seen by any rank stops every rank at the same step), checkpoints and exits with
RESUME_EXIT_CODE; non-finite updates are skipped by the learner and counted here, and `max_consecutive_nonfinite`
in a row fails the run without overwriting the last good checkpoint.

Several ranks (torchrun / srun, see `dist.py`): rank 0 collects the step (generate, score, refill) and broadcasts
it; every rank builds the same batch and computes old log-probs and updates on its `shard` (whole groups); the
learner all-reduces the normaliser, so the update equals the one-process update. Rank 0 alone talks to the
engine, MLflow, the progress display and the run directory's own files; checkpoints are collective.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dapo import metric_names as M
from dapo.algos.dynamic_sampling import RefillCapReached
from dapo.config import RunConfig
from dapo.learner.learner import UPDATE_SKIPPED
from dapo.trainer import FAILURE_EXIT_CODE, RESUME_EXIT_CODE, dist
from dapo.trainer import checkpoint as ck
from dapo.trainer.batch import ResponseBatch, build_batch, group_rows, minibatch_plan
from dapo.trainer.collect import RolloutSettings, ScoreFn, StopDuringRefill, collect
from dapo.trainer.data_order import PromptOrder
from dapo.trainer.metrics import mean_update_stats, rollout_metrics
from dapo.trainer.progress import Progress
from dapo.trainer.setup import run_tags
from dapo.trainer.signals import StopFlag
from dapo.types import Problem

log = logging.getLogger("dapo.train")

# Test hook: from this rollout step on, advantages are NaN, so every update's loss is non-finite.
POISON_ENV = "DAPO_TEST_POISON_STEP"
# Test hook: raise SIGTERM at the end of this rollout step (as SLURM would), to test the stop path.
SIGTERM_ENV = "DAPO_TEST_SIGTERM_STEP"
# Keys the learner's update() reports, averaged over the step's updates.
UPDATE_KEYS = (
    M.POLICY_LOSS,
    M.CLIPFRAC_LOW,
    M.CLIPFRAC_HIGH,
    M.CLIP_HIGH_PROB,
    M.DUAL_CLIPFRAC,
    M.APPROX_KL,
    M.KL_REF,
    M.GRAD_NORM,
)


class NonFiniteError(RuntimeError):
    """Too many non-finite updates in a row."""


@dataclass
class Components:
    """Everything the loop talks to (built by `setup.build_components`, or fakes in tests)."""

    engine: Any  # dapo.rollout.RolloutEngine
    learner: Any  # dapo.learner.Learner
    problems: list[Problem]  # training prompts (raw) ...
    prompts: list[list[int]]  # ... and their token ids (template applied)
    score_fn: ScoreFn
    make_tracker: Callable[[str | None], Any]  # run id (None: new run) -> dapo.tracking.Tracker
    evaluate: Callable[[Any], dict[str, float]] | None = None  # engine -> eval metrics (metric_names keys)


def seed_step(seed: int, step: int) -> None:
    """Seed every RNG from (seed, step): a step's sampling is then a function of the state at its start, so a
    resumed run reproduces it (the HF engine samples from torch's global generator)."""
    s = int(np.random.default_rng([seed, step]).integers(2**31 - 1))
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


class Trainer:
    def __init__(self, cfg: RunConfig, run_dir: Path, components: Components, *, progress: bool | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.c = components
        self.progress_rich = progress
        t, a, r = cfg.trainer, cfg.algorithm, cfg.rollout
        self.settings = RolloutSettings(
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
        )
        self.order = PromptOrder(len(components.problems), t.seed)
        self.step = 0
        self.grad_updates = 0
        self.nonfinite_total = 0
        self.nonfinite_streak = 0
        self.tokens_total = 0
        self.elapsed_before = 0.0  # wall time of earlier attempts (resume)
        self.run_id: str | None = None
        self.refill_resume: dict[str, Any] | None = None
        self.tracker: Any = None
        self._t0 = time.monotonic()
        self._poison = int(os.environ.get(POISON_ENV, "0") or 0)
        self._sigterm_at = int(os.environ.get(SIGTERM_ENV, "0") or 0)

    # ---------------------------------------------------------------------------------------------- state
    def state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "grad_updates": self.grad_updates,
            "nonfinite_total": self.nonfinite_total,
            "nonfinite_streak": self.nonfinite_streak,
            "tokens_total": self.tokens_total,
            "elapsed": self.elapsed(),
            "data_order": self.order.state_dict(),
            "mlflow_run_id": self.run_id,
            "config_hash": self.cfg.config_hash(),
        }

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self._t0

    def save(self, *, refill: Any = None, rng: dict[str, Any] | None = None, state: dict | None = None) -> Path:
        path = ck.save_checkpoint(
            self.run_dir,
            self.step,
            state or self.state(),
            self.c.learner.save_checkpoint,
            refill=refill,
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
        state, rng, refill = ck.load_checkpoint_state(path)
        if state.get("config_hash") != self.cfg.config_hash():
            log.warning(
                "resuming %s with a different config (hash %s, checkpoint %s)",
                path,
                self.cfg.config_hash(),
                state.get("config_hash"),
            )
        self.c.learner.load_checkpoint(path / ck.LEARNER_DIR)
        self.step, self.grad_updates = state["step"], state["grad_updates"]
        self.nonfinite_total, self.nonfinite_streak = state["nonfinite_total"], state["nonfinite_streak"]
        self.tokens_total, self.elapsed_before = state["tokens_total"], state["elapsed"]
        self.order.load_state_dict(state["data_order"])
        self.run_id = state["mlflow_run_id"]
        self.refill_resume = refill
        ck.set_rng_state(rng)
        self.c.engine.sync_weights(self.c.learner.named_parameters_for_sync())
        log.info("resumed from %s at rollout step %d (%d updates)", path, self.step, self.grad_updates)
        return True

    # ---------------------------------------------------------------------------------------------- run
    def run(self) -> int:
        """Train to `total_steps` (or resume and finish). Returns the process exit code."""
        cfg = self.cfg
        if dist.broadcast((self.run_dir / "DONE.json").is_file()):
            log.info("%s/DONE.json exists: this run is finished, nothing to do", self.run_dir)
            return 0
        self.run_dir.mkdir(parents=True, exist_ok=True)
        resumed = self.restore()
        self.tracker = self.c.make_tracker(self.run_id) if dist.is_main() else dist.Null()
        if self.run_id is None:
            self.run_id = self.tracker.run_id
            self.tracker.log_params(cfg.flat())
        self.tracker.set_tags({**run_tags(cfg), M.TAG_STATUS: "running"})
        progress: Any = (
            Progress(cfg.trainer.total_steps, self.step, rich=self.progress_rich) if dist.is_main() else dist.Null()
        )
        try:
            with StopFlag() as stop:
                if not resumed and cfg.eval.every > 0:
                    self._evaluate(progress)
                while self.step < cfg.trainer.total_steps:
                    code = self._one_step(stop, progress)
                    if code is not None:
                        return code
                if self.c.evaluate is not None and not (cfg.eval.every and self.step % cfg.eval.every == 0):
                    self._evaluate(progress)
                return self._finish(progress)
        except NonFiniteError as e:
            log.error("%s", e)
            progress.note(f"FAILED: {e}")
            self.tracker.set_tags({M.TAG_STATUS: "failed"})
            self.tracker.finish("FAILED")
            return FAILURE_EXIT_CODE
        except Exception:
            # a crash (engine, learner, disk): say so in MLflow, keep the checkpoints, let the traceback through
            self.tracker.set_tags({M.TAG_STATUS: "failed"})
            self.tracker.finish("FAILED")
            raise
        finally:
            progress.close()

    def _one_step(self, stop: StopFlag, progress: Progress) -> int | None:
        cfg = self.cfg
        start_state, start_rng = self.state(), ck.rng_state()
        try:
            metrics = self.train_step(stop)
        except StopDuringRefill as e:
            self.save(refill=e.state)
            return self._preempted(progress)
        except RefillCapReached as e:
            # SPEC pitfall: never fail at the cap without saved state. The step never updated the model, so the
            # checkpoint is the state at its start: rerun with a higher cap (or at_refill_cap=partial) to go on.
            self.save(rng=start_rng, state=start_state)
            log.error("%s", e)
            self.tracker.set_tags({M.TAG_STATUS: "failed"})
            self.tracker.finish("FAILED")
            return FAILURE_EXIT_CODE
        self.tracker.log_metrics(_finite(metrics), step=self.step)
        progress.update(self.step, metrics)
        if self.nonfinite_streak >= cfg.trainer.max_consecutive_nonfinite:
            last = ck.latest_checkpoint(self.run_dir)
            raise NonFiniteError(
                f"{self.nonfinite_streak} non-finite updates in a row (trainer.max_consecutive_nonfinite="
                f"{cfg.trainer.max_consecutive_nonfinite}) at rollout step {self.step}: the loss or gradients are "
                f"NaN/inf. Last good checkpoint: {last or 'none'}. Lower trainer.lr, check the data, or resume "
                f"from that checkpoint."
            )
        if cfg.eval.every and self.step % cfg.eval.every == 0:
            self._evaluate(progress)
        if self._sigterm_at and self.step == self._sigterm_at:
            stop.request()
        if dist.any_rank(stop.requested):
            self.save()
            return self._preempted(progress)
        every = cfg.trainer.checkpoint_every
        # while updates are being skipped, keep the last good checkpoint rather than overwrite it
        if every and self.step % every == 0 and self.nonfinite_streak == 0:
            self.save()
            progress.note(f"checkpoint at step {self.step}")
        return None

    def train_step(self, stop: StopFlag) -> dict[str, float]:
        """One rollout step; advances `step` and `grad_updates`. Returns its metrics."""
        cfg, learner = self.cfg, self.c.learner
        t_step = time.perf_counter()
        next_step = self.step + 1
        if self.refill_resume is None:
            seed_step(cfg.trainer.seed, next_step)
        col = self._collect(stop)
        self.refill_resume = None
        self.c.engine.sleep()  # colocated GPUs: free the engine's memory for the learner (no-op on CPU)
        batch, stats = None, []
        t0 = t1 = time.perf_counter()
        if col.groups:
            batch = build_batch(
                col.groups, norm_adv_by_std=cfg.algorithm.norm_adv_by_std, overlong_filter=cfg.algorithm.overlong_filter
            )
            if self._poison and next_step >= self._poison:
                batch.advantages = torch.full_like(batch.advantages, float("nan"))
            t0 = time.perf_counter()
            batch.old_logprobs, batch.entropy = self._old_logprobs(batch)
            t1 = time.perf_counter()
            stats = self._updates(batch, len(col.groups), next_step)
        else:
            # dynamic sampling stopped at its cap (at_refill_cap=partial) without one informative group
            log.warning(
                "rollout step %d: no informative group within %d generation batches; no update",
                next_step,
                col.stats.gen_batches,
            )
        lr = learner.lr
        learner.lr_step()
        t3 = time.perf_counter()
        self.c.engine.wake_up()
        if stats:
            self.c.engine.sync_weights(learner.named_parameters_for_sync())
        t4 = time.perf_counter()

        self.step = next_step
        self.tokens_total += col.stats.tokens_generated
        m = rollout_metrics(col, batch, norm_adv_by_std=cfg.algorithm.norm_adv_by_std)
        m.update(mean_update_stats([s for s in stats if not s.get(UPDATE_SKIPPED)], UPDATE_KEYS))
        m.update(mean_update_stats(stats, [UPDATE_SKIPPED]))  # the fraction of this step's updates skipped
        gen_t = col.timings.get("generate", 0.0)
        m.update(
            {
                M.ROLLOUT_STEP: self.step,
                M.GRAD_UPDATES: self.grad_updates,
                M.LR: lr,
                M.NONFINITE_SKIPPED: self.nonfinite_total,
                M.DS_TOKENS_GENERATED_TOTAL: self.tokens_total,
                M.TIME_GENERATE: gen_t,
                M.TIME_SCORE: col.timings.get("score", 0.0),
                M.TIME_OLD_LOGPROB: t1 - t0,
                M.TIME_UPDATE: t3 - t1,
                M.TIME_SYNC: t4 - t3,
                M.TIME_STEP: time.perf_counter() - t_step,
                M.TIME_TOTAL: self.elapsed(),
                M.TOKENS_PER_SEC: col.stats.tokens_generated / gen_t if gen_t > 0 else float("nan"),
            }
        )
        return m

    def _updates(self, batch: ResponseBatch, num_groups: int, step: int) -> list[dict[str, float]]:
        """`epochs` passes of mini-batch updates over the step's groups. Counts every attempted update in
        `grad_updates` (so it stays step x updates_per_step) and the skipped ones in the non-finite counters;
        stops early once `max_consecutive_nonfinite` is reached (the loop then fails the run)."""
        t = self.cfg.trainer
        policy_batch = batch.to_policy_batch()
        stats = []
        for group_idx in minibatch_plan(num_groups, t.mini_batch_size, t.epochs, t.seed, step):
            rows = policy_batch.select(group_rows(batch, group_idx))
            out = self.c.learner.update(rows.shard(dist.rank(), dist.world_size()))
            stats.append(out)
            self.grad_updates += 1
            if out.get(UPDATE_SKIPPED):
                self.nonfinite_total += 1
                self.nonfinite_streak += 1
                log.warning(
                    "non-finite loss or gradient at rollout step %d: update skipped (%d in a row)",
                    step,
                    self.nonfinite_streak,
                )
                if self.nonfinite_streak >= t.max_consecutive_nonfinite:
                    break
            else:
                self.nonfinite_streak = 0
        return stats

    def _collect(self, stop: StopFlag) -> Any:
        """Rank 0 collects the step and broadcasts it (or the stop / refill-cap outcome, raised on every rank, so
        that every rank takes part in the checkpoint that follows)."""
        out: tuple[str, Any] | None = None
        if dist.is_main():
            try:
                out = (
                    "ok",
                    collect(
                        self.c.engine,
                        self._next_batch,
                        self.settings,
                        self.c.score_fn,
                        should_stop=lambda: stop.requested,
                        resume=self.refill_resume,
                    ),
                )
            except StopDuringRefill as e:
                out = ("stop", e.state)
            except RefillCapReached as e:
                out = ("cap", (str(e), e.stats, e.kept))
            except Exception as e:
                dist.broadcast(("error", f"{type(e).__name__}: {e}"))  # do not leave the other ranks waiting
                raise
        kind, value = dist.broadcast(out)
        if kind == "stop":
            raise StopDuringRefill(value)
        if kind == "cap":
            raise RefillCapReached(*value)
        if kind == "error":
            raise RuntimeError(f"rank 0 failed while collecting the rollout step: {value}")
        return value

    def _old_logprobs(self, batch: ResponseBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Old log-probs and entropies [N, T] of the whole batch: each rank computes its shard's rows, then all
        ranks gather them (the mini-batches re-shard by group, and the metrics need every row)."""
        pb, world = batch.to_policy_batch(), dist.world_size()
        if world == 1:
            return self.c.learner.compute_logprobs(pb)
        mine = pb.shard(dist.rank(), world)
        held = set(mine.group_ids.tolist())
        rows = [i for i, g in enumerate(pb.group_ids.tolist()) if g in held]  # shard keeps this order
        lp, ent = self.c.learner.compute_logprobs(mine)
        logp, entropy = torch.zeros_like(batch.loss_mask), torch.zeros_like(batch.loss_mask)
        for r, part_lp, part_ent in dist.all_gather((rows, lp, ent)):
            if r:
                logp[r], entropy[r] = part_lp, part_ent
        return logp, entropy

    def _next_batch(self, k: int) -> tuple[list[Problem], list[list[int]]]:
        idx = self.order.take(k)
        return [self.c.problems[i] for i in idx], [self.c.prompts[i] for i in idx]

    def _evaluate(self, progress: Progress) -> None:
        if self.c.evaluate is None or not dist.is_main():  # only rank 0 has an engine
            return
        t0 = time.perf_counter()
        # eval sampling must not move the training RNG streams (resume reproducibility)
        rng = ck.rng_state()
        metrics = dict(self.c.evaluate(self.c.engine))
        ck.set_rng_state(rng)
        metrics[M.TIME_EVAL] = time.perf_counter() - t0
        self.tracker.log_metrics(_finite(metrics), step=self.step)
        self.last_eval = metrics
        shown = {k: v for k, v in metrics.items() if k.startswith(M.EVAL_PREFIX + "/") and "_ci_" not in k}
        progress.note(f"eval at step {self.step}: " + "  ".join(f"{k} {v:.3f}" for k, v in shown.items()))

    def _preempted(self, progress: Progress) -> int:
        progress.note(
            f"stopped by signal at rollout step {self.step}; checkpoint written, exit "
            f"{RESUME_EXIT_CODE} (run the same command to resume)"
        )
        self.tracker.set_tags({M.TAG_STATUS: "preempted"})
        self.tracker.flush()
        return RESUME_EXIT_CODE

    def _finish(self, progress: Progress) -> int:
        final = self.run_dir / "final"
        self.c.learner.save_hf(final)
        last = ck.latest_checkpoint(self.run_dir)
        if dist.broadcast(last is None or ck.load_checkpoint_state(last)[0]["step"] != self.step):
            self.save()
        if not dist.is_main():
            return 0
        summary = {
            "run_id": self.run_id,
            "step": self.step,
            "grad_updates": self.grad_updates,
            "nonfinite_skipped": self.nonfinite_total,
            "elapsed_s": self.elapsed(),
            "final_model": str(final),
            "eval": getattr(self, "last_eval", {}),
        }
        _atomic_write(self.run_dir / "metrics.json", json.dumps(summary, indent=1, sort_keys=True))
        _atomic_write(self.run_dir / "DONE.json", json.dumps(summary, indent=1, sort_keys=True))
        self.tracker.log_artifact(self.run_dir / "metrics.json")
        self.tracker.set_tags({M.TAG_STATUS: "finished"})
        self.tracker.finish("FINISHED")
        progress.note(f"done: {self.step} rollout steps, {self.grad_updates} updates; model in {final}")
        return 0


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    """MLflow charts break on NaN: leave out points that have no value this step (e.g. Fig 3a with nothing
    clipped)."""
    return {k: float(v) for k, v in metrics.items() if v is not None and np.isfinite(float(v))}


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
