"""The algorithm core: pure functions over tensors (no config objects, no I/O, no process groups).

One Table 1 toggle, one function: overlong filtering -> `overlong.overlong_loss_mask`; clip-higher ->
`policy_loss.clipped_surrogate`'s eps_high; soft overlong punishment -> `overlong.soft_overlong_penalty`; token-level
loss -> `aggregation`'s mode; dynamic sampling -> `dynamic_sampling.keep_groups` and `RefillAccumulator`.
"""
