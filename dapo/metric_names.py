"""Every metric name the project logs, in one place (docs/algorithm.md section 7). docs/metrics.md, the table of
every metric, is generated from this module (`python scripts/metrics_doc.py`); the trainer, eval and
analysis import names from here and never spell them out.

Namespaces follow cleanrl's style: `<group>/<name>`. MLflow step counters: each training metric is logged
with step = rollout step, and the gradient-update count is logged beside it as `counters/grad_updates`, so
analysis can put either on the x-axis.
"""

from __future__ import annotations

# --- counters (x-axes)
# rollout steps completed (MLflow `step` of every training metric; the lr schedule's unit)
ROLLOUT_STEP = "counters/rollout_step"
# optimizer updates so far (the paper's x-axis: 16 per rollout step at full scale)
GRAD_UPDATES = "counters/grad_updates"

# --- reward and accuracy (on the groups that trained)
REWARD_MEAN = "reward/mean"  # shaped reward (with the overlong penalty when on)
SCORE_MEAN = "reward/score_mean"  # +1/-1 correctness score before shaping
ACC_MEAN = "reward/accuracy"  # fraction correct
ALL_CORRECT_FRAC = "reward/all_correct_frac"  # Fig 3b: groups with every response correct (before filtering)
ALL_WRONG_FRAC = "reward/all_wrong_frac"  # groups with every response wrong (before filtering)
# accuracy of every response generated in the step, before dynamic sampling's filter: fresh prompts every step,
# so a learning-speed curve that the filter does not bias (with the filter, the trained groups exclude all-correct)
ACC_GENERATED = "reward/accuracy_generated"
# mean soft overlong penalty R_length (Eq. 13) of the trained responses; 0 when off
OVERLONG_PENALTY_MEAN = "reward/overlong_penalty_mean"

# --- advantages
ADV_MEAN = "adv/mean"  # mean advantage over trained responses (about 0 by construction)
ADV_ABS_MEAN = "adv/abs_mean"  # mean absolute advantage over trained responses
ZERO_ADV_GROUP_FRAC = "adv/zero_adv_group_frac"  # groups whose advantages are all 0 (before filtering)
ZERO_ADV_TRAINED_FRAC = "adv/zero_adv_trained_frac"  # trained groups whose advantages are all 0 (dynamic sampling: 0)

# --- responses
RESP_LEN_MEAN = "response/length_mean"  # mean response length in tokens (trained groups)
RESP_LEN_MAX = "response/length_max"  # longest response in tokens (trained groups)
RESP_TRUNC_FRAC = "response/truncated_frac"  # finish reason "length"
# mean length of the step's wrong responses / of its right ones, every generated response (before the filter):
# how much longer the wrong answers run (what per-response loss averaging under-penalises, Fig 4)
LEN_WRONG_OVER_RIGHT = "response/length_wrong_over_right"
TRUNC_LOSS_TOKEN_FRAC = "response/truncated_loss_token_frac"  # loss-mask tokens on truncated responses (filter: 0)
ENTROPY = "actor/entropy"  # mean entropy of generated tokens (Figs 2, 4, 5)

# --- policy update
POLICY_LOSS = "actor/pg_loss"  # policy-gradient loss, mean over the step's updates
CLIPFRAC_LOW = "actor/clipfrac_lower"  # ratio < 1 - eps_low with A < 0 (bound active)
CLIPFRAC_HIGH = "actor/clipfrac_upper"  # ratio > 1 + eps_high with A > 0 (bound active)
# of the loss tokens with positive advantage and old probability below RARE_TOKEN_PROB (dapo.algos.metrics), the
# fraction clipped at the upper bound: where clip-higher acts (rare tokens that a right answer would raise; Fig 3a)
CLIPFRAC_HIGH_RARE = "actor/clipfrac_upper_rare"
CLIP_HIGH_PROB = "actor/clipped_upper_old_prob"  # Fig 3a: mean pi_old of tokens clipped at the upper bound
# fraction of loss tokens where the dual-clip bound (A < 0) was active; 0 when off
DUAL_CLIPFRAC = "actor/dual_clipfrac"
APPROX_KL = "actor/approx_kl"  # k3 estimate of KL(pi_old || pi_theta)
KL_REF = "actor/kl_ref"  # k3 estimate of KL(pi_theta || pi_ref) per loss token; only when kl_coef > 0
GRAD_NORM = "actor/grad_norm"  # gradient norm before clipping, mean over the step's updates
LR = "actor/lr"  # learning rate in effect during the step
NONFINITE_SKIPPED = "actor/nonfinite_skipped"  # cumulative skipped updates
UPDATE_SKIPPED = "actor/update_skipped"  # per step: fraction of its updates skipped (non-finite)
# GSPO (`algorithm.policy_loss: gspo`): share of responses whose sequence-level ratio was clipped below / above
SEQ_CLIPFRAC_LOW = "actor/seq_clipfrac_lower"
SEQ_CLIPFRAC_HIGH = "actor/seq_clipfrac_upper"
# CISPO: share of loss tokens whose importance weight was capped (their gradient kept, scaled down)
CISPO_CAPPED_FRAC = "actor/cispo_capped_frac"
# Clip-Cov / KL-Cov: share of loss tokens the covariance rule selected (gradient cut, or KL-penalised)
COV_SELECTED_FRAC = "actor/cov_selected_frac"
OFF_POLICY_MASKED_FRAC = "actor/off_policy_masked_frac"  # DeepSeek-V3.2's sequence mask: share of responses it left out

# --- engine vs learner (the rollout/learner mismatch; the real path's tripwires, docs/distributed.md)
# mean |log p_learner - log p_engine| over the sampled tokens of the trained groups, the learner's old log-probs
# against the engine's: rounding alone (float32 ~1e-6; a weight sync that did not load: far more)
MISMATCH_ABS_DIFF = "mismatch/logprob_abs_diff"
MISMATCH_K3 = "mismatch/k3_kl"  # k3 estimate of KL(pi_engine || pi_learner) on the engine's samples, per token
MISMATCH_SEQ_MAX = "mismatch/seq_abs_diff_max"  # the largest per-response mean |log-prob difference|
MISMATCH_BEYOND_FRAC = (
    "mismatch/token_beyond_frac"  # share of sampled tokens whose |difference| exceeds log 2 (2x in p)
)
DISTINCT_RESPONSES = "mismatch/distinct_responses"  # distinct responses per generated group, mean
IDENTICAL_GROUP_FRAC = "mismatch/identical_group_frac"  # generated groups whose responses are all the same
# generated groups whose repeated responses independent samples would give with probability below 1e-6
# (dapo.algos.metrics.group_sameness): samples that were not drawn independently (replicas sharing seeds)
IMPLAUSIBLE_GROUP_FRAC = "mismatch/implausible_repeat_frac"
# rollout correction (`algorithm.rollout_correction`): mean importance weight over response tokens
CORRECTION_WEIGHT_MEAN = "mismatch/correction_weight_mean"
CORRECTION_CAPPED_FRAC = "mismatch/correction_capped_frac"  # TIS: share of responses or tokens whose ratio exceeded C
CORRECTION_MASKED_FRAC = "mismatch/correction_masked_frac"  # MIS: share of responses or tokens set to weight 0

# --- carry-over (`rollout.max_staleness` >= 1; docs/algorithm.md section 13): the trained tokens' age in weight
# versions (0: sampled with the weights the step's updates start from), over the trained groups' response tokens
STALENESS_MAX = "staleness/max"  # the oldest trained token's age (never above rollout.max_staleness)
STALENESS_MEAN = "staleness/mean"  # mean age of the trained tokens
STALENESS_SPANNING_FRAC = "staleness/spanning_frac"  # trained responses sampled under more than one weight version
STALENESS_TOKENS_CARRIED = "staleness/tokens_carried"  # response tokens left in flight for the next step
STALENESS_GROUPS_CARRIED = "staleness/groups_carried"  # groups left in flight for the next step
# mean |log pi_proximal - log pi_behaviour| over the trained tokens older than the current weights (the learner's old
# log-probs against the engine's when it sampled them: the policy's change plus rounding; NaN without such tokens)
STALENESS_PROXIMAL_GAP = "staleness/behaviour_proximal_gap"

# --- dynamic sampling
DS_GEN_BATCHES = "dynamic_sampling/gen_batches"  # generation batches this step (1 without dynamic sampling)
DS_GROUPS_KEPT = "dynamic_sampling/groups_kept"  # groups that trained this step
DS_GROUPS_DROPPED = "dynamic_sampling/groups_dropped"  # filtered out + surplus
DS_TOKENS_GENERATED = "dynamic_sampling/tokens_generated"  # including dropped groups
DS_TOKENS_GENERATED_TOTAL = "dynamic_sampling/tokens_generated_total"  # cumulative

# --- timings (seconds, per rollout step; generation includes every refill batch)
# generation (the slowest replica of each generation batch), summed over the step's batches
TIME_GENERATE = "time/generate"
TIME_SCORE = "time/score"  # reward verification (the slowest replica), summed over the step's generation batches
TIME_OLD_LOGPROB = "time/old_logprob"  # old-policy log-probs and entropy, and the reference's with a KL term
TIME_UPDATE = "time/update"  # all mini-batch updates of the step
TIME_SYNC = "time/weight_sync"  # weight sync learner -> rollout engine (every rank into its own replica, streamed)
TIME_EVAL = "time/eval"  # evaluation (logged at eval steps)
TIME_STEP = "time/step"  # the whole rollout step
TIME_TOTAL = "time/elapsed"  # wall time since the run started, earlier attempts (before a resume) included
TOKENS_PER_SEC = "perf/tokens_per_sec"  # tokens generated by every replica / generation time (the job's rate)
# the learner's padding: of the tokens it put through the model (every rank, dummy passes included), the share no
# sequence needed; mean over the step's updates, and of the old-log-prob pass (trainer.packing; ~0 when packed)
LEARNER_PADDED_FRACTION = "perf/learner_padded_fraction"
LEARNER_FORWARD_PADDED_FRACTION = "perf/learner_forward_padded_fraction"

# --- habits of the tiny world's habits kind (dapo.tinyworld.habits): per rollout step, over every generated
# response, dropped groups included
HABIT_VERBOSE = "habit/verbose"  # share of responses in the verbose style
HABIT_LOOP = "habit/loop"  # ... with an `again:` re-check loop
HABIT_SOUND_TRUNCATED = "habit/sound_truncated"  # ... cut off by the cap with every completed line right
HABIT_FORK_RIGHT = "habit/fork_right"  # share of the fork problems' responses that halve (the right operation)
HABIT_FORK_WRONG = "habit/fork_wrong"  # ... that subtract 2 (the misconception)
HABIT_FORK_RIGHT_CONTROL = "habit/fork_right_control"  # the clip-higher assay's control fork: right operation's share
HABIT_SHORT_WRONG = "habit/short_wrong"  # the token-level-loss assay: share of responses in the short wrong habit
HABIT_LOOP_ODDS = "habit/loop_odds"  # ... log-odds loop : short wrong among the core problems' responses
HABIT_LOOP_ODDS_CONTROL = "habit/loop_odds_control"  # ... among the control problems' (loops as short)
HABIT_LOOP_LENGTH = "habit/loop_length"  # ... mean tokens of the core problems' looping responses
HABIT_CAREFUL = "habit/careful"  # the overlong-filtering assay: share of running sums worked a digit a line
HABIT_CAREFUL_CONTROL = "habit/careful_control"  # ... of its control problems' responses (careful always fits)
HABIT_CAREFUL_TRUNCATED = "habit/careful_truncated"  # ... share of careful responses the cap cut off
HABIT_CAREFUL_MARGIN = "habit/careful_margin"  # ... careful accuracy (cut off: wrong) minus concise accuracy
HABIT_ACC_EASY = "habit/accuracy_easy"  # accuracy on each kind of problem
HABIT_ACC_CORE = "habit/accuracy_core"
HABIT_ACC_FORK = "habit/accuracy_fork"
HABIT_ACC_LONG = "habit/accuracy_long"
HABIT_ACC_UNSOLVABLE = "habit/accuracy_unsolvable"
HABIT_ACC_FORK_CONTROL = "habit/accuracy_fork_control"
HABIT_ACC_RUN_FITS = "habit/accuracy_run_fits"  # the overlong-filtering assay: running sums careful working fits
HABIT_ACC_RUN_OVERRUNS = "habit/accuracy_run_overruns"  # ... that careful working overruns
HABIT_ACC_RUN_CONTROL = "habit/accuracy_run_control"  # ... its control problems
HABIT_ACC_CONCISE = "habit/accuracy_concise"  # accuracy of each working style's responses (concise: neither tag)
HABIT_ACC_VERBOSE = "habit/accuracy_verbose"
HABIT_ACC_LOOP = "habit/accuracy_loop"
# mean length in tokens of each working style's wrong and right responses: which style makes wrong responses
# longer than right ones (`response/length_wrong_over_right`, token-level loss's condition)
HABIT_LEN_WRONG_CONCISE = "habit/length_wrong_concise"
HABIT_LEN_WRONG_VERBOSE = "habit/length_wrong_verbose"
HABIT_LEN_WRONG_LOOP = "habit/length_wrong_loop"
HABIT_LEN_RIGHT_CONCISE = "habit/length_right_concise"
HABIT_LEN_RIGHT_VERBOSE = "habit/length_right_verbose"
HABIT_LEN_RIGHT_LOOP = "habit/length_right_loop"

# --- evaluation (k is the preset's n: avg@32 for the paper). Use the helpers below.
EVAL_PREFIX = "eval"
EVAL_TRUNC_FRAC = "eval/truncated_frac"  # fraction of eval samples that hit the generation cap
EVAL_LEN_MEAN = "eval/length_mean"  # mean eval response length in tokens


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
TAG_ROW = "dapo.row"  # tag: ablation row, e.g. 05_dynamic_sampling
TAG_SEED = "dapo.seed"  # tag: trainer.seed
TAG_PRESET = "dapo.preset"  # tag: scale preset (tiny, qwen2.5-32b)
TAG_GIT = "dapo.git_commit"  # tag: git commit of the code (`-dirty` with uncommitted changes)
TAG_CONFIG_HASH = "dapo.config_hash"  # tag: hash of everything that changes the computation
TAG_STATUS = "dapo.status"  # running | finished | failed | preempted
TAG_GPUS = "dapo.gpus"  # GPUs the run held (world size on GPU machines, 0 on CPU): compute table
TAG_CPUS = "dapo.cpus"  # CPU threads the run used (for CPU-hours when it held no GPU)
TAG_REPLICAS = "dapo.rollout_replicas"  # rollout engine replicas (world size / tensor parallel size)
TAG_REFUSED_RECORDS = "dapo.refused_records"  # records the tracking store refused (named in the run's log)
TAG_CPU_KERNELS = "dapo.cpu_kernels"  # PyTorch's CPU kernels (AVX2, AVX512, ...); the workflow pins tiny runs to AVX2

# The latest evaluation's samples (one JSON object per sample), an artifact of the training run: the trainer logs
# it at each evaluation (the last one is the final eval), `dapo eval --run-id` too; Table 1's per-problem
# intervals read it.
EVAL_SAMPLES_FOLDER = "eval"
EVAL_SAMPLES_ARTIFACT = f"{EVAL_SAMPLES_FOLDER}/samples.jsonl"

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
    """Every per-step training metric name (the tests check that the trainer logs nothing else)."""
    return [v for k, v in globals().items() if k.isupper() and isinstance(v, str) and "/" in v]
