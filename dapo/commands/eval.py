"""`dapo eval`: evaluate any model on the config's eval set with the configured engine, print avg@n / pass@k / maj@n
with confidence intervals, write `samples.jsonl` and `metrics.json` to --out, and log both to MLflow (into --run-id's
run, else a new one). A training run evaluates its final model itself (DONE.json holds the result)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from dapo.commands.config import add_config_arguments

if TYPE_CHECKING:
    from dapo.config import RunConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument(
        "--model", help="Model directory to evaluate (default: model.path; `tiny`: the tiny world's base model)."
    )
    p.add_argument("--out", required=True, help="Output folder for samples.jsonl and metrics.json.")
    p.add_argument("--run-id", help="Log into this existing MLflow run (e.g. the training run) instead of a new one.")
    p.add_argument(
        "--step",
        type=int,
        help="MLflow step of the eval metrics (default with --run-id: the model's training step, from DONE.json "
        "beside the model or the run's last rollout step; without --run-id: 0).",
    )
    p.add_argument("--no-tracking", action="store_true", help="Write files only; log nothing to MLflow.")


def run(args: argparse.Namespace) -> int:
    import json
    import logging

    from transformers import AutoTokenizer

    from dapo.config import load_config
    from dapo.data.loaders import load_problems
    from dapo.data.prompts import tokenize_problems
    from dapo.evaluation.evaluate import evaluate, write_samples
    from dapo.rollout import make_engine
    from dapo.tinyworld import resolve_model_path, resolve_source
    from dapo.trainer.setup import eval_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load_config(args.config, preset=args.preset, overrides=args.overrides)
    path = args.model if args.model and args.model != "tiny" else resolve_model_path(cfg)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    step = 0 if args.no_tracking else mlflow_step(cfg, Path(path), args.run_id, args.step)  # before any load

    tok = AutoTokenizer.from_pretrained(path)
    problems, prompts, dropped = tokenize_problems(
        load_problems(resolve_source(cfg, "eval"), split="train"),  # deduplicated by problem text
        tok,
        use_chat_template=cfg.data.use_chat_template,
        max_prompt_length=cfg.data.max_prompt_length,
    )
    if dropped:
        logging.warning("dropped %d eval prompts longer than data.max_prompt_length", dropped)
    if not problems:
        raise SystemExit(
            f"dapo eval: no eval problems left from data.eval={cfg.data.eval!r} (empty, or every prompt is longer "
            f"than data.max_prompt_length={cfg.data.max_prompt_length})"
        )
    e, r = cfg.eval, cfg.rollout
    engine = make_engine(
        r.engine, path, dtype=cfg.model.dtype, seed=cfg.trainer.seed,
        max_model_len=max(len(p) for p in prompts) + cfg.resolved_eval_max_tokens(),
        tensor_parallel_size=r.tensor_parallel_size, gpu_memory_utilization=r.gpu_memory_utilization,
        cpu_kv_cache_gib=r.cpu_kv_cache_gib, enable_sleep_mode=False, config_overrides=cfg.model.config_overrides,
        batch_invariant=r.batch_invariant,
    )  # fmt: skip
    try:
        result = evaluate(engine, problems, prompts, eval_settings(cfg), seed_base=cfg.trainer.seed)
    finally:
        engine.close()
    samples_path = write_samples(result.samples, out / "samples.jsonl")
    metrics_path = out / "metrics.json"
    metrics_path.write_text(
        json.dumps({"model": str(path), "problems": len(problems), "n": e.n, "metrics": result.metrics}, indent=2)
        + "\n"
    )
    print_table(result.metrics, title=f"{cfg.data.eval}: {len(problems)} problems x n={e.n}  ({path})")
    print(f"wrote {samples_path} ({len(result.samples)} rows) and {metrics_path}")
    if not args.no_tracking:
        files, spool = [samples_path, metrics_path], out / "mlflow_spool"
        run_id = log_to_mlflow(cfg, result.metrics, files, run_id=args.run_id, step=step, spool_dir=spool)
        print(f"logged to MLflow run {run_id}")
    return 0


def mlflow_step(cfg: RunConfig, model: Path, run_id: str | None, step: int | None) -> int:
    """Where the eval point goes: `step` when given; into a new run, 0; into an existing run, the training step
    of the model (DONE.json beside its folder, written by `dapo train` with that run id), else the run's last
    logged rollout step. Raises SystemExit when none of these can be found."""
    if step is not None:
        return step
    if run_id is None:
        return 0
    import json

    from mlflow.tracking import MlflowClient

    from dapo import metric_names as M
    from dapo.tracking import fail_fast_http, resolve_uri

    done = model.parent / "DONE.json"
    if done.is_file():
        summary = json.loads(done.read_text())
        if summary.get("run_id") == run_id:
            return int(summary["step"])
    try:
        with fail_fast_http():  # a server that is away is named in seconds, not after MLflow's minutes of retries
            hist = MlflowClient(tracking_uri=resolve_uri(cfg.tracking.uri)).get_metric_history(run_id, M.ROLLOUT_STEP)
    except Exception as e:  # noqa: BLE001 (any failure to read it leaves the step unknown)
        raise SystemExit(
            f"dapo eval: cannot read the last rollout step of MLflow run {run_id} ({type(e).__name__}: {e}); "
            "pass --step N (the training step of --model) to log the point"
        ) from e
    if not hist:
        raise SystemExit(
            f"dapo eval: MLflow run {run_id} has no {M.ROLLOUT_STEP} points and {done} does not name it; "
            "pass --step N (the training step of --model)"
        )
    return int(max(m.step for m in hist))


def log_to_mlflow(
    cfg: RunConfig, metrics: dict[str, float], files: list[Path], *, run_id: str | None, step: int, spool_dir: Path
) -> str:
    """Metrics at `step` (see `mlflow_step`) and the files as artifacts under `eval/`; returns the run id."""
    import math

    from dapo import metric_names as M
    from dapo.tracking import Tracker, replay_pending

    replay_pending(spool_dir)  # what an earlier eval into this folder could not deliver

    tr = Tracker(
        cfg.tracking.uri,
        cfg.tracking.experiment,
        f"eval-{cfg.run_name()}",
        run_id=run_id,
        spool_dir=spool_dir,
        mark_running=False,
        tags=None
        if run_id
        else {M.TAG_ROW: cfg.tracking.row, M.TAG_PRESET: cfg.tracking.preset, M.TAG_SEED: str(cfg.trainer.seed)},
    )
    tr.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)}, step=step)
    for f in files:
        tr.log_artifact(f, artifact_path=M.EVAL_SAMPLES_FOLDER)
    tr.finish("FINISHED" if run_id is None else None)
    return tr.run_id


def print_table(metrics: dict[str, float], title: str = "") -> None:
    """avg@n / pass@k / maj@n with their confidence intervals, one row each."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("metric", "value (%)", "CI low", "CI high"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    from dapo.metric_names import EVAL_LEN_MEAN, EVAL_TRUNC_FRAC

    if EVAL_TRUNC_FRAC in metrics:
        table.caption = (
            f"{100 * metrics[EVAL_TRUNC_FRAC]:.1f}% of responses hit the length cap; "
            f"mean length {metrics.get(EVAL_LEN_MEAN, float('nan')):.0f} tokens"
        )
    for name, v in metrics.items():
        if name.endswith(("_ci_low", "_ci_high")) or name in (EVAL_TRUNC_FRAC, EVAL_LEN_MEAN):
            continue
        cells = (v, metrics.get(f"{name}_ci_low"), metrics.get(f"{name}_ci_high"))
        label = name.removeprefix("eval/").replace("_at_", "@")
        table.add_row(label, *("" if c is None else f"{c:.1f}" for c in cells))
    Console().print(table)
