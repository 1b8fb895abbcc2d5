"""verl's side of tests/test_peer_parity.py, run in a subprocess with verl on PYTHONPATH (scripts/peers.sh puts it in
.peers/verl, outside the venv):

    PYTHONPATH=.peers/verl python tests/_verl_worker.py CASES.pt OUT.pt

CASES.pt holds the shared tensors (old, new, rollout log-probs, advantages, mask, scores, groups) and a list of
cases; for each, verl's own function is called on them and its loss and gradient (or weights, or advantages) saved.
"""

from __future__ import annotations

import sys
import warnings

import torch

warnings.filterwarnings("ignore")


def policy_loss(t: dict, case: dict) -> dict:
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig, PolicyLossConfig

    t = case.get("tensors", t)  # a case of its own (the documented differences) or the shared tensors
    new = t["new"].clone().requires_grad_()
    cfg = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=case["clip_low"],
        clip_ratio_low=case["clip_low"],
        clip_ratio_high=case["clip_high"],
        loss_agg_mode=case["agg"],
        policy_loss=PolicyLossConfig(loss_mode=case["mode"], **case.get("extra", {})),
        **case.get("actor", {}),
    )
    loss, _ = core_algos.get_policy_loss_fn(case["mode"])(
        old_log_prob=t["old"],
        log_prob=new,
        advantages=t["adv"].unsqueeze(-1) * t["mask"],
        response_mask=t["mask"],
        loss_agg_mode=case["agg"],
        config=cfg,
        rollout_is_weights=case.get("is_weights"),
    )
    (grad,) = torch.autograd.grad(loss, new)
    return {"loss": float(loss), "grad": grad}


def is_weights(t: dict, case: dict) -> dict:
    from verl.trainer.ppo import rollout_corr_helper

    w, _ = rollout_corr_helper.compute_rollout_correction_weights(
        t["old"] - t["rollout"], t["mask"], rollout_is=case["level"], rollout_is_threshold=case["threshold"]
    )
    return {"weights": w}


def advantages(t: dict, case: dict) -> dict:
    import numpy as np
    from verl.trainer.ppo import core_algos

    adv, _ = core_algos.compute_grpo_outcome_advantage(
        t["scores"].unsqueeze(-1) * torch.ones(1, 1),
        torch.ones(len(t["scores"]), 1),
        np.array(t["groups"].tolist()),
        norm_adv_by_std_in_grpo=case["norm_by_std"],
    )
    return {"advantages": adv[:, 0]}


def main() -> None:
    cases_path, out_path = sys.argv[1:3]
    data = torch.load(cases_path, weights_only=False)
    run = {"policy_loss": policy_loss, "is_weights": is_weights, "advantages": advantages}
    torch.save({c["name"]: run[c["kind"]](data["tensors"], c) for c in data["cases"]}, out_path)


if __name__ == "__main__":
    main()
