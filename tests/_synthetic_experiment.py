"""A synthetic MLflow experiment shaped like a real ablation (same tags, params and metric names as the trainer
logs), with made-up curves whose final values are given: test plumbing for the report's and the MLflow UI's
tests (it lived in the package until it was seen to have no user there). To try `dapo report` on it:

    python tests/_synthetic_experiment.py --tracking-uri sqlite:///results/demo.db --experiment demo
    dapo report --experiment demo --tracking-uri sqlite:///results/demo.db --out results/demo_report
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dapo import metric_names as M

# Our made-up final avg@k per row and seed (percent); the paper's numbers minus a little, spread by seed.
DEFAULT_FINAL = {row: [paper - 8 + 1.5 * s for s in (0, 1)] for row, (_, paper) in M.PAPER_TABLE1.items()}


def curves(
    row_index: int, final_avg: float, seed: int, steps: np.ndarray, k: int, updates_per_step: int
) -> dict[str, np.ndarray]:
    """Made-up per-step curves [S] for one run: accuracy rises to `final_avg`, entropy collapses without
    clip-higher (rows 0-1) and holds with it, responses lengthen, all-correct groups grow."""
    frac = steps / max(int(steps[-1]), 1)
    rng = np.random.default_rng(1000 * row_index + seed)
    avg = 10.0 + (final_avg - 10.0) * frac
    entropy = (
        0.9 * np.exp(-3 * frac) + 0.05 if row_index < 2 else 0.9 - (0.35 - 0.06 * (row_index - 2)) * frac + 0.02 * seed
    )
    tokens = 4000.0 + 100 * steps * (3.0 if row_index == 5 else 1.0)
    out = {
        M.eval_avg(k): avg,
        M.eval_pass(k): np.minimum(100.0, avg + 30),
        M.eval_maj(k): avg + 5,
        M.ENTROPY: entropy,
        M.RESP_LEN_MEAN: 200 + 300 * frac * (1 + 0.2 * row_index) + rng.normal(0, 5, steps.size),
        M.CLIP_HIGH_PROB: 0.12 + 0.04 * frac + 0.005 * row_index,
        M.ALL_CORRECT_FRAC: 0.05 + (0.25 + 0.04 * row_index) * frac,
        M.ACC_MEAN: avg / 100,
        M.ACC_GENERATED: avg / 100 + rng.normal(0, 0.01, steps.size),
        M.GRAD_UPDATES: steps * float(updates_per_step),
        M.ROLLOUT_STEP: steps.astype(float),
        M.DS_TOKENS_GENERATED: tokens,
        M.DS_TOKENS_GENERATED_TOTAL: np.cumsum(np.where(steps >= 1, tokens, 0.0)),  # training steps are 1..
        M.TIME_TOTAL: 60.0 * (steps + 1) * (1.5 if row_index == 5 else 1.0),
        # what the mechanisms table reads: each toggle moves its quantity the paper's way, with seed noise
        M.TRUNC_LOSS_TOKEN_FRAC: (0.0 if row_index >= 1 else 0.08) + 0.0 * frac,
        M.CLIPFRAC_HIGH: (0.002 if row_index >= 2 else 0.006) + rng.normal(0, 2e-4, steps.size),
        M.RESP_TRUNC_FRAC: (0.02 if row_index >= 3 else 0.09) * (1 - 0.5 * frac) + rng.normal(0, 2e-3, steps.size),
        M.ZERO_ADV_TRAINED_FRAC: (0.0 if row_index == 5 else 0.3) + 0.0 * frac,
    }
    for name in (M.eval_avg(k), M.eval_pass(k), M.eval_maj(k)):
        out[M.ci_low(name)] = out[name] - 6.0
        out[M.ci_high(name)] = out[name] + 6.0
    return out


def build_synthetic_experiment(
    tracking_uri: str,
    experiment: str,
    final_avg: dict[str, list[float]] | None = None,
    *,
    k: int = 32,
    total_steps: int = 20,
    eval_every: int = 5,
    drop_metrics: dict[str, list[str]] | None = None,
    preset: str = "synthetic",
    train_batch_size: int = 512,
    mini_batch_size: int = 32,
    samples: dict[str, list[np.ndarray]] | None = None,
) -> str:
    """Create `experiment` with one finished run per (row, seed) of `final_avg` (row -> per-seed final avg@k).

    Run names `<row>-s<seed>`, tags TAG_ROW/TAG_SEED/TAG_PRESET/TAG_STATUS, flat params like the trainer's.
    Training metrics are logged every rollout step 1..total_steps; eval metrics at 0, every `eval_every` and
    the last step. `drop_metrics` (row -> names) leaves metrics out, to test missing-data handling.
    `samples` (row -> per seed a [P, n] bool array of which final-eval samples were correct) logs each run's
    `eval/samples.jsonl` artifact, as `dapo eval --run-id` does (problem ids `p0`, `p1`, ...); those runs' final
    avg@k is then the mean of their samples, whatever `final_avg` says. Returns the experiment id.
    """
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    final_avg = DEFAULT_FINAL if final_avg is None else final_avg
    drop_metrics = drop_metrics or {}
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
    ups = train_batch_size // mini_batch_size
    steps = np.arange(0, total_steps + 1)
    eval_steps = set(range(0, total_steps + 1, eval_every)) | {total_steps}
    rows = list(M.PAPER_TABLE1)
    now = int(time.time() * 1000)
    samples = samples or {}
    for row, finals in final_avg.items():
        ri = rows.index(row) if row in rows else len(rows)
        for seed, final in enumerate(finals):
            correct = samples[row][seed] if row in samples else None
            if correct is not None:
                final = 100.0 * float(np.asarray(correct, dtype=float).mean())
            tags = {M.TAG_ROW: row, M.TAG_SEED: str(seed), M.TAG_PRESET: preset, M.TAG_STATUS: "finished"}
            run = client.create_run(exp_id, run_name=f"{row}-s{seed}", tags=tags, start_time=now)
            params = {
                "eval.n": k,
                "trainer.seed": seed,
                "trainer.train_batch_size": train_batch_size,
                "trainer.mini_batch_size": mini_batch_size,
                "trainer.epochs": 1,
                "tracking.row": row,
                "trainer.total_steps": total_steps,
            }
            metrics = []
            eval_names = {M.eval_avg(k), M.eval_pass(k), M.eval_maj(k)}
            eval_names |= {f(n) for n in list(eval_names) for f in (M.ci_low, M.ci_high)}
            for name, values in curves(ri, final, seed, steps, k, ups).items():
                if name in drop_metrics.get(row, []):
                    continue
                for s, v in zip(steps, values, strict=True):
                    if (name in eval_names and s in eval_steps) or (name not in eval_names and s >= 1):
                        metrics.append(Metric(name, float(v), now + int(s), int(s)))
            for i in range(0, len(metrics), 900):  # MLflow caps a batch at 1000 metrics
                client.log_batch(
                    run.info.run_id,
                    metrics=metrics[i : i + 900],
                    params=[Param(a, str(b)) for a, b in params.items()] if i == 0 else [],
                    tags=[RunTag("mlflow.source.name", "tests/_synthetic_experiment.py")] if i == 0 else [],
                )
            if correct is not None:
                _log_samples(client, run.info.run_id, np.asarray(correct, dtype=bool))
            client.set_terminated(run.info.run_id, "FINISHED", end_time=now + 3_600_000)
    return exp_id


def _log_samples(client, run_id: str, correct: np.ndarray) -> None:
    """`eval/samples.jsonl` with one record per sample, the fields `dapo eval` writes that the report reads."""
    import json
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="dapo-synthetic-") as tmp:
        path = Path(tmp) / "samples.jsonl"
        with path.open("w") as fh:
            for p, row in enumerate(correct):
                for j, c in enumerate(row):
                    fh.write(json.dumps({"problem_id": f"p{p}", "sample_index": j, "correct": bool(c)}) + "\n")
        client.log_artifact(run_id, str(path), artifact_path="eval")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tracking-uri", required=True)
    p.add_argument("--experiment", default="dapo-synthetic")
    p.add_argument("--k", type=int, default=32)
    a = p.parse_args(argv)
    build_synthetic_experiment(a.tracking_uri, a.experiment, k=a.k)
    print(f"wrote experiment {a.experiment!r} to {a.tracking_uri}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
