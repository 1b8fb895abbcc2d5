"""The learner update's achieved FLOP/s against torch's own matmul rate at the model's shapes, on the same machine
(issue 12's goal: at least 50% on the 66M-parameter model of bench_learner.py).

    .venv/bin/python benchmarks/bench_learner_flops.py [--quick] [--reps 3] [--dtype float32] [--responses 8 32]
        [--budgets 0 1024 2048] [--sweep 256 512 1024 2048 4096] [--threads 0] [--profile]

Counted (model FLOPs, the "useful" work, for one `Learner.update` = forward + backward + optimizer step):

- every decoder linear layer (q, k, v, o, gate, up, down): 6 x its weights x the input tokens (prompt + response - 1
  per sequence; padding not counted);
- the output head on response positions only (the only ones the loss needs): 6 x V x H x response tokens;
- causal attention: 6 x L^2 x (heads x head dim) per layer and sequence (the causal half of QK^T and AV, 2 L^2 D in
  forward, twice that in backward); nothing for the optimizer step, the norms or the softmax (their time counts).

The peak: the model's matrix products of one micro-batch (every linear layer forward and both backward
products; the head's in chunks of `logprob_chunk_size` rows: its logits, their recomputation in backward and both
gradient products) run by torch.mm alone at micro-batches of `--sweep` padded tokens; the best rate is the most
this machine's torch delivers at the model's shapes, its physical limit for this model. Everything (each
configuration's update and each sweep point) is timed interleaved (A, B, C, A, B, C) so the machine's load falls on
all alike. "matmul FLOPs run / update time / peak" counts what the update really multiplies (padding and the
head's recomputation included): the share of its time that is matmul at peak rate. Below 50%, torch.profiler's
heaviest ops of one update are printed.

The mini-batch: bench_learner.py's random prompts of 32-64 tokens and responses of 32-128, `--responses` of them
(8: bench_learner's mini-batch; 32: the tiny preset's, 4 prompts x 8), ZeRO-0 (the fastest single-process path,
BENCHMARKS.md section 1), AdamW, micro-batches under each of `--budgets` tokens (0: the whole mini-batch in one,
as bench_learner does; a smaller budget cuts the length-sorted mini-batch into passes that pad less). The
numbers need a quiet machine: on a loaded one the update and the matmuls slow down unevenly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from _common import (  # noqa: E402
    interleaved,
    linears,
    machine,
    md_table,
    median,
    print_table,
    random_qwen2,
    record,
    useful_flops,
)
from bench_learner import MODELS, make_batch, profile  # noqa: E402

from dapo.shapes import ModelShape, shape_from_hf_config  # noqa: E402

GOAL = 0.5


def update_gemms(s: ModelShape, padded: list[tuple[int, int]], chunk: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of every matrix multiply of one update's forward + backward, per micro-batch (padded tokens, its
    response tokens): each linear layer's X W and, in backward, dY W^T and X^T dY; the head per chunk: logits,
    their recomputation in backward, dlogits W and dlogits^T H."""
    out = []
    for tokens, scored in padded:
        for a, b in linears(s):
            out += [(tokens, a, b), (tokens, b, a), (a, tokens, b)] * s.layers
        for start in range(0, scored, chunk):
            c = min(chunk, scored - start)
            out += [(c, s.hidden, s.vocab)] * 2 + [(c, s.vocab, s.hidden), (s.vocab, c, s.hidden)]
    return out


def matmul_case(gemms: list[tuple[int, int, int]], dtype: torch.dtype):
    """A callable that runs every (m, k, n) product once with torch.mm on preallocated random operands."""
    cache: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for m, k, n in gemms:
        if (m, k, n) not in cache:
            cache[(m, k, n)] = (
                torch.randn(m, k, dtype=dtype),
                torch.randn(k, n, dtype=dtype),
                torch.empty(m, n, dtype=dtype),
            )

    def run() -> None:
        for shape in gemms:
            a, b, c = cache[shape]
            torch.mm(a, b, out=c)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny model, 1 repetition, nothing recorded (a smoke test)")
    ap.add_argument("--model", default="qwen2-h512-l8-v32k", choices=list(MODELS))
    ap.add_argument("--responses", type=int, nargs="*", default=[8, 32], help="responses per mini-batch (8 per group)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument(
        "--budgets",
        type=int,
        nargs="*",
        default=[0, 1024, 2048],
        help="micro_batch_tokens to try (0: the whole mini-batch in one micro-batch)",
    )
    ap.add_argument(
        "--sweep",
        type=int,
        nargs="*",
        default=[256, 512, 1024, 2048, 4096],
        help="padded tokens per micro-batch at which torch.mm runs the model's products; the best is the peak",
    )
    ap.add_argument("--chunk", type=int, default=1024, help="logprob_chunk_size")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--profile", action="store_true", help="the heaviest ops even when the goal is met")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from dapo.learner import Learner, LossSpec, PolicyBatch, response_mask
    from dapo.packing import plan_micro_batches

    info = machine()
    name = "tiny" if args.quick else args.model
    reps = 1 if args.quick else args.reps
    kw, _, group, max_p, max_r = MODELS[name]
    path = random_qwen2(f"learner-{name}", **kw)
    shape, dtype = shape_from_hf_config(json.loads((path / "config.json").read_text())), getattr(torch, args.dtype)

    # Every configuration's learner first, so that all updates and all matmul sweeps interleave under one load.
    configs: dict[str, dict] = {}
    for n, budget_arg in [(n, b) for n in args.responses for b in args.budgets]:
        b = make_batch(n, group, max_p, max_r, kw["vocab"])
        budget = budget_arg or n * (max_p + max_r)
        learner = Learner(
            str(path),
            loss=LossSpec(eps_low=0.2, eps_high=0.28, loss_agg="token-mean"),
            lr=1e-6,
            grad_clip=1.0,
            zero_stage=0,
            dtype=args.dtype,
            micro_batch_tokens=budget,
            logprob_chunk_size=args.chunk,
            packing="none",  # the padded layout this benchmark counts (bench_packing.py compares the layouts)
        )
        batch = PolicyBatch(b["prompts"], b["responses"], b["advantages"], response_mask(b["responses"]), b["groups"])
        batch.old_logp, _ = learner.compute_logprobs(batch)
        lengths = [len(p) + len(r) - 1 for p, r in zip(batch.prompt_ids, batch.response_ids, strict=True)]
        plan = plan_micro_batches(lengths, budget)
        padded = [(len(mb) * lengths[mb[0]], sum(len(batch.response_ids[i]) for i in mb)) for mb in plan]
        configs[f"{n} x {budget}"] = dict(
            n=n,
            budget=budget,
            run=lambda lr=learner, bt=batch: lr.update(bt),
            plan=plan,
            tokens=sum(lengths),
            padded=sum(p for p, _ in padded),
            gemm_flops=sum(2.0 * m * k * q for m, k, q in update_gemms(shape, padded, args.chunk)),
            flops=useful_flops(shape, batch.prompt_ids, batch.response_ids),
            share=sum(len(r) for r in batch.response_ids) / sum(lengths),
        )
    share = next(iter(configs.values()))["share"]  # response tokens per input token (where the head runs)
    sweep = {m: update_gemms(shape, [(m, round(m * share))], args.chunk) for m in args.sweep}
    cases = {key: c["run"] for key, c in configs.items()}
    cases.update({f"mm {m}": matmul_case(g, dtype) for m, g in sweep.items()})
    times = interleaved(cases, reps=reps, warmup=1)

    sweep_rows = []
    for m, g in sweep.items():
        rate = sum(2.0 * a * k * q for a, k, q in g) / median(times[f"mm {m}"])
        sweep_rows.append([m, f"{rate / 1e9:,.1f}"])
    peak = max(float(r[1].replace(",", "")) for r in sweep_rows) * 1e9
    rows, prof_rows = [], []
    for key, c in configs.items():
        t = median(times[key])
        achieved = c["flops"]["total"] / t
        rows.append(
            [
                name,
                args.dtype,
                c["n"],
                f"{c['budget']:,}",
                f"{c['tokens']:,} / {c['padded']:,} ({len(c['plan'])})",
                f"{c['flops']['total'] / 1e9:,.1f} ({c['flops']['head'] / c['flops']['total']:.0%} head, "
                f"{c['flops']['attention'] / c['flops']['total']:.1%} attn)",
                f"{t * 1e3:,.0f}",
                f"{achieved / 1e9:,.1f}",
                f"{achieved / peak:.0%}",
                f"{c['gemm_flops'] / t / peak:.0%}",
            ]
        )
        if args.profile or achieved / peak < GOAL:
            top = profile(c["run"], top=10)
            prof_rows.append([name, c["n"], c["budget"], "; ".join(f"{k} {v:,.0f}" for k, v in top)])
    title = (
        f"Learner.update FLOP/s, {args.dtype}, ZeRO-0, world size 1, {torch.get_num_threads()} threads: "
        f"peak {peak / 1e9:,.1f} GFLOP/s (torch.mm, best of the sweep), goal {GOAL:.0%}"
    )
    header = [
        "model",
        "dtype",
        "responses",
        "budget",
        "tokens: useful / padded (micro-batches)",
        "model GFLOP / update",
        "update ms",
        "achieved GFLOP/s",
        "achieved / peak",
        "matmul FLOPs run / update time / peak",
    ]
    sheader = ["padded tokens per micro-batch", f"torch.mm, the model's products, {args.dtype}: GFLOP/s"]
    pheader = ["model", "responses", "budget", "self CPU ms: total; heaviest ops (one profiled update)"]
    print_table("torch.mm at the model's shapes", sheader, sweep_rows)
    print_table(title, header, rows)
    if prof_rows:
        print_table("Where the time goes", pheader, prof_rows)
    if not args.quick:
        body = f"{title}; {reps} interleaved repetitions after 1 warm-up.\n\n" + md_table(sheader, sweep_rows)
        body += "\n\n" + md_table(header, rows)
        if prof_rows:
            body += "\n\n" + md_table(pheader, prof_rows)
        record(
            f"learner_flops_{args.dtype}",
            ".venv/bin/python benchmarks/bench_learner_flops.py " + " ".join(sys.argv[1:]),
            info,
            body,
        )


if __name__ == "__main__":
    main()
