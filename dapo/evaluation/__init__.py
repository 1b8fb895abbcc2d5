"""Evaluation: avg@n, pass@k and maj@n with confidence intervals, from any rollout engine (`evaluate`; inside a
training job sharded over its rollout replicas, `evaluate_on_replicas`), and the `dapo eval` command (`cli.py`)."""

from dapo.evaluation.evaluate import EvalResult, EvalSettings, evaluate, evaluate_on_replicas, write_samples

__all__ = ["EvalResult", "EvalSettings", "evaluate", "evaluate_on_replicas", "write_samples"]
