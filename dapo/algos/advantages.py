"""Group-relative advantages (GRPO, also used by DAPO): docs/algorithm.md section 2.

    A_i = (r_i - mean(r_1..r_G)) / (std(r_1..r_G) + eps)      std unbiased (torch.std default), eps = 1e-6

Every token of response i shares A_i. Dr. GRPO drops the std division (`norm_by_std=False`), which removes the
up-weighting of nearly-solved and nearly-failed prompts.
"""

from __future__ import annotations

import torch
from torch import Tensor


def group_advantages(rewards: Tensor, norm_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """Per-response advantages from the rewards of each prompt's group.

    Args:
        rewards: [B, G] float, B prompts with G responses each (shaped reward, e.g. +1/-1 plus the overlong
            penalty). Rewards of overlong-filtered responses stay in: filtering acts on the loss mask, not here.
        norm_by_std: divide by the unbiased group std + eps (GRPO); False gives Dr. GRPO's r_i - mean.
        eps: added to the std so that a group with equal rewards gets 0, not 0/0.

    Returns:
        [B, G] advantages in the rewards' dtype (float32 for integer rewards). A group whose rewards are all
        equal gets exactly 0 (no gradient), which is what dynamic sampling filters out.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [B, G], got shape {tuple(rewards.shape)}")
    if rewards.shape[1] < 2:
        # The unbiased std of one sample is undefined (NaN); a group of one has no baseline anyway.
        raise ValueError(f"group advantages need G >= 2 responses per prompt, got G={rewards.shape[1]}")
    r = rewards if rewards.is_floating_point() else rewards.to(torch.float32)
    centred = r - r.mean(dim=1, keepdim=True)
    if not norm_by_std:
        return centred
    return centred / (r.std(dim=1, keepdim=True) + eps)
