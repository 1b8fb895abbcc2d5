"""One rank of the weight-sync check (tests/test_rollout.py): a ZeRO-3 learner and a vLLM replica per rank (or one
replica over both ranks with tensor parallel 2), synced through the path the trainer uses.

    torchrun --nproc-per-node=2 tests/_sync_worker.py MODEL_DIR OUT_DIR TENSOR_PARALLEL_SIZE

1. Each replica samples responses; the learner makes one large SGD update on them (the weights move).
2. `engine.sleep()`, `engine.sync_weights(learner.named_parameters_for_sync())`, `engine.wake_up()`: the trainer's
   sequence, streaming one gathered tensor at a time from the ZeRO-3 shards.
3. Each replica samples again; the learner computes log-probs of those samples. Rank R writes OUT_DIR/rank<R>.pt
   with both sets of log-probs, the engine's log-probs of the step-1 responses before and after the sync, and the
   learner's of them after the update.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from dapo import distributed as dist  # noqa: E402
from dapo.learner import Learner, LossSpec, PolicyBatch, response_mask  # noqa: E402
from dapo.rollout import make_engine  # noqa: E402
from dapo.rollout.replicas import ReplicaLayout, sampling_seed, share_seeds, split_samples  # noqa: E402
from dapo.rollout.sync_check import digest  # noqa: E402
from dapo.rollout.vllm_engine import _checksums  # noqa: E402

PROMPTS = [[5, 17, 33, 60], [100, 7], [250, 251, 252, 9, 11, 3]]
N, MAX_TOKENS = 4, 12


def policy_batch(prompts: list[list[int]], responses: list[list[int]]) -> PolicyBatch:
    n = len(responses)
    return PolicyBatch(
        prompt_ids=prompts,
        response_ids=responses,
        advantages=torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(n)]),
        loss_mask=response_mask(responses),
        group_ids=torch.arange(n) // N,
    )


def flat(prompts: list[list[int]], groups: list) -> tuple[list[list[int]], list[list[int]], list[list[float]]]:
    samples = [(p, s) for p, g in zip(prompts, groups, strict=True) for s in g]
    return [p for p, _ in samples], [s.response_ids for _, s in samples], [s.logprobs for _, s in samples]


def every_ranks(prompts: list[list[int]], responses: list[list[int]]) -> tuple[list, list, slice]:
    """The batch of every rank's samples (the learner takes the whole batch on every rank), and this rank's rows."""
    parts = dist.all_gather((prompts, responses))
    start = sum(len(p) for p, _ in parts[: dist.rank()])
    mine = slice(start, start + len(prompts))
    return [x for p, _ in parts for x in p], [x for _, r in parts for x in r], mine


def learner_logprobs(learner: Learner, prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
    """The learner's log-probs of this rank's samples (computed over every rank's, as the learner takes them)."""
    all_prompts, all_responses, mine = every_ranks(prompts, responses)
    lp, _ = learner.compute_logprobs(policy_batch(all_prompts, all_responses))
    return [lp[i, : len(r)].tolist() for i, r in enumerate(all_responses)][mine]


def main() -> None:
    model_dir, out, tp = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    info = dist.init_distributed()
    layout = ReplicaLayout.of_this_process(tp)
    learner = Learner(
        model_dir,
        loss=LossSpec(loss_agg="token-mean"),  # one update from the sampling weights: ratio 1, nothing clipped
        lr=2.0,
        grad_clip=1e6,
        zero_stage=3,
        dtype="float32",
        optimizer=lambda params: torch.optim.SGD(params, lr=1.0),  # one step = lr x gradient: exactness checks
        logprob_chunk_size=16,
    )
    learner.offload_states()
    engine = make_engine("vllm", model_dir, dtype="float32", max_model_len=128, seed=0, tensor_parallel_size=tp)

    share = split_samples(len(PROMPTS), N, layout.num_replicas)[layout.replica]  # the trainer's split and seeds

    def sample(call: int) -> tuple[list[list[int]], list[list[int]], list[list[float]]]:
        seeds = share_seeds(sampling_seed(0, call), share.prompts, share.counts, share.first)
        prompts = [PROMPTS[i] for i in share.prompts]
        return flat(prompts, engine.generate(prompts, share.counts, MAX_TOKENS, seeds=seeds))

    prompts, responses, _ = sample(1)
    before_sync = engine.score(prompts, responses)
    engine.sleep()
    learner.reload_states()
    batch = policy_batch(*every_ranks(prompts, responses)[:2])
    batch.old_logp, _ = learner.compute_logprobs(batch)
    learner.update(batch)
    after_update = learner_logprobs(learner, prompts, responses)

    engine.sync_weights(learner.named_parameters_for_sync())
    learner.offload_states()
    engine.wake_up()
    synced = engine.score(prompts, responses)
    new_prompts, new_responses, sampled = sample(2)
    learner.reload_states()
    # every engine tensor's checksum (not only this sync's sample), summed over the tensor-parallel ranks, against
    # the learner's: sharded tensors add up, replicated ones count once
    check = engine.sync_check
    got = engine.llm.collective_rpc(_checksums, kwargs={"names": list(check.sources)})[0]
    streamed = {n: digest(t, check.dtype) for n, t in learner.named_parameters_for_sync()}
    differ = [n for n, parts in check.sources.items() if got[n] != sum(streamed[h] for h in parts)]
    torch.save(
        {
            "checksums_differ": differ,
            "checked": sorted(check.sources),
            "replica": layout.replica,
            "responses": new_responses,
            "sampled": sampled,
            "learner": learner_logprobs(learner, new_prompts, new_responses),
            "engine_before_sync": before_sync,
            "engine_after_sync": synced,
            "learner_after_update": after_update,
        },
        out / f"rank{info.rank}.pt",
    )
    dist.barrier()
    engine.close()  # vLLM's shutdown ends the process group: after the last collective


if __name__ == "__main__":
    main()
