"""The algorithm core: pure functions over tensors (no config objects, no I/O, no process groups).

One Table 1 toggle, one function: overlong filtering -> `overlong_loss_mask`; clip-higher -> `clipped_surrogate`'s
eps_high; soft overlong punishment -> `soft_overlong_penalty`; token-level loss -> `aggregation`'s mode;
dynamic sampling -> `keep_groups` and `RefillAccumulator`.
"""

from dapo.algos.advantages import group_advantages
from dapo.algos.aggregation import (
    MODES,
    aggregate,
    group_token_counts,
    local_counts,
    sequence_scales,
    token_weights,
    weighted_sum,
)
from dapo.algos.dynamic_sampling import RefillAccumulator, RefillCapReached, RefillStats, keep_groups
from dapo.algos.logprobs import chunked_logprobs_entropy, naive_logprobs_entropy
from dapo.algos.overlong import overlong_loss_mask, soft_overlong_penalty
from dapo.algos.policy_loss import SurrogateOut, clipped_surrogate

__all__ = [
    "MODES",
    "RefillAccumulator",
    "RefillCapReached",
    "RefillStats",
    "SurrogateOut",
    "aggregate",
    "chunked_logprobs_entropy",
    "clipped_surrogate",
    "group_advantages",
    "group_token_counts",
    "keep_groups",
    "local_counts",
    "naive_logprobs_entropy",
    "overlong_loss_mask",
    "sequence_scales",
    "soft_overlong_penalty",
    "token_weights",
    "weighted_sum",
]
