# Helpers shared by the rules: config validation, run configs, paths and SLURM resources.
# Everything here runs when Snakemake parses the workflow, so a bad config stops the run before any job is
# submitted, with the file, the key and the fix.

import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from dapo.config import ABLATIONS_DIR, ConfigError, load_config
from dapo.metric_names import PAPER_TABLE1

RESUME_EXIT_CODE = 75  # dapo train's "resume me" code (SLURM time limit, preemption): see README


validate(config, schema="../schemas/config.schema.yaml")

# Rules call the `dapo` CLI: make the environment Snakemake runs in (the project's venv) the one they find,
# locally and in SLURM jobs (the plugin submits with --export=ALL).
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

PRESET = str(config["preset"])
PRESET_NAME = Path(PRESET).stem if PRESET.endswith((".yaml", ".yml")) else PRESET
RESULTS = Path(config["results"]).resolve() / PRESET_NAME
SEEDS = [int(s) for s in config["seeds"]]
OVERRIDES = list(config.get("overrides") or [])
ALL_ROWS = sorted(p.stem for p in ABLATIONS_DIR.glob("*.yaml"))
ROWS = ALL_ROWS if config["rows"] == "all" else list(config["rows"])
_unknown = [r for r in ROWS if r not in ALL_ROWS]
if _unknown:
    raise WorkflowError(
        f"configs/workflow.yaml (or --config rows=...): unknown row(s) {_unknown}; rows are {ALL_ROWS}"
    )
TRACKING_URI = (
    config.get("tracking_uri")
    or os.environ.get("MLFLOW_TRACKING_URI")
    or f"sqlite:///{RESULTS}/mlflow.db"
)
EXPERIMENT = config.get("experiment") or f"dapo-{PRESET_NAME}"


def _resolve(row, seed, extra=()):
    try:
        return load_config(
            ABLATIONS_DIR / f"{row}.yaml",
            preset=PRESET,
            overrides=[*OVERRIDES, f"trainer.seed={seed}", *extra],
        )
    except ConfigError as e:
        raise WorkflowError(f"row {row}, seed {seed}: {e}") from None


# Resolve and validate every run config now, before anything is scheduled.
RUN_CFGS = {(row, seed): _resolve(row, seed) for row in ROWS for seed in SEEDS}
BASE = next(iter(RUN_CFGS.values()))
IS_TINY = BASE.model.path == "tiny"
TINY_DIR = Path(config.get("tiny_world") or RESULTS / "tiny_world").resolve()


def q(*parts):
    """Shell-quote a command line's words."""
    import shlex

    return " ".join(shlex.quote(str(p)) for p in parts)


def run_dir(row, seed):
    return RESULTS / "runs" / row / f"s{seed}"


def base_model_path():
    """The model every row starts from: the tiny world's, or a hub model cached under results/models/."""
    if IS_TINY:
        return TINY_DIR / "model"
    if Path(BASE.model.path).exists():
        return Path(BASE.model.path)
    return RESULTS / "models" / BASE.model.path.replace("/", "--")


def base_model_marker():
    if IS_TINY:
        return TINY_DIR / "manifest.json"
    if Path(BASE.model.path).exists():
        return Path(BASE.model.path) / "config.json"
    return base_model_path() / ".complete"


def run_overrides(row, seed):
    """What every train/eval call of one run gets on top of the preset and the row file."""
    data = RESULTS / "data"
    return [
        *OVERRIDES,
        f"trainer.seed={seed}",
        f"model.path={base_model_path()}",
        f"tiny.dir={TINY_DIR}",
        f"data.train={data / 'train.jsonl'}",
        f"data.eval={data / 'eval.jsonl'}",
        f"tracking.uri={TRACKING_URI}",
        f"tracking.experiment={EXPERIMENT}",
        f"tracking.preset={PRESET_NAME}",
    ]


def slurm_resources(kind):
    """SLURM resources of one job kind from the preset (snakemake-executor-plugin-slurm's names)."""
    r = getattr(BASE.resources, kind)
    res = {
        "nodes": r.nodes,
        "mem_mb": r.mem_mb,
        "runtime": r.runtime_min,
        "cpus_per_task": r.cpus_per_task,
    }
    if r.gpus_per_node:
        res["gpu"] = r.nodes * r.gpus_per_node  # --gpus=<total> (or <model>:<total>)
        if r.gpu_model:
            res["gpu_model"] = r.gpu_model
        # the plugin otherwise takes `tasks` as tasks *per GPU*; 0 leaves the task count to `tasks`/SLURM
        res["tasks_per_gpu"] = 0
    if kind == "train" and r.world_size > 1:
        # one process per GPU across the nodes: the rule's shell starts them with srun
        res["mpi"] = "srun"
        res["tasks"] = r.world_size
    return res


def train_priority(row, seed):
    """Start the rows that sample the most first (dynamic sampling draws up to max_num_gen_batches generation
    batches per step): longest job first keeps both cores busy to the end of a local run (BENCHMARKS.md, 5)."""
    return 1 if RUN_CFGS[(row, int(seed))].algorithm.dynamic_sampling else 0


def launcher(kind):
    """How a job starts its processes: one per GPU under SLURM (srun), torchrun elsewhere."""
    world = getattr(BASE.resources, kind).world_size
    if world == 1:
        return ""
    return (
        f'$( [ -n "${{SLURM_JOB_ID:-}}" ] && echo "srun --kill-on-bad-exit=1" '
        f'|| echo "torchrun --standalone --nproc-per-node={world}" )'
    )


def print_plan():
    """The plan in words: jobs, nodes, GPUs, hours (printed once, by the main process)."""
    tr, ev = BASE.resources.train, BASE.resources.eval
    n = len(ROWS) * len(SEEDS)
    gpu_h = n * (tr.nodes * tr.gpus_per_node * tr.runtime_min + ev.nodes * ev.gpus_per_node * ev.runtime_min) / 60
    lines = [
        f"dapo ablation: preset {PRESET_NAME}, {len(ROWS)} rows x {len(SEEDS)} seeds = {n} runs "
        f"-> results in {RESULTS}, MLflow {TRACKING_URI} (experiment {EXPERIMENT})",
        f"  train job: {tr.nodes} node(s) x {tr.gpus_per_node} GPU(s) {tr.gpu_model or ''}, "
        f"{tr.runtime_min / 60:.1f} h limit, {BASE.trainer.total_steps} rollout steps, "
        f"{BASE.trainer.updates_per_step} updates/step",
        f"  eval job:  {ev.nodes} node(s) x {ev.gpus_per_node} GPU(s), {ev.runtime_min / 60:.1f} h limit, "
        f"avg@{BASE.eval.n}",
        f"  at most {gpu_h:,.0f} GPU-hours in all (time limits x GPUs)" if gpu_h else "  CPU only",
    ]
    for row in ROWS:
        label = PAPER_TABLE1.get(row, (row, None))
        lines.append(f"  {row:<28} {label[0]:<28} paper AIME avg@32: {label[1]}")
    print("\n".join(lines), file=sys.stderr)


if workflow.is_main_process:
    print_plan()
