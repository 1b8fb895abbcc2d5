"""The learner update packed against padded (`trainer.packing`), interleaved in one process: real tokens per
second, their ratio and the padded share of each, at DAPO-like lengths on the 66M model, and at the tiny world's
shape (long prompts, short responses) where sharing one copy of a prompt (`prompts`) pays.

    python benchmarks/bench_packing.py [--reps 3] [--shape dapo tiny] [--quick]

`dapo` shape: what one rank trains on in an update of the 32B preset, scaled to what 2 cores update in seconds:
its shard of a mini-batch is 4 responses (32 prompts x 16 over 128 ranks), here 4 such shards one after another
(4 groups of 4), exponential lengths of mean 500 capped at 2,048 (the preset's 5K and 20K over 10), prompts of
60-200 tokens, the budget of verl's rule, 2 x (prompt cap 256 + response cap) = 4,608 tokens (padded tokens with
`none`, real ones packed); the old-log-prob pass takes the 16 at once at 1.5 times that. `tiny` shape: the tiny
preset's (prompts ~100 tokens, responses ~30, a 4,096-token budget, 16 groups of 8 in one update) on a random model
of the tiny world's size. Every update trains on the same batch (at lr 1e-6 the weights hardly move),
ZeRO-0, float32, one rank; the old-log-prob pass (`compute_logprobs`) is timed too.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, interleaved, machine, md_table, median, print_table, random_qwen2, record, spread  # noqa: E402

SHAPES = {
    # model, (groups, responses each), prompt range, response mean / cap, micro_batch_tokens
    "dapo": (dict(vocab=32000, hidden=512, layers=8, heads=8, intermediate=2048), (4, 4), (60, 200), (500, 2048), 4608),
    "tiny": (dict(vocab=1024, hidden=128, layers=4, heads=4, intermediate=512), (16, 8), (90, 110), (30, 48), 4096),
}
QUICK = (dict(vocab=512, hidden=64, layers=2, heads=4, intermediate=128), (2, 8), (20, 40), (40, 128), 256)
PACKINGS = ("none", "sequences", "prompts")


def make_batch(groups: tuple[int, int], prompt_range: tuple[int, int], lengths: tuple[int, int], vocab: int, seed=0):
    """`groups` = (groups, responses each), exponential lengths (mean, cap), one prompt per group."""
    import torch

    from dapo.learner import PolicyBatch, response_mask

    g = torch.Generator().manual_seed(seed)
    mean, cap = lengths
    prompts, responses = [], []
    n_groups, size = groups
    for _ in range(n_groups):
        p = torch.randint(10, vocab, (int(torch.randint(*prompt_range, (1,), generator=g)),), generator=g).tolist()
        for _ in range(size):
            n = min(cap, max(1, math.ceil(float(torch.empty(1).exponential_(1 / mean, generator=g)))))
            prompts.append(p)
            responses.append(torch.randint(10, vocab, (n,), generator=g).tolist())
    n = len(responses)
    adv = torch.randn(n, generator=g)
    return PolicyBatch(prompts, responses, adv, response_mask(responses), torch.arange(n) // size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions after one warm-up")
    ap.add_argument("--shape", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--quick", action="store_true", help="a tiny model, 1 repetition, nothing recorded")
    args = ap.parse_args()
    import torch

    from dapo.learner import Learner, LossSpec
    from dapo.packing import TokenCounts, learner_tokens

    info = machine()
    body = []
    for shape in args.shape:
        model_kw, groups, prompt_range, lengths, budget = QUICK if args.quick else SHAPES[shape]
        path = random_qwen2(f"packing-{'quick' if args.quick else shape}", **model_kw)
        batch = make_batch(groups, prompt_range, lengths, model_kw["vocab"])
        per_update = groups[0] if shape == "dapo" and not args.quick else 1  # updates, each on one shard
        cases, shards = {}, []
        for packing in PACKINGS:
            learner = Learner(
                str(path), loss=LossSpec(eps_low=0.2, eps_high=0.28, loss_agg="token-mean"), lr=1e-6,
                zero_stage=0, dtype="float32", micro_batch_tokens=budget, forward_micro_batch_tokens=budget * 3 // 2,
                logprob_chunk_size=1024, packing=packing,
            )  # fmt: skip
            if not shards:  # the same old log-probs (and shards) for every layout
                batch.old_logp, _ = learner.compute_logprobs(batch)
                shards = [batch.select(rows.tolist()) for rows in torch.arange(len(batch)).chunk(per_update)]
            # at lr 1e-6 the weights hardly move: every repetition trains on the same batch
            cases[f"{packing} update"] = lambda lr=learner, parts=shards: [lr.update(part) for part in parts]
            cases[f"{packing} old log-probs"] = lambda lr=learner, b=batch: lr.compute_logprobs(b)
        times = interleaved(cases, reps=1 if args.quick else args.reps, warmup=1)
        real = sum(len(p) + len(r) - 1 for p, r in zip(batch.prompt_ids, batch.response_ids, strict=True))
        rows = []
        padded_update = median(times["none update"])
        padded_forward = median(times["none old log-probs"])
        for packing in PACKINGS:
            up, fw = median(times[f"{packing} update"]), median(times[f"{packing} old log-probs"])
            parts = [learner_tokens(part.lengths(), 1, budget, packing) for part in shards]
            counts = TokenCounts(
                *(sum(getattr(c, k) for c in parts) for k in ("computed", "padding", "passes_per_rank"))
            )
            fcounts = learner_tokens(batch.lengths(), 1, budget * 3 // 2, packing)
            rows.append([
                packing, f"{counts.computed:,} ({counts.passes_per_rank})", f"{counts.padded_fraction:.1%}",
                f"{real / up:,.0f}", f"{padded_update / up:.2f}", spread(times[f"{packing} update"]),
                f"{fcounts.padded_fraction:.1%}", f"{real / fw:,.0f}", f"{padded_forward / fw:.2f}",
            ])  # fmt: skip
        header = [
            "packing", "tokens computed (micro-batches)", "padded share", "update: real tokens/s", "x padded",
            "update s (min-max)", "old log-probs: padded share", "real tokens/s", "x padded",
        ]  # fmt: skip
        title = (
            f"{shape}: {len(batch)} responses ({groups[0]} groups of {groups[1]}), {real:,} real input tokens, prompts "
            f"{prompt_range[0]}-{prompt_range[1]}, responses exponential mean {lengths[0]} cap {lengths[1]} "
            f"(mean here {sum(len(r) for r in batch.response_ids) / len(batch):.0f}); model {json.dumps(model_kw)}; "
            f"micro_batch_tokens {budget:,} (no-grad passes {budget * 3 // 2:,}); {per_update} update(s) of "
            f"{len(shards[0])} responses each"
        )
        print_table(title, header, rows)
        body.append(f"**{title}**\n\n{md_table(header, rows)}")
    if not args.quick:
        reps = args.reps
        record(
            "packing",
            f".venv/bin/python benchmarks/bench_packing.py --reps {reps}",
            {**info, "reps": f"{reps} interleaved after 1 warm-up; medians"},
            "\n\n".join(body) + f"\n\n{fmt(torch.get_num_threads())} torch threads.",
        )


if __name__ == "__main__":
    main()
