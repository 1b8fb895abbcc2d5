"""Rewards: answer extraction and equivalence (math-verify or the DAPO rule) in a bounded process pool.

Knows nothing of the trainer. The design: docs/architecture.md, "rewards/"; the rule: docs/algorithm.md section 4.
"""

from dapo.rewards.dapo_rule import normalize_final_answer
from dapo.rewards.extract import extract_answer, last_boxed
from dapo.rewards.score import score_dapo_rule, score_math_verify, score_responses, shutdown_pools

__all__ = [
    "extract_answer",
    "last_boxed",
    "normalize_final_answer",
    "score_dapo_rule",
    "score_math_verify",
    "score_responses",
    "shutdown_pools",
]
