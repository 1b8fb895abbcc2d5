"""Every metric name the project logs, in one place (SPEC section 7). The README's metric table is made from
this module; the trainer, eval and analysis import names from here and never spell them out.

Namespaces follow cleanrl's style: `<group>/<name>`. MLflow step counters: each training metric is logged
with step = rollout step, and the gradient-update count is logged beside it as `counters/grad_updates`, so
analysis can put either on the x-axis.
"""

from __future__ import annotations

# --- counters (x-axes)
ROLLOUT_STEP = "counters/rollout_step"
GRAD_UPDATES = "counters/grad_updates"

# --- reward and accuracy (on the groups that trained)
REWARD_MEAN = "reward/mean"  # shaped reward (with the overlong penalty when on)
SCORE_MEAN = "reward/score_mean"  # +1/-1 correctness score before shaping
ACC_MEAN = "reward/accuracy"  # fraction correct
ALL_CORRECT_FRAC = "reward/all_correct_frac"  # Fig 3b: groups with every response correct (before filtering)
ALL_WRONG_FRAC = "reward/all_wrong_frac"
OVERLONG_PENALTY_MEAN = "reward/overlong_penalty_mean"

# --- advantages
ADV_MEAN = "adv/mean"
ADV_ABS_MEAN = "adv/abs_mean"
ZERO_ADV_GROUP_FRAC = "adv/zero_adv_group_frac"  # groups whose advantages are all 0 (before filtering)

# --- responses
RESP_LEN_MEAN = "response/length_mean"
RESP_LEN_MAX = "response/length_max"
RESP_TRUNC_FRAC = "response/truncated_frac"  # finish reason "length"
ENTROPY = "actor/entropy"  # mean entropy of generated tokens (Figs 2, 4, 5)

# --- policy update
POLICY_LOSS = "actor/pg_loss"
CLIPFRAC_LOW = "actor/clipfrac_lower"  # ratio < 1 - eps_low with A < 0 (bound active)
CLIPFRAC_HIGH = "actor/clipfrac_upper"  # ratio > 1 + eps_high with A > 0 (bound active)
CLIP_HIGH_PROB = "actor/clipped_upper_old_prob"  # Fig 3a: mean pi_old of tokens clipped at the upper bound
DUAL_CLIPFRAC = "actor/dual_clipfrac"
APPROX_KL = "actor/approx_kl"  # k3 estimate of KL(pi_old || pi_theta)
KL_REF = "actor/kl_ref"  # when kl_coef > 0
GRAD_NORM = "actor/grad_norm"
LR = "actor/lr"
NONFINITE_SKIPPED = "actor/nonfinite_skipped"  # cumulative skipped updates
UPDATE_SKIPPED = "actor/update_skipped"  # per step: fraction of its updates skipped (non-finite)

# --- dynamic sampling
DS_GEN_BATCHES = "dynamic_sampling/gen_batches"
DS_GROUPS_KEPT = "dynamic_sampling/groups_kept"
DS_GROUPS_DROPPED = "dynamic_sampling/groups_dropped"  # filtered out + surplus
DS_TOKENS_GENERATED = "dynamic_sampling/tokens_generated"  # including dropped groups
DS_TOKENS_GENERATED_TOTAL = "dynamic_sampling/tokens_generated_total"  # cumulative

# --- timings (seconds, per rollout step; generation includes every refill batch)
TIME_GENERATE = "time/generate"
TIME_SCORE = "time/score"
TIME_OLD_LOGPROB = "time/old_logprob"
TIME_UPDATE = "time/update"
TIME_SYNC = "time/weight_sync"
TIME_EVAL = "time/eval"
TIME_STEP = "time/step"
TIME_TOTAL = "time/elapsed"
TOKENS_PER_SEC = "perf/tokens_per_sec"  # generated tokens / generation time

# --- evaluation (k is the preset's n: avg@32 for the paper). Use the helpers below.
EVAL_PREFIX = "eval"
EVAL_TRUNC_FRAC = "eval/truncated_frac"
EVAL_LEN_MEAN = "eval/length_mean"


def eval_avg(k: int) -> str:
    return f"eval/avg_at_{k}"


def eval_pass(k: int) -> str:
    return f"eval/pass_at_{k}"


def eval_maj(k: int) -> str:
    return f"eval/maj_at_{k}"


def ci_low(name: str) -> str:
    return f"{name}_ci_low"


def ci_high(name: str) -> str:
    return f"{name}_ci_high"


# --- tags (MLflow run tags; the UI's compare view lines rows up by these)
TAG_ROW = "dapo.row"
TAG_SEED = "dapo.seed"
TAG_PRESET = "dapo.preset"
TAG_GIT = "dapo.git_commit"
TAG_CONFIG_HASH = "dapo.config_hash"
TAG_STATUS = "dapo.status"  # running | finished | failed | preempted
TAG_GPUS = "dapo.gpus"  # GPUs the run held (world size on GPU machines, 0 on CPU): compute table
TAG_CPUS = "dapo.cpus"  # CPU threads the run used (for CPU-hours when it held no GPU)

# Rows of Table 1 in order, with the paper's AIME 2024 avg@32.
PAPER_TABLE1 = {
    "00_naive_grpo": ("Naive GRPO", 30),
    "01_overlong_filtering": ("+ Overlong Filtering", 36),
    "02_clip_higher": ("+ Clip-Higher", 38),
    "03_soft_overlong_punishment": ("+ Soft Overlong Punishment", 41),
    "04_token_level_loss": ("+ Token-level Loss", 42),
    "05_dynamic_sampling": ("+ Dynamic Sampling (DAPO)", 50),
}


def all_training_metrics() -> list[str]:
    """Every per-step training metric name (for the README table and the tests)."""
    return [v for k, v in globals().items() if k.isupper() and isinstance(v, str) and "/" in v]
