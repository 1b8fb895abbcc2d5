"""Per-step training metrics (what the paper's Figs 2-7 plot, and more), named only through `dapo.metric_names`.

Which population each metric describes:
- reward, accuracy, advantages, response lengths, entropy: the groups that trained this step;
- all-correct / all-wrong fractions (Fig 3b), groups with all-zero advantages, the accuracy of every generated
  response and how much longer the wrong ones are: every generated group, before the dynamic-sampling filter (with
  the filter, the trained groups are never all-correct by construction);
- dynamic sampling counts and tokens: every generation batch of the step, dropped groups included;
- the engine-vs-learner gap (`mismatch/`): the sampled tokens of the groups that trained (the learner computes old
  log-probs of those only); the groups' diversity: every generated group;
- carry-over (`rollout.max_staleness` >= 1, `staleness/`): the trained groups' tokens by the weight version that
  sampled them, what waits in flight for the next step; the engine-vs-learner gap then counts the tokens sampled with
  the current weights only, the older ones' gap being the policy's change (`staleness/behaviour_proximal_gap`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dapo import metric_names as M
from dapo.algos.advantages import group_advantages
from dapo.algos.dynamic_sampling import RefillStats
from dapo.algos.metrics import IMPLAUSIBLE_LOG_CHANCE, group_outcome_fractions, group_sameness, mismatch_stats
from dapo.algos.staleness import staleness_stats, token_age
from dapo.learner.batch import PolicyBatch
from dapo.trainer.components import HabitTagger
from dapo.types import Group, GroupOutcome


def outcome_of(g: Group, tagger: HabitTagger | None = None) -> GroupOutcome:
    """What the metrics keep of one generated group (the groups themselves are not kept: at the paper's scale their
    tokens would triple what a step holds)."""
    distinct, repeat_log_chance = group_sameness([x.response_ids for x in g.samples], [x.logprobs for x in g.samples])
    return GroupOutcome(
        correct=list(g.correct),
        rewards=g.rewards,
        lengths=[len(x.response_ids) for x in g.samples],
        truncated=[x.truncated for x in g.samples],
        tags=[list(t) for t in g.tags] or [[] for _ in g.samples],
        kind=tagger.kind(g.problem.problem) if tagger is not None else "",
        distinct=distinct,
        repeat_log_chance=repeat_log_chance,
    )


def rollout_metrics(
    groups: Sequence[Group],
    stats: RefillStats,
    generated: Sequence[GroupOutcome],
    batch: PolicyBatch | None,
    correction: dict[str, float],
    norm_adv_by_std: bool,
) -> dict[str, float]:
    """Reward, accuracy, advantage, response, dynamic-sampling and engine-vs-learner metrics of one rollout step:
    `groups` trained (in `batch`; None: no group trained, only the generation-side metrics), `generated` every
    group's outcome before any filter; `correction`: what the rollout correction did (empty without one)."""
    out = _generated_metrics(stats, generated, norm_adv_by_std)
    if batch is not None:
        out.update(_trained_metrics(groups, batch))
        out.update(_mismatch_metrics(batch, correction))
    return out


def _trained_metrics(groups: Sequence[Group], batch: PolicyBatch) -> dict[str, float]:
    scores = torch.tensor([x for g in groups for x in g.scores], dtype=torch.float64)
    pens = torch.tensor([x for g in groups for x in g.penalties], dtype=torch.float64)
    correct = torch.tensor([x for g in groups for x in g.correct], dtype=torch.float64)
    lengths = batch.response_mask.sum(dim=1).to(torch.float64)
    out = {
        M.REWARD_MEAN: float((scores + pens).mean()),
        M.SCORE_MEAN: float(scores.mean()),
        M.ACC_MEAN: float(correct.mean()),
        M.OVERLONG_PENALTY_MEAN: float(pens.mean()),
        M.ADV_MEAN: float(batch.advantages.double().mean()),
        M.ADV_ABS_MEAN: float(batch.advantages.double().abs().mean()),
        M.RESP_LEN_MEAN: float(lengths.mean()),
        M.RESP_LEN_MAX: float(lengths.max()),
        M.RESP_TRUNC_FRAC: float(batch.truncated.double().mean()),
        **_mechanism_metrics(batch),
    }
    if batch.entropy is not None:
        m = batch.response_mask
        out[M.ENTROPY] = float((batch.entropy.double() * m).sum() / m.sum().clamp(min=1))
    return out


# a sampled token is "beyond" when the engine and the learner disagree on its probability by more than a factor 2
MISMATCH_TOKEN_BOUND = math.log(2.0)


def _mismatch_metrics(batch: PolicyBatch, correction: dict[str, float]) -> dict[str, float]:
    """The engine-vs-learner gap on the sampled tokens (`dapo.algos.metrics.mismatch_stats`), and what
    the rollout correction did; nothing for an engine that gives no log-probs."""
    if batch.engine_logp is None or batch.old_logp is None:
        return {}
    st = mismatch_stats(batch.old_logp, batch.engine_logp, batch.response_mask, MISMATCH_TOKEN_BOUND)
    out = {
        M.MISMATCH_ABS_DIFF: st["abs_diff"],
        M.MISMATCH_K3: st["k3"],
        M.MISMATCH_SEQ_MAX: st["seq_abs_diff_max"],
        M.MISMATCH_BEYOND_FRAC: st["beyond_frac"],
    }
    names = {
        "weight_mean": M.CORRECTION_WEIGHT_MEAN,
        "capped_frac": M.CORRECTION_CAPPED_FRAC,
        "masked_frac": M.CORRECTION_MASKED_FRAC,
    }
    out.update({names[k]: v for k, v in correction.items()})
    return out


def staleness_metrics(
    batch: PolicyBatch | None, version: int, tokens_carried: int, groups_carried: int
) -> dict[str, float]:
    """Carry-over's metrics of a step whose proximal policy is weight `version`: the trained tokens' age (largest,
    mean), the share of trained responses sampled under more than one version, the tokens and groups left in flight,
    the behaviour-vs-proximal gap on the tokens older than `version`; and `mismatch/` again on the current version's
    tokens alone (the tripwire's numerics, which the older tokens' policy change would swamp)."""
    out = {M.STALENESS_TOKENS_CARRIED: float(tokens_carried), M.STALENESS_GROUPS_CARRIED: float(groups_carried)}
    if batch is None or batch.versions is None or batch.response_mask is None:
        return out
    st = staleness_stats(batch.versions, batch.response_mask, version)
    out[M.STALENESS_MAX], out[M.STALENESS_MEAN] = st["max"], st["mean"]
    out[M.STALENESS_SPANNING_FRAC] = st["spanning_frac"]
    if batch.engine_logp is None or batch.old_logp is None:
        return out
    age = token_age(batch.versions, version)
    stale = batch.response_mask * (age > 0)
    gap = mismatch_stats(batch.old_logp, batch.engine_logp, stale, MISMATCH_TOKEN_BOUND)["abs_diff"]
    fresh = mismatch_stats(batch.old_logp, batch.engine_logp, batch.response_mask * (age == 0), MISMATCH_TOKEN_BOUND)
    out[M.STALENESS_PROXIMAL_GAP] = gap
    out.update({
        M.MISMATCH_ABS_DIFF: fresh["abs_diff"],
        M.MISMATCH_K3: fresh["k3"],
        M.MISMATCH_SEQ_MAX: fresh["seq_abs_diff_max"],
        M.MISMATCH_BEYOND_FRAC: fresh["beyond_frac"],
    })  # fmt: skip
    return out


def _mechanism_metrics(batch: PolicyBatch) -> dict[str, float]:
    """What two toggles act on, measured on the trained batch: the share of the loss's tokens that belong to
    truncated responses (overlong filtering drives it to 0) and the share of trained groups whose advantages are
    all 0, which carry no gradient (dynamic sampling drives it to 0)."""
    loss_tokens = batch.loss_mask.double().sum(dim=1)  # [N]
    total = float(loss_tokens.sum())
    trunc_share = float(loss_tokens[batch.truncated].sum()) / total if total > 0 else float("nan")
    num_groups = int(batch.group_ids.max()) + 1 if len(batch) else 0
    nonzero = torch.zeros(num_groups, dtype=torch.float64).index_add_(
        0, batch.group_ids, (batch.advantages != 0).double()
    )
    zero_groups = float((nonzero == 0).double().mean()) if num_groups else float("nan")
    return {M.TRUNC_LOSS_TOKEN_FRAC: trunc_share, M.ZERO_ADV_TRAINED_FRAC: zero_groups}


def _generated_metrics(st: RefillStats, generated: Sequence[GroupOutcome], norm_adv_by_std: bool) -> dict[str, float]:
    out: dict[str, float] = {}
    correct = [c for o in generated for c in o.correct]
    lengths = [n for o in generated for n in o.lengths]
    out[M.ACC_GENERATED] = sum(correct) / len(correct) if correct else math.nan
    right = [n for n, c in zip(lengths, correct, strict=True) if c]
    wrong = [n for n, c in zip(lengths, correct, strict=True) if not c]
    if right and wrong:
        out[M.LEN_WRONG_OVER_RIGHT] = (sum(wrong) / len(wrong)) / (sum(right) / len(right))
    all_correct = torch.tensor([o.correct for o in generated], dtype=torch.bool)
    out[M.ALL_CORRECT_FRAC], out[M.ALL_WRONG_FRAC] = group_outcome_fractions(all_correct)
    all_rewards = torch.tensor([o.rewards for o in generated], dtype=torch.float64)
    all_adv = group_advantages(all_rewards, norm_by_std=norm_adv_by_std)
    out[M.ZERO_ADV_GROUP_FRAC] = float((all_adv == 0).all(dim=1).double().mean())
    counted = [o for o in generated if o.distinct > 0]
    if counted:  # how alike each group's responses are: samples that are not independent repeat themselves
        out[M.DISTINCT_RESPONSES] = sum(o.distinct for o in counted) / len(counted)
        out[M.IDENTICAL_GROUP_FRAC] = sum(o.distinct == 1 for o in counted) / len(counted)
        out[M.IMPLAUSIBLE_GROUP_FRAC] = sum(
            o.repeat_log_chance is not None and o.repeat_log_chance < IMPLAUSIBLE_LOG_CHANCE for o in counted
        ) / len(counted)
    out[M.DS_GEN_BATCHES] = st.gen_batches
    out[M.DS_GROUPS_KEPT] = st.groups_kept
    out[M.DS_GROUPS_DROPPED] = st.groups_dropped
    out[M.DS_TOKENS_GENERATED] = st.tokens_generated
    return out


def update_means(stats: Sequence[dict[str, float]]) -> dict[str, float]:
    """The step's updates' metrics: each key the learner reports (but the lr, which the step logs itself), averaged
    over the updates that were applied, ignoring NaN (e.g. Fig 3a's probability on a mini-batch where no token was
    clipped at the upper bound); and the share of the step's updates skipped as non-finite."""
    applied = [x for x in stats if not x.get(M.UPDATE_SKIPPED)]
    out = {}
    for k in dict.fromkeys(k for x in applied for k in x if k not in (M.LR, M.UPDATE_SKIPPED)):
        vals = [float(x[k]) for x in applied if k in x and x[k] is not None and not math.isnan(float(x[k]))]
        if vals:
            out[k] = sum(vals) / len(vals)
    if stats:
        out[M.UPDATE_SKIPPED] = sum(float(x.get(M.UPDATE_SKIPPED, 0.0)) for x in stats) / len(stats)
    return out
