"""How evenly `split_by_tokens` spreads the paper's mini-batch over 128 ranks (issue 12: at most 10% above the mean).

    .venv/bin/python benchmarks/bench_sharding.py [--quick] [--trials 50] [--ranks 128] [--sigma 1.0]

The batch: one mini-batch of the paper's preset (DAPO section 5; configs/presets/qwen2.5-32b.yaml): 32 prompts x 16
responses, prompts <= 2048 tokens, responses <= 20480. Lengths are drawn, not measured (no 32B rollouts here):

- response length: log-normal with shape sigma (default 1.0), cut at 20,480 tokens (a response that would run
  longer stops at the cap, as a truncated one does), its median solved so that the mean *after* the cut is 2K,
  4K or 6K tokens: the span of the mean response length in the DAPO paper's training curve (it rises from about
  2K to about 6K tokens over the run; read off the figure, not a reported table). The share of responses at the
  cap that this implies is printed (none of the paper's numbers pins it; sigma moves it).
- prompt length: one per group, log-normal with median 200 tokens and sigma 0.5, cut at 2048 (DAPO-Math-17k
  prompts inside the DAPO template are a few hundred tokens).

Per mean length, over `--trials` mini-batches: the token imbalance of the split (busiest rank / mean - 1; forward
tokens = prompt + response - 1 per sequence), the lower bound that no split of whole sequences can beat (the
longest sequence / mean - 1, when one sequence is longer than the mean load), the old split by whole groups (what
`PolicyBatch.shard` did before: 32 groups over 128 ranks, 96 ranks idle), the imbalance of the same token split in
FLOPs of Qwen2.5-32B's forward + backward (linear layers, the head on response tokens, causal attention: what
tokens leave out), and the split's time in Python. Target: imbalance <= 10%, or the lower bound where that is
higher. Deterministic (seeded), not a timing benchmark: only the time column depends on the machine.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, md_table, print_table, record  # noqa: E402

from dapo.packing import Lengths, rank_loads, split_by_tokens  # noqa: E402
from dapo.shapes import KNOWN_MODELS, ModelShape  # noqa: E402

PROMPTS, GROUP, MAX_PROMPT, MAX_RESPONSE = 32, 16, 2048, 20480
PROMPT_MEDIAN, PROMPT_SIGMA = 200, 0.5
QWEN32B = KNOWN_MODELS["Qwen/Qwen2.5-32B"]
TARGET = 0.10


def phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def capped_lognormal_mean(mu: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for log X ~ N(mu, sigma^2), in closed form."""
    z = (math.log(cap) - mu) / sigma
    return math.exp(mu + sigma**2 / 2) * phi(z - sigma) + cap * (1.0 - phi(z))


def solve_mu(mean: float, sigma: float, cap: float) -> float:
    """The log-median whose capped log-normal has this mean (bisection; the capped mean rises with mu)."""
    lo, hi = -10.0, math.log(cap) + 10 * sigma
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if capped_lognormal_mean(mid, sigma, cap) < mean else (lo, mid)
    return (lo + hi) / 2


def draw_batch(rng: random.Random, mu: float, sigma: float) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """One mini-batch: prompt ids (shared within a group), response ids, group ids. Token values are irrelevant."""
    prompts, responses, groups = [], [], []
    for g in range(PROMPTS):
        plen = min(MAX_PROMPT, max(1, round(math.exp(math.log(PROMPT_MEDIAN) + PROMPT_SIGMA * rng.gauss(0, 1)))))
        prompt = [g] * plen
        for _ in range(GROUP):
            rlen = min(MAX_RESPONSE, max(1, round(math.exp(mu + sigma * rng.gauss(0, 1)))))
            prompts.append(prompt)
            responses.append([0] * rlen)
            groups.append(g)
    return prompts, responses, groups


def whole_group_split(prompts: list[list[int]], responses: list[list[int]], groups: list[int], world: int):
    """The split this replaces: whole groups, longest group first to the least-loaded rank."""
    tokens: dict[int, int] = {}
    for g, p, r in zip(groups, prompts, responses, strict=True):
        tokens[g] = tokens.get(g, 0) + len(p) + len(r) - 1
    load, owner = [0] * world, {}
    for g in sorted(tokens, key=lambda g: (-tokens[g], g)):
        k = min(range(world), key=lambda k: (load[k], k))
        owner[g], load[k] = k, load[k] + tokens[g]
    return [[i for i, g in enumerate(groups) if owner[g] == k] for k in range(world)]


def flops(prompt_len: int, response_len: int, s: ModelShape = QWEN32B) -> float:
    """Forward + backward FLOPs (3 x forward) of one sequence: every decoder layer's matmuls on its input tokens, the
    head on its response tokens only (as the chunked head computes), causal attention (half of the L x L scores)."""
    length = prompt_len + response_len - 1
    forward = 2 * s.layers * s.layer_params * length + 2 * s.embedding_params * response_len
    return 3.0 * (forward + 2 * s.layers * s.q_dim * length**2)


def imbalance(loads: list[float]) -> float:
    mean = sum(loads) / len(loads)
    return max(loads) / mean - 1 if mean > 0 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=50, help="mini-batches drawn per mean length")
    ap.add_argument("--ranks", type=int, default=128)
    ap.add_argument("--sigma", type=float, default=1.0, help="log-normal shape of the response length")
    ap.add_argument("--means", type=int, nargs="*", default=[2000, 4000, 6000], help="mean response lengths")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="3 trials, nothing recorded")
    args = ap.parse_args()
    trials = 3 if args.quick else args.trials
    info = machine()
    rows = []
    for mean in args.means:
        mu = solve_mu(mean, args.sigma, MAX_RESPONSE)
        at_cap = 1.0 - phi((math.log(MAX_RESPONSE) - mu) / args.sigma)
        rng = random.Random(f"{args.seed}-{mean}")
        ours, bound, old, in_flops, secs = [], [], [], [], []
        for _ in range(trials):
            prompts, responses, groups = draw_batch(rng, mu, args.sigma)
            t0 = time.perf_counter()
            lengths = Lengths.of(prompts, responses)
            split = split_by_tokens(lengths, args.ranks)
            secs.append(time.perf_counter() - t0)
            loads = rank_loads(lengths, split)
            ours.append(imbalance(loads))
            longest = max(len(p) + len(r) - 1 for p, r in zip(prompts, responses, strict=True))
            bound.append(max(0.0, longest / (sum(loads) / args.ranks) - 1))
            old.append(imbalance(rank_loads(lengths, whole_group_split(prompts, responses, groups, args.ranks))))
            in_flops.append(imbalance([sum(flops(len(prompts[i]), len(responses[i])) for i in rows) for rows in split]))
        met = sum(o <= max(TARGET, b) + 1e-12 for o, b in zip(ours, bound, strict=True))
        rows.append(
            [
                f"{mean:,}",
                f"{math.exp(mu):,.0f}",
                f"{at_cap:.2%}",
                f"{statistics.median(ours):.1%} / {max(ours):.1%}",
                f"{statistics.median(bound):.1%} / {max(bound):.1%}",
                f"{met}/{trials}",
                f"{statistics.median(old):.0%}",
                f"{statistics.median(in_flops):.1%} / {max(in_flops):.1%}",
                f"{statistics.median(secs) * 1e3:,.0f}",
            ]
        )
    header = [
        "mean response",
        "median",
        "at the cap",
        "token imbalance (median / worst)",
        "lower bound (median / worst)",
        "<= max(10%, bound)",
        "whole groups (old split)",
        "same split in 32B FLOPs",
        "split ms",
    ]
    title = f"{PROMPTS} x {GROUP} sequences over {args.ranks} ranks, {trials} mini-batches per row, sigma {args.sigma}"
    print_table(title, header, rows)
    if not args.quick:
        body = f"{title}.\n\n" + md_table(header, rows)
        record("sharding", ".venv/bin/python benchmarks/bench_sharding.py " + " ".join(sys.argv[1:]), info, body)


if __name__ == "__main__":
    main()
