# Helpers shared by the rules: config validation, run configs, paths and SLURM resources.
# Everything here runs when Snakemake parses the workflow, so a bad config stops the run before any job is
# submitted, with the file, the key and the fix.

import dataclasses
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from dapo.config import ABLATIONS_DIR, ConfigError, load_config, resolve_preset
from dapo.designs import ALLOW_KEY, all_design_runs, check_ladder
from dapo.metric_names import PAPER_TABLE1

RESUME_EXIT_CODE = 75  # dapo train's "resume me" code (SLURM time limit, preemption): docs/failure-modes.md



def _typed(value):
    """--config 'plan={train_mfu: 0.3}' arrives as text (Snakemake reads nested values with YAML's BaseLoader)."""
    import yaml

    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    return yaml.safe_load(value) if isinstance(value, str) else value


config["plan"] = _typed(config.get("plan") or {})
config[ALLOW_KEY] = _typed(config.get(ALLOW_KEY, False))
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


# The ladder must be a clean ablation (each row the row above plus its own toggle, no scale key in a row) before
# anything runs from it, unless allow_confounded_ladder says a different ladder is meant (dapo/designs.py).
try:
    LADDER_PROBLEMS = check_ladder(ABLATIONS_DIR, PRESET, OVERRIDES, allow=bool(config.get(ALLOW_KEY)))
    # Every run a design trains, by run name: the ladder's rows and the leave-one-out / one-at-a-time runs
    # (dapo_minus_<toggle>, grpo_plus_<toggle>), each a ladder row file plus overrides (dapo/designs.py).
    RUN_SPECS = all_design_runs()
except (ConfigError, ValueError) as e:
    raise WorkflowError(f"nothing was submitted: {e}") from None


def run_config(name):
    """The config file run `name` starts from: its ladder row file (a design run's is the design's reference)."""
    return RUN_SPECS[name].config if name in RUN_SPECS else ABLATIONS_DIR / f"{name}.yaml"


def design_overrides(name):
    """What a design run sets on top of its ladder row file (nothing for a ladder row)."""
    return list(RUN_SPECS[name].overrides) if name in RUN_SPECS else []


def _resolve(row, seed, extra=()):
    try:
        return load_config(
            run_config(row),
            preset=PRESET,
            overrides=[*design_overrides(row), *OVERRIDES, f"trainer.seed={seed}", *extra],
        )
    except ConfigError as e:
        raise WorkflowError(f"row {row}, seed {seed}: {e}") from None


# Resolve and validate every run config now, before anything is scheduled.
RUN_CFGS = {(row, seed): _resolve(row, seed) for row in ROWS for seed in SEEDS}
BASE = next(iter(RUN_CFGS.values()))
IS_TINY = BASE.model.path == "tiny"


def drop_cpu_defaults():
    """The CPU-only defaults `make` exports for the tests and the tiny world (DAPO_CPU_DEFAULTS names the ones it set
    itself: DS_ACCELERATOR=cpu, HF_HUB_OFFLINE=1) leave this process's environment, so that neither the rules nor
    the SLURM jobs (the profile submits with --export=ALL) of a real model's preset see them: DeepSpeed would run on
    the CPU, and the base model's download would be refused. A value the user set before `make` is kept."""
    names = os.environ.pop("DAPO_CPU_DEFAULTS", "").split()
    return [f"{n}={os.environ.pop(n)}" for n in names if n in os.environ]


if not IS_TINY:
    _dropped = drop_cpu_defaults()
    if _dropped and workflow.is_main_process:
        print(f"note: not passed on to the jobs of preset {PRESET_NAME} (make's CPU defaults): {' '.join(_dropped)}",
              file=sys.stderr)


# Training jobs an earlier controller of this results folder left queued or running (it died, or was killed): a
# rerun waits for each of them (rule attach_train) instead of submitting the run a second time.
from dapo.cluster import live_train_jobs

LIVE_TRAIN_JOBS = live_train_jobs(RESULTS) if workflow.is_main_process else {}
for (_run, _seed), (_job, _state) in sorted(LIVE_TRAIN_JOBS.items()):
    print(f"note: {_run} s{_seed} is SLURM job {_job} ({_state}) from an earlier controller: waiting for it, not "
          "submitting it again", file=sys.stderr)


def kernel_env():
    """`env`'s assignments that start a train job: for the tiny preset the CPU kernels the tiny world was built with
    (dapo.tinyworld.pinned_kernels, by tiny.kernels), so that its numbers do not depend on the vector code a host's CPU would pick
    (checked by asking for other ATen kernels, and for MKL's other vendor through a stand-in); nothing for GPU
    presets."""
    from dapo.tinyworld import pinned_kernels

    return [f"{k}={v}" for k, v in pinned_kernels(BASE.tiny.kernels).items()] if IS_TINY else []

# The config's own tiny.dir (default results/tiny_world, where the tests cache it too): built once for both.
TINY_DIR = Path(config.get("tiny_world") or BASE.tiny.dir).resolve()


def q(*parts):
    """Shell-quote a command line's words for a rule's shell template (its braces doubled, so that Snakemake's
    formatting leaves a value's `{` and `}` alone). Values that vary per job go through params and `:q` instead."""
    import shlex

    return " ".join(shlex.quote(str(p)) for p in parts).replace("{", "{{").replace("}", "}}")


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
        *design_overrides(row),
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
    """SLURM resources of one job kind from the preset (snakemake-executor-plugin-slurm's names). Per node: memory,
    GPUs (`--gres=gpu[:<model>]:<per node>`), tasks; `srun_args` repeats the layout for the training step."""
    r = getattr(BASE.resources, kind)
    res = {
        "nodes": r.nodes,
        "mem_mb": r.mem_mb,
        "runtime": r.runtime_min,
        "cpus_per_task": r.cpus_per_task,
    }
    if r.gpus_per_node:
        gres_type = r.gres_type or r.gpu_model  # the cluster's GRES name; the GPU table's name when not given
        res["gres"] = f"gpu:{gres_type}:{r.gpus_per_node}" if gres_type else f"gpu:{r.gpus_per_node}"
        res["tasks_per_gpu"] = 0  # the plugin would add --ntasks-per-gpu otherwise; tasks per node say it all
    if kind == "train":
        # The rule runs in the job's batch step and starts the ranks itself (srun_args): the jobstep executor runs
        # a rule there, instead of inside a one-task `srun -n1` step, whenever the `mpi` resource exists. A
        # non-empty value makes the submit side ask for the tasks; "" (one task) keeps the plugin's --ntasks=1.
        if r.ranks_per_node > 1:
            res.update(mpi="srun", tasks_per_node=r.ranks_per_node)
        elif r.world_size > 1:
            res.update(mpi="srun", tasks=r.world_size)  # one rank on each of several nodes
        else:
            res["mpi"] = ""
        # The preemption signal goes to the job steps' tasks, i.e. every rank (never `B:`: that signals only the
        # batch shell, whose death ends the job). A requeued job appends to its SLURM log.
        res["slurm_extra"] = f"--signal=USR1@{int(BASE.trainer.stop_margin_s)} --open-mode=append"
        # Nodes this job holds, for throttling: `--resources train_nodes=32` lets at most 32 nodes of training
        # jobs run or queue at once (docs/cluster.md); without a limit, `jobs:` in the profile is the only cap.
        res["train_nodes"] = r.nodes
    return res


def srun_args(row, seed):
    """The training step's layout, spelled out: inside the job the SLURM_* task variables are gone."""
    r = BASE.resources.train
    gpus = f"--gpus-per-node={r.gpus_per_node} " if r.gpus_per_node else ""
    return (
        f"--nodes={r.nodes} --ntasks={r.world_size} --ntasks-per-node={r.ranks_per_node} {gpus}"
        f"--cpus-per-task={r.cpus_per_task} --kill-on-bad-exit=1 --job-name=dapo-{row}-s{seed}"
    )


def train_priority(row, seed):
    """Start the rows that sample the most first (dynamic sampling draws up to max_num_gen_batches generation
    batches per step): longest job first keeps both cores busy to the end of a local run (BENCHMARKS.md, 5)."""
    return 1 if RUN_CFGS[(row, int(seed))].algorithm.dynamic_sampling else 0


def local_launcher(kind):
    """How a job starts its ranks outside SLURM: one process (`env`, never an empty word: Snakemake drops those
    from a shell command), or torchrun on this machine. A multi-node layout has no local form: `dapo train` then
    refuses to start, naming resources.train."""
    r = getattr(BASE.resources, kind)
    if r.world_size == 1 or r.nodes > 1:
        return "env"
    return f"torchrun --standalone --nproc-per-node={r.ranks_per_node}"


RESUBMITS_KEY = "max_resubmits"  # configs/workflow.yaml: resubmissions of a job cut off by SLURM (exit 75)


def refuse_batch_signal(slurm_extra):
    """Stop before any job is submitted when the train rule's slurm_extra (as --set-resources or a profile's
    set-resources leave it) asks for a `B:` signal (dapo.cluster.batch_signal_problem says why)."""
    from dapo.cluster import batch_signal_problem

    why = batch_signal_problem(None if slurm_extra is None else str(slurm_extra.raw), BASE.trainer.stop_margin_s)
    if why:
        raise WorkflowError(f"nothing was submitted: {why}")


def _cpu_plan_lines():
    """The tiny (CPU) preset: what a step samples; no GPU budget, nothing to refuse."""
    r, a, t = BASE.rollout, BASE.algorithm, BASE.trainer
    ds = [row for (row, _), c in RUN_CFGS.items() if c.algorithm.dynamic_sampling]
    line = (
        f"  CPU only (no GPU budget): per rollout step {t.train_batch_size} prompts x {r.n} responses of up to "
        f"{r.max_response_length} tokens, {t.total_steps} steps, eval every {BASE.eval.every}"
    )
    if ds:
        line += (
            f"; dynamic sampling ({', '.join(sorted(set(ds)))}) draws up to {a.max_num_gen_batches} batches of "
            f"{a.gen_batch_size or t.train_batch_size} prompts"
        )
    return [line]


def plan_for_preset(plan):
    """The plan's assumptions for this preset: configs/workflow.yaml's `plan:` with its `presets.<name>` on top (a
    model's response lengths, say, differ from the 32B run's). Each key given there replaces the whole key."""
    own = (plan.get("presets") or {}).get(PRESET_NAME) or {}
    return {**{k: v for k, v in plan.items() if k != "presets"}, **own}  # a preset's key replaces the whole key


def train_concurrency():
    """Training jobs that may run (or queue) at once: the profile's `jobs:` (--jobs), and `train_nodes` in
    --resources divided by the nodes one job takes; every run when neither limits (a local run: one at a time)."""
    runs = len(ROWS) * len(SEEDS)
    jobs = workflow.resource_settings.nodes or 1  # --jobs (the profile's `jobs:`); unset: a local run
    limit = getattr(workflow.global_resources.get("train_nodes"), "value", None)  # --resources train_nodes=N
    by_nodes = int(limit) // BASE.resources.train.nodes if isinstance(limit, (int, float)) else runs
    return max(1, min(runs, jobs or runs, by_nodes))


def _gpu_plan(p):
    """Per-GPU memory budget and cost per row (dapo.plan, dapo.cost) for a GPU preset: (text lines, refusals,
    warnings)."""
    from dapo import cost as C
    from dapo import plan as P
    from dapo.shapes import GPUS, dtype_bytes, gpu_spec, resolve_shape, vllm_batching_defaults

    tr, r, t = BASE.resources.train, BASE.rollout, BASE.trainer
    given = {"memory_gib": p["gpu_memory_gib"], "bf16_tflops": p["gpu_bf16_tflops"], "hbm_tb_s": p["gpu_hbm_tb_s"]}
    gpu = gpu_spec(tr.gpu_model, given)
    if gpu is None:
        # No budget means no check that the run fits: refuse rather than submit 128 GPUs blind.
        return [], [
            f"resources.train.gpu_model {tr.gpu_model!r} is not in the GPU table ({', '.join(GPUS)}): name the GPU "
            "there (the cluster's own GRES name goes in resources.train.gres_type), or give its memory, bf16 peak "
            "and bandwidth: --config 'plan={gpu_memory_gib: 79.6, gpu_bf16_tflops: 989, gpu_hbm_tb_s: 3.35}'"
        ], []
    local = tuple(d for d in (Path(BASE.model.path), base_model_path()) if d.is_dir())
    shape, source = resolve_shape(BASE.model.path, local, p.get("model"))
    if shape is None:
        return [f"  no GPU budget or cost: {source}: set plan.model (config.json names: hidden_size, ...)"], [], []
    context = BASE.model.config_overrides.get("max_position_embeddings")
    if context:  # what the learner and vLLM will see
        shape, source = dataclasses.replace(shape, max_positions=int(context)), f"{source} + model.config_overrides"
    b = dtype_bytes(BASE.model.dtype)
    max_len = BASE.data.max_prompt_length + max(r.max_response_length, BASE.resolved_eval_max_tokens())
    from dapo.rollout.colocation import ENGINE_SLEEP_LEVEL  # the level the engine uses, not a setting
    batched, seqs = vllm_batching_defaults(tr.gpu_model, gpu.memory_gib)
    growth = p["response_tokens"]
    mem = P.MemoryInputs(
        shape=shape, dtype_bytes=b, world_size=tr.world_size, tensor_parallel=r.tensor_parallel_size,
        zero_stage=t.zero_stage, gpu_memory_gib=gpu.memory_gib, gpu_memory_utilization=r.gpu_memory_utilization,
        max_model_len=max_len, mean_seq_tokens=p["mean_prompt_tokens"] + growth["end"],
        micro_batch_tokens=t.micro_batch_tokens, logprob_chunk_tokens=t.logprob_chunk_size,
        gradient_checkpointing=BASE.model.gradient_checkpointing, sleep_mode=r.enable_sleep_mode,
        sleep_level=ENGINE_SLEEP_LEVEL, allowance_gib=p["allowance_gib"], vllm_batched_tokens=batched,
        vllm_max_seqs=seqs,
    )
    budget = P.memory_budget(mem)
    lines = [
        f"  per-GPU memory, colocated ({BASE.model.path}: {shape.params / 1e9:.2f}B parameters from {source}, "
        f"{b} B each; {tr.gpu_model} {gpu.memory_gib:g} GiB; {tr.world_size} GPUs, TP {r.tensor_parallel_size} "
        f"-> {tr.world_size // r.tensor_parallel_size} vLLM replicas; ZeRO-{t.zero_stage}; vLLM sleep level "
        f"{ENGINE_SLEEP_LEVEL} during updates):",
        P.render_memory(budget),
    ]
    refusals = P.plan_problems(budget)
    context = P.context_problem(shape.max_positions, max_len, BASE.model.path)
    refusals += [context] if context else []

    def cost_inputs(row, cfg):
        a, own = cfg.algorithm, {**growth, **(p.get("rows") or {}).get(row, {})}
        return C.CostInputs(
            shape=shape, dtype_bytes=b, world_size=tr.world_size, nodes=tr.nodes,
            tensor_parallel=r.tensor_parallel_size, gpu_bf16_tflops=gpu.bf16_tflops, gpu_hbm_tb_s=gpu.hbm_tb_s,
            kv_tokens_per_replica=budget.kv_tokens_per_replica, vllm_max_seqs=seqs,
            decode_efficiency=p["decode_efficiency"], decode_step_overhead_s=p["decode_step_overhead_ms"] / 1000,
            prompts_per_step=cfg.trainer.train_batch_size, n=cfg.rollout.n, mean_prompt_tokens=p["mean_prompt_tokens"],
            response_tokens_start=own["start"], response_tokens_end=own["end"],
            max_response_tokens=cfg.rollout.max_response_length, dynamic_sampling=a.dynamic_sampling,
            gen_batch_prompts=a.gen_batch_size or cfg.trainer.train_batch_size, max_gen_batches=a.max_num_gen_batches,
            informative_fraction=p["informative_fraction"], pack_prompts=cfg.trainer.pack_prompts,
            gradient_checkpointing=cfg.model.gradient_checkpointing, reference_forward=a.kl_coef > 0,
            total_steps=cfg.trainer.total_steps, eval_every=cfg.eval.every, eval_problems=p["eval_problems"],
            eval_n=cfg.eval.n, eval_max_tokens=cfg.resolved_eval_max_tokens(), train_mfu=p["train_mfu"],
            step_overhead_s=p["step_overhead_s"], checkpoint_every=cfg.trainer.checkpoint_every,
            keep_checkpoints=cfg.trainer.keep_checkpoints, checkpoint_gb_s_per_node=p["checkpoint_gb_s_per_node"],
        )

    rows = {row: cost_inputs(row, RUN_CFGS[(row, SEEDS[0])]) for row in ROWS}
    text, warnings = C.render_costs(
        rows, seeds=len(SEEDS), limit_h=tr.runtime_min / 60, max_resubmits=int(config.get(RESUBMITS_KEY, 5)),
        restart_h=p["restart_min"] / 60, concurrent_runs=train_concurrency(), stop_margin_s=t.stop_margin_s,
        resubmits_key=RESUBMITS_KEY,
    )
    lines += ["  cost per row (estimates; the arithmetic and the sources of the defaults: docs/cost.md):", text]
    return lines, refusals, warnings


def print_plan():
    """The plan in words: jobs, nodes, GPUs, hours; for a GPU preset the per-GPU memory budget (refused when it
    does not fit) and the expected cost per row (printed once, by the main process)."""
    tr = BASE.resources.train
    n = len(ROWS) * len(SEEDS)
    jobs = 1 + int(config.get(RESUBMITS_KEY, 5))  # a train job may run that often (it evaluates inside)
    gpu_h = n * jobs * tr.nodes * tr.gpus_per_node * tr.runtime_min / 60
    lines = [
        f"dapo ablation: preset {PRESET_NAME}, {len(ROWS)} rows x {len(SEEDS)} seeds = {n} runs "
        f"-> results in {RESULTS}, MLflow {TRACKING_URI} (experiment {EXPERIMENT})",
        f"  train job: {tr.nodes} node(s) x {tr.gpus_per_node} GPU(s) {tr.gpu_model or ''}, "
        f"{tr.runtime_min / 60:.1f} h limit, {BASE.trainer.total_steps} rollout steps, "
        f"{BASE.trainer.updates_per_step} updates/step",
        f"  evaluation: inside the train job, avg@{BASE.eval.n} every {BASE.eval.every} steps and at the end",
    ]
    refusals, warnings = [], []
    if tr.gpus_per_node:
        lines.append(
            f"  at most {gpu_h:,.0f} GPU-hours in all (SLURM time limits x GPUs, train jobs x (1 + {RESUBMITS_KEY}))"
        )
        more, refusals, warnings = _gpu_plan(plan_for_preset(config["plan"]))
        lines += more
    else:
        lines += _cpu_plan_lines()
    for row in ROWS:
        label = PAPER_TABLE1.get(row, (row, None))
        lines.append(f"  {row:<28} {label[0]:<28} paper AIME avg@32: {label[1]}")
    warnings += [f"not a clean ablation ({ALLOW_KEY}): {p}" for p in LADDER_PROBLEMS]
    lines += [f"WARNING: {w}" for w in warnings]
    print("\n".join(lines), file=sys.stderr)
    if refusals:
        preset_file = resolve_preset(PRESET)
        raise WorkflowError(
            f"{preset_file} (or --config overrides): the plan cannot run as configured (nothing was submitted; the "
            "per-GPU budget above); change the keys named:\n" + "\n".join(f"  - {x}" for x in refusals)
        )


if workflow.is_main_process:
    print_plan()


onstart:
    # Once, on the submitting machine, before any job: a second controller of this results folder, or a tracking
    # store the runs cannot use, stops everything here.
    from dapo.cluster import ControllerLockError, TrackingStoreError, acquire_controller_lock, check_tracking_store

    try:
        _note = acquire_controller_lock(RESULTS, sys.argv)
        if _note:
            print(f"note: {_note}", file=sys.stderr)
    except ControllerLockError as e:
        raise WorkflowError(f"nothing was submitted: {e}") from None
    try:
        for _warning in check_tracking_store(TRACKING_URI, cluster=workflow.non_local_exec):
            print(f"warning: {_warning}", file=sys.stderr)
    except TrackingStoreError as e:
        from dapo.cluster import release_controller_lock

        release_controller_lock(RESULTS)
        raise WorkflowError(f"nothing was submitted: {e}") from None


onsuccess:
    from dapo.cluster import release_controller_lock

    release_controller_lock(RESULTS)


onerror:
    from dapo.cluster import release_controller_lock

    release_controller_lock(RESULTS)
