"""The eval split's trade: problems x samples per problem, against eval time and the 95% interval of avg@n.

    .venv/bin/python benchmarks/bench_eval_split.py [--quick] [--reps 3] [--model DIR] [--world results/tiny_world]

One vLLM engine (as `dapo eval` builds it: the tiny preset's dtype, eval temperature 1.0, top_p 0.7, 64 tokens)
samples each setting through `dapo.evaluation.evaluate`, interleaved after a warm-up call each; the median wall
time per eval is reported. The interval half-width is predicted for every setting from one reference eval with
many samples per problem (the problems' accuracies spread s2_b and the mean within-problem variance w, unbiased
from the reference): the variance of avg@n over P problems with n samples each is (s2_b + w / n) / P, and the
half-width is t_{0.975, P-1} times its square root. Each setting's own eval gives an observed half-width too.

The model: the tiny world's base model by default, or any checkpoint (`--model results/tiny/runs/.../final`), since
the half-width depends on the accuracy (largest near 50%). Timings need a quiet machine; the half-widths do not.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

# (split, problems, samples per problem); "aime": the 30-problem split (today's eval), "large": the large split
SETTINGS = [("aime", 30, 16), ("large", 640, 1), ("large", 320, 2), ("large", 400, 2), ("large", 160, 4)]
QUICK = [("aime", 30, 16), ("large", 640, 1)]
REFERENCE = ("large", 640, 8)  # the spread of problem accuracies, for the predicted half-widths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="two settings, 1 repetition, nothing recorded")
    ap.add_argument("--world", default="results/tiny_world", help="the tiny world (its splits; its model by default)")
    ap.add_argument("--model", default=None, help="the model to evaluate (default: the world's base model)")
    ap.add_argument("--no-record", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = ap.parse_args()

    import numpy as np
    from _common import interleaved, machine, md_table, median, print_table, record
    from transformers import AutoTokenizer

    from dapo.algos.evalstats import t_quantile
    from dapo.config import load_config
    from dapo.data.loaders import load_problems
    from dapo.data.prompts import tokenize_problems
    from dapo.evaluation import evaluate
    from dapo.rollout import make_engine
    from dapo.tinyworld import ensure_large_eval, tiny_paths

    info = machine()
    reps = 1 if args.quick else args.reps
    settings = QUICK if args.quick else SETTINGS
    world = Path(args.world).resolve()
    cfg = load_config(preset="tiny", overrides=[f"tiny.dir={world}", "tiny.n_eval_large=640"])
    model = args.model or str(tiny_paths(world).model)
    tok = AutoTokenizer.from_pretrained(model)
    splits = {"aime": load_problems(str(tiny_paths(world).eval)), "large": load_problems(str(ensure_large_eval(cfg)))}
    encoded = {}
    for name, problems in splits.items():
        kept, ids, _ = tokenize_problems(problems, tok, use_chat_template=True, max_prompt_length=10_000)
        encoded[name] = (kept, ids)
    max_tokens = cfg.resolved_eval_max_tokens()
    longest = max(len(p) for _, ids in encoded.values() for p in ids)
    engine = make_engine("vllm", model, dtype=cfg.model.dtype, max_model_len=longest + max_tokens, seed=0)

    def run(split: str, p: int, n: int) -> np.ndarray:
        problems, ids = encoded[split]
        res = evaluate(
            engine,
            problems[:p],
            ids[:p],
            n=n,
            max_tokens=max_tokens,
            temperature=cfg.eval.temperature,
            top_p=cfg.eval.top_p,
            pass_k=(1,),
            bootstrap=0,
        )
        y = np.zeros((p, n))
        index = {pr.id: i for i, pr in enumerate(problems[:p])}
        for s in res.samples:
            y[index[s["problem_id"]], s["sample_index"]] = s["correct"]
        return y

    ref = run(*REFERENCE)
    acc = ref.mean(axis=1)
    n_ref = ref.shape[1]
    within = float((acc * (1 - acc)).mean()) * n_ref / (n_ref - 1)  # unbiased mean within-problem variance
    between = max(0.0, float(np.var(acc, ddof=1)) - within / n_ref)
    observed: dict[tuple, list[float]] = {s: [] for s in settings}

    def case(s: tuple) -> None:
        y = run(*s)
        per_problem = y.mean(axis=1)
        observed[s].append(100 * t_quantile(0.95, s[1] - 1) * float(np.std(per_problem, ddof=1)) / np.sqrt(s[1]))

    times = interleaved({s: (lambda s=s: case(s)) for s in settings}, reps=reps, warmup=1)
    base = median(times[settings[0]])
    header = [
        "split",
        "problems x n",
        "samples",
        "median s / eval",
        "vs 30 x 16",
        "predicted ±95% (pts)",
        "observed ±95% (pts, median)",
    ]
    rows = []
    for s in settings:
        split, p, n = s
        pred = 100 * t_quantile(0.95, p - 1) * np.sqrt((between + within / n) / p)
        rows.append(
            [
                split,
                f"{p} x {n}",
                p * n,
                f"{median(times[s]):.2f}",
                f"{median(times[s]) / base:.2f}x",
                f"{pred:.1f}",
                f"{median(observed[s][1:] or observed[s]):.1f}",
            ]
        )
    engine.close()
    summary = (
        f"Model {model}: avg@{n_ref} on the {REFERENCE[1]}-problem reference {100 * ref.mean():.1f}%; spread of "
        f"problem accuracies s2_b {between:.4f}, mean within-problem variance {within:.4f}. {reps} interleaved "
        "repetitions after one warm-up call per setting."
    )
    print(summary)
    print_table("Eval split: time and 95% half-width of avg@n", header, rows)
    if not (args.quick or args.no_record):
        record(
            "eval_split",
            ".venv/bin/python benchmarks/bench_eval_split.py " + " ".join(sys.argv[1:]),
            info,
            f"{summary}\n\n{md_table(header, rows)}",
        )


if __name__ == "__main__":
    main()
