"""Tripwires: stop a run, in its first step, whose engine is not sampling what the learner trains on.

Two checks, each on every step: the engine's log-probs of its own samples against the learner's old log-probs of the
same tokens (`mismatch/logprob_abs_diff` above `LOGPROB_GAP_BOUND` for the run's dtype: a sync that did not load),
and repeats within groups that independent sampling would give with probability below 1e-6 in most groups
(`mismatch/implausible_repeat_frac` > 0.5: samples sharing a seed). Either stops the run with exit 2 (final: a
requeue would fail the same way) and the likely cause; `trainer.tripwires: false` logs the metrics without stopping.
The failures, the bounds and their measurements: docs/distributed.md, "Tripwires"; BENCHMARKS.md section 12.
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
