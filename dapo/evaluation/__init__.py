"""Evaluation: avg@n, pass@k and maj@n with confidence intervals, from any rollout engine (`evaluate`), and the
`dapo eval` command (`cli.py`)."""

from dapo.evaluation.evaluate import EvalResult, evaluate, write_samples

__all__ = ["EvalResult", "evaluate", "write_samples"]
