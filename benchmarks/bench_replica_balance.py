"""How evenly the rollout replicas' work is spread: the tokens each replica generates when a generation batch is
cut by prompts (each replica all G responses of B/R prompts) or by samples (`split_samples`: part of every
prompt's group), on responses the tiny world's base model really samples.

    .venv/bin/python benchmarks/bench_replica_balance.py [--batches 20] [--replicas 2 4 8] [--quick]

One vLLM engine samples `--batches` generation batches of the tiny preset (32 training prompts x 8 responses, the
preset's sampling settings). Each batch's responses are then dealt to R replicas both ways; the samples of one
prompt are independent draws, so which replica draws which of them does not change their distribution, and one
sampled batch serves both cuts. The figure is the busiest replica's tokens over the mean replica's (1.00: even):
a generation batch waits for its busiest replica. Tokens, not seconds: a replica's decoding time grows with the
tokens it generates and with its longest response (`time/generate` in BENCHMARKS.md section 10 is the timed
version at R = 2).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parent.parent


def busiest_over_mean(loads: list[int]) -> float:
    return max(loads) / statistics.mean(loads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--replicas", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--quick", action="store_true", help="3 batches, nothing recorded")
    args = ap.parse_args()
    from _common import machine, md_table, print_table, record, tiny_training_prompts

    from dapo.rollout import make_engine
    from dapo.rollout.replicas import share_seeds, split_evenly, split_samples

    info = machine()
    cfg, model, problems, prompts = tiny_training_prompts()
    b, n, max_tokens = cfg.trainer.train_batch_size, cfg.rollout.n, cfg.rollout.max_response_length
    batches = 3 if args.quick else args.batches
    engine = make_engine("vllm", model, dtype=cfg.model.dtype, max_model_len=cfg.data.max_prompt_length + max_tokens)
    by_prompt: dict[int, list[float]] = {r: [] for r in args.replicas}
    by_sample: dict[int, list[float]] = {r: [] for r in args.replicas}
    for k in range(batches):
        batch = prompts[k * b : (k + 1) * b]
        groups = engine.generate(
            batch,
            n=n,
            max_tokens=max_tokens,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            seeds=share_seeds(k, range(b), [n] * b, [0] * b),
        )
        lengths = [[len(s.response_ids) for s in g] for g in groups]  # [prompt][sample]
        for r in args.replicas:
            by_prompt[r].append(busiest_over_mean([sum(sum(lengths[i]) for i in run) for run in split_evenly(b, r)]))
            loads = [
                sum(sum(lengths[i][j0 : j0 + c]) for i, c, j0 in zip(s.prompts, s.counts, s.first, strict=True))
                for s in split_samples(b, n, r)
            ]
            by_sample[r].append(busiest_over_mean(loads))
    engine.close()

    header = ["replicas", "cut", "busiest / mean, median", "90th percentile", "worst"]
    rows = []
    for r in args.replicas:
        for name, xs in (("by prompts", by_prompt[r]), ("by samples", by_sample[r])):
            q = sorted(xs)
            rows.append([r, name, f"{statistics.median(q):.3f}", f"{q[int(0.9 * (len(q) - 1))]:.3f}", f"{q[-1]:.3f}"])
    print_table(f"Generated tokens per replica, {batches} batches of {b} prompts x {n}", header, rows)
    if not args.quick:
        body = (
            f"{batches} generation batches of the tiny preset ({b} training prompts x {n} responses, up to "
            f"{max_tokens} tokens) sampled by the tiny world's base model, each dealt to R replicas both ways; "
            f"the busiest replica's tokens over the mean replica's.\n\n{md_table(header, rows)}"
        )
        record("replica-balance", "benchmarks/bench_replica_balance.py " + " ".join(sys.argv[1:]), info, body)


if __name__ == "__main__":
    main()
