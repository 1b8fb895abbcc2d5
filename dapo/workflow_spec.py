"""What the Snakemake workflow runs, decided in Python: `build_spec` turns the workflow's config into one plain,
JSON-ready spec that the rules only read, with the dry run's plan in words (docs/architecture.md, "The workflow").
A bad run config raises `WorkflowSpecError`; a GPU plan that does not fit is the spec's `refusal`, not an error."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from dapo.cluster import batch_signal_problem, live_train_jobs
from dapo.config import ABLATIONS_DIR, REPO_ROOT, ConfigError, RunConfig, load_config, resolve_preset
from dapo.designs import (
    ALLOW_FLAG,
    ALLOW_KEY,
    RunSpec,
    all_design_runs,
    assay_pairs,
    async_runs,
    check_ladder,
    design_runs,
    ladder,
    placebo_run,
    variant_runs,
)
from dapo.tracking import resolve_uri

SCHEMA = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"
WORKFLOW_CONFIG = REPO_ROOT / "configs" / "workflow.yaml"
RESUBMITS_KEY = "max_resubmits"  # configs/workflow.yaml: resubmissions of a job cut off by SLURM (exit 75)
JOB_KINDS = ("prepare", "train")  # the job kinds with SLURM resources of their own (resources.<kind> in a preset)
# What every run of one workflow shares (one train rule, one base model): a run differing in one is refused.
SHARED_KEYS = ("resources", "trainer.stop_margin_s", "model.path", "tiny.dir", "tiny.kernels")


class WorkflowSpecError(ConfigError):
    """The workflow's config cannot run: the message names the file, the key and the fix (nothing was submitted)."""


# ----------------------------------------------------------------------------------------------- config
def schema() -> dict[str, Any]:
    import yaml

    return yaml.safe_load(SCHEMA.read_text())


def with_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with the schema's defaults for the top-level keys it does not set (as Snakemake's `validate`)."""
    defaults = {key: prop["default"] for key, prop in schema()["properties"].items() if "default" in prop}
    return {**config, **{key: value for key, value in defaults.items() if key not in config}}


def validate(config: dict[str, Any], where: str = "configs/workflow.yaml (or --config)") -> None:
    """Raise WorkflowSpecError for a config the schema refuses (Snakemake checks the same schema itself)."""
    import jsonschema

    errors = sorted(jsonschema.Draft202012Validator(schema()).iter_errors(config), key=lambda e: list(e.path))
    if errors:
        lines = [f"  {'.'.join(map(str, e.path)) or '(top level)'}: {e.message}" for e in errors]
        raise WorkflowSpecError(f"{where}: not a valid workflow config ({SCHEMA.name}):\n" + "\n".join(lines))


def plan_for_preset(plan: dict[str, Any], name: str) -> dict[str, Any]:
    """configs/workflow.yaml's `plan:` with its `presets.<name>` on top (each key there replaces the whole key)."""
    own = (plan.get("presets") or {}).get(name) or {}
    return {**{k: v for k, v in plan.items() if k != "presets"}, **own}


def train_concurrency(runs: int, train_nodes: int, jobs: int | None, train_nodes_limit: float | None) -> int:
    """Training jobs that may run or queue at once: by Snakemake's --jobs and `--resources train_nodes=N` / nodes a
    job takes; every run when neither limits."""
    by_nodes = int(train_nodes_limit) // train_nodes if train_nodes_limit is not None else runs
    return max(1, min(runs, jobs or runs, by_nodes))


# ------------------------------------------------------------------------------------------ per job kind
def slurm_resources(cfg: RunConfig, kind: str) -> dict[str, Any]:
    """SLURM resources of one job kind from the preset (snakemake-executor-plugin-slurm's names). Per node: memory,
    GPUs (`--gres=gpu[:<model>]:<per node>`), tasks; `srun_args` repeats the layout for the training step."""
    r = getattr(cfg.resources, kind)
    res: dict[str, Any] = dict(nodes=r.nodes, mem_mb=r.mem_mb, runtime=r.runtime_min, cpus_per_task=r.cpus_per_task)
    if r.gpus_per_node:
        gres_type = r.gres_type or r.gpu_model  # the cluster's GRES name; the GPU table's name when not given
        res["gres"] = f"gpu:{gres_type}:{r.gpus_per_node}" if gres_type else f"gpu:{r.gpus_per_node}"
        res["tasks_per_gpu"] = 0  # the plugin would add --ntasks-per-gpu otherwise; tasks per node say it all
    if kind == "train":
        # With an `mpi` resource the jobstep executor runs the rule in the batch step (not a one-task `srun -n1`),
        # which starts the ranks itself (srun_args); non-empty asks for the tasks, "" keeps the plugin's --ntasks=1.
        if r.ranks_per_node > 1:
            res.update(mpi="srun", tasks_per_node=r.ranks_per_node)
        elif r.world_size > 1:
            res.update(mpi="srun", tasks=r.world_size)  # one rank on each of several nodes
        else:
            res["mpi"] = ""
        # The preemption signal goes to every rank (never `B:`: only the batch shell, whose death ends the job). A
        # requeued job appends to its SLURM log.
        res["slurm_extra"] = f"--signal=USR1@{int(cfg.trainer.stop_margin_s)} --open-mode=append"
        # Nodes it holds, for `--resources train_nodes=32` throttling (docs/cluster.md); else `jobs:` is the cap.
        res["train_nodes"] = r.nodes
    return res


def srun_args(cfg: RunConfig, name: str, seed: int) -> str:
    """The training step's layout, spelled out: inside the job the SLURM_* task variables are gone."""
    r = cfg.resources.train
    gpus = f"--gpus-per-node={r.gpus_per_node} " if r.gpus_per_node else ""
    return (
        f"--nodes={r.nodes} --ntasks={r.world_size} --ntasks-per-node={r.ranks_per_node} {gpus}"
        f"--cpus-per-task={r.cpus_per_task} --kill-on-bad-exit=1 --job-name=dapo-{name}-s{seed}"
    )


def local_launcher(cfg: RunConfig, kind: str) -> str:
    """How a job starts its ranks outside SLURM: `env` (never an empty word: Snakemake drops it) for one process or a
    multi-node layout (`dapo train` refuses it), else torchrun on this machine."""
    r = getattr(cfg.resources, kind)
    if r.world_size == 1 or r.nodes > 1:
        return "env"
    # --no-python: run `dapo` from PATH; torchrun would otherwise run it with python, as the path `dapo`, which from
    # the repository root (where the workflow runs) is the package's folder ("can't find '__main__' module")
    return f"torchrun --standalone --nproc-per-node={r.ranks_per_node} --no-python"


def kernel_env(cfg: RunConfig) -> list[str]:
    """`env` assignments of a train job: the tiny preset's pinned CPU kernels (its world's); none for GPU presets."""
    if cfg.model.path != "tiny":
        return []
    from dapo.tinyworld import pinned_kernels

    return [f"{k}={v}" for k, v in pinned_kernels(cfg.tiny.kernels).items()]


def shared_values(cfg: RunConfig) -> dict[str, Any]:
    """The SHARED_KEYS of one resolved run config, as dotted key -> value."""
    flat = cfg.flat()
    return {k: v for key in SHARED_KEYS for k, v in flat.items() if k == key or k.startswith(f"{key}.")}


def check_shared(cfgs: dict[tuple[str, int], RunConfig]) -> None:
    """Refuse (naming run, key and both values) a run whose SHARED_KEYS differ from the first run's."""
    (first_key, first), *rest = cfgs.items()
    want = shared_values(first)
    for (name, seed), cfg in rest:
        for key, value in shared_values(cfg).items():
            if value != want.get(key):
                raise WorkflowSpecError(
                    f"nothing was submitted: run {name} (seed {seed}) resolves {key} = {value!r}, but "
                    f"{first_key[0]} (seed {first_key[1]}) has {want.get(key)!r}: every run of one workflow shares "
                    "the SLURM resources, the preemption margin and the base model of its first row; set "
                    f"{key} in the preset or in --config overrides (every row alike), not in one row"
                )


# -------------------------------------------------------------------------------------------- the spec
def build_spec(
    config: dict[str, Any],
    *,
    jobs: int | None = None,
    train_nodes_limit: float | None = None,
    train_slurm_extra: str | None = None,
    with_plan: bool = True,
    live_jobs: bool = False,
) -> dict[str, Any]:
    """The workflow's spec from its (validated, defaulted) config; the arguments are `dapo plan`'s options of the
    same names (dapo/commands/plan.py)."""
    from dapo.trainer import RESUME_EXIT_CODE

    preset = str(config["preset"])
    name = Path(preset).stem if preset.endswith((".yaml", ".yml")) else preset  # a preset file's: its stem
    results = Path(config["results"]).resolve() / name
    seeds = [int(s) for s in config["seeds"]]
    overrides = [str(o) for o in config.get("overrides") or []]
    chosen, problems, designs, cfgs = _resolve_runs(config, preset, seeds, overrides)
    base = next(iter(cfgs.values()))  # the first chosen row's: what every run shares (check_shared)
    if why := batch_signal_problem(train_slurm_extra, base.trainer.stop_margin_s):
        raise WorkflowSpecError(f"nothing was submitted: {why}")
    tracking_uri = resolve_uri(config.get("tracking_uri"), results)
    experiment = config.get("experiment") or f"dapo-{name}"
    # the config's own tiny.dir (default results/tiny_world, where the tests cache it too): built once for both
    tiny_dir = Path(config.get("tiny_world") or base.tiny.dir).resolve()
    if config.get("tiny_world") and base.model.path == "tiny":
        _check_reused_world(tiny_dir, base)
    base_model = _base_model(base, results, tiny_dir)
    data = results / "data"
    # what every train call gets after its run's file, its design's overrides, the workflow's and its seed
    shared = [
        f"model.path={base_model['path']}",
        f"tiny.dir={tiny_dir}",
        f"data.train={data / 'train.jsonl'}",
        f"data.eval={data / 'eval.jsonl'}",
        f"tracking.uri={tracking_uri}",
        f"tracking.experiment={experiment}",
        f"tracking.preset={name}",
    ]
    runs: dict[str, dict[str, Any]] = {}
    for (run, seed), cfg in cfgs.items():
        run_dir, file = results / "runs" / run / f"s{seed}", str(designs[run].config)
        train_args = ["--config", file, "--preset", preset, "--run-dir", str(run_dir), "--progress", "log"]
        train_args += [ALLOW_FLAG] if config.get(ALLOW_KEY) else []  # `dapo train` checks its ladder too
        runs.setdefault(run, {"config": file, "seeds": {}})["seeds"][str(seed)] = {
            "run_dir": str(run_dir),
            "train_args": [*train_args, *designs[run].overrides, *overrides, f"trainer.seed={seed}", *shared],
            "srun": srun_args(base, run, seed),
            # Dynamic sampling's runs (up to max_num_gen_batches per step) first: longest job first keeps both cores
            # busy to the end of a local run (BENCHMARKS.md, 5).
            "priority": 1 if cfg.algorithm.dynamic_sampling else 0,
        }
    by_design = {d: [r.name for r in design_runs(d)] for d in ("leave_one_out", "one_at_a_time")}
    by_design["designs"] = sorted(set(chosen).union(*by_design.values()))
    # the cumulative ladder and the placebo (the row dynamic sampling builds on, another sampling seed only)
    by_design["evidence"] = sorted(set(chosen) | {placebo_run().name})
    # each variant of configs/variants/ beside the ladder row it inherits (dapo.designs.variant_runs)
    by_design["variants"] = [r.name for r in variant_runs()]
    # each chosen row beside itself with rollouts carried over (dapo.designs.async_runs)
    by_design["async"] = [*chosen, *(r.name for r in async_runs() if r.toggle in chosen)]
    # the clip-higher assay's ladder pair (dapo.report.assays): no response reaches its cap, so the one-at-a-time pair
    # would train the same runs again
    by_design["assay_clip_higher"] = sorted(assay_pairs("clip_higher")[0])
    # the token-level-loss assay's two pairs: rows 03/04, and 00 against 00 with token-mean
    by_design["assay_token_level_loss"] = sorted({run for pair in assay_pairs("token_level_loss") for run in pair})
    # the overlong-filtering assay's ladder pair: row 01 is row 00 with the filter, its one-at-a-time pair too
    by_design["assay_overlong_filtering"] = sorted(assay_pairs("overlong_filtering")[0])
    spec: dict[str, Any] = {
        "preset": preset,
        "preset_name": name,
        "results": str(results),
        "rows": chosen,
        "seeds": seeds,
        "overrides": overrides,
        "tiny_overrides": [o for o in overrides if o.startswith("tiny.")],
        "tracking_uri": tracking_uri,
        "experiment": experiment,
        "tiny_dir": str(tiny_dir),
        "base_model": base_model,
        "resume_exit_code": RESUME_EXIT_CODE,
        "max_resubmits": int(config[RESUBMITS_KEY]),
        "attach_poll_s": config["attach_poll_s"],
        "resources": {kind: slurm_resources(base, kind) for kind in JOB_KINDS},
        "local_launcher": {kind: local_launcher(base, kind) for kind in JOB_KINDS},
        "kernel_env": kernel_env(base),
        "runs": runs,
        "designs": by_design,
        "ladder_problems": problems,
        "live_train_jobs": [],
        "plan_text": None,
        "refusal": None,
    }
    if live_jobs:
        spec["live_train_jobs"] = [
            {"run": run, "seed": seed, "job": job, "state": state}
            for (run, seed), (job, state) in sorted(live_train_jobs(results).items())
        ]
    if with_plan:
        spec["plan_text"], spec["refusal"] = plan(spec, cfgs, config, jobs, train_nodes_limit)
    return spec


def _resolve_runs(
    config: dict[str, Any], preset: str, seeds: list[int], overrides: list[str]
) -> tuple[list[str], list[str], dict[str, RunSpec], dict[tuple[str, int], RunConfig]]:
    """(chosen rows, the ladder's problems, every design run by name, every (run, seed)'s validated config: the chosen
    rows first, the first being the workflow's base)."""
    all_rows = ladder()  # `rows: all`; the paper's labels (metric_names.PAPER_TABLE1) name the same list
    chosen = all_rows if config["rows"] == "all" else [str(r) for r in config["rows"]]
    unknown = [r for r in chosen if r not in all_rows]
    if unknown:
        raise WorkflowSpecError(
            f"configs/workflow.yaml (or --config rows=...): unknown row(s) {unknown}; rows are {all_rows}"
        )
    # The ladder must be a clean ablation before anything runs, unless allow_confounded_ladder (dapo/designs.py).
    try:
        problems = check_ladder(ABLATIONS_DIR, preset, overrides, allow=bool(config.get(ALLOW_KEY)))
        designs = all_design_runs()
    except (ConfigError, ValueError) as e:
        raise WorkflowSpecError(f"nothing was submitted: {e}") from None

    def resolve(run: str, seed: int) -> RunConfig:
        spec = designs[run]
        try:
            return load_config(
                spec.config, preset=preset, overrides=[*spec.overrides, *overrides, f"trainer.seed={seed}"]
            )
        except ConfigError as e:
            raise WorkflowSpecError(f"row {run}, seed {seed}: {e}") from None

    cfgs = {(row, seed): resolve(row, seed) for row in chosen for seed in seeds}
    cfgs.update({(run, seed): resolve(run, seed) for run in designs for seed in seeds if (run, seed) not in cfgs})
    check_shared(cfgs)
    return chosen, problems, designs, cfgs


def _check_reused_world(tiny_dir: Path, base: RunConfig) -> None:
    """A `tiny_world` must be the runs' `tiny.*` world, else its build would rebuild it in place over the one meant."""
    from dapo.tinyworld.build import world_mismatch

    why = world_mismatch(tiny_dir, base.tiny)
    if why:
        raise WorkflowSpecError(
            f"tiny_world={tiny_dir} (configs/workflow.yaml or --config) was {why}; reusing it would rebuild it in "
            "place. Nothing was submitted. Pass the settings it was built with as overrides (--config "
            "'overrides=[\"tiny.seed=...\"]'), or leave tiny_world unset to build this config's world at its tiny.dir."
        )


def _base_model(base: RunConfig, results: Path, tiny_dir: Path) -> dict[str, str]:
    """The model every row starts from and its marker file: the tiny world's, a hub model's (results/models/) or a
    local directory."""
    model = base.model.path
    if model == "tiny":
        source, path, marker = "tiny", tiny_dir / "model", tiny_dir / "manifest.json"
    elif Path(model).exists():
        source, path, marker = "local", model, Path(model) / "config.json"
    else:
        path = results / "models" / model.replace("/", "--")
        source, marker = "hub", path / ".complete"
    return {"source": source, "id": model, "path": str(path), "marker": str(marker)}


# --------------------------------------------------------------------------------------------- the plan
def plan(
    spec: dict[str, Any],
    cfgs: dict[tuple[str, int], RunConfig],
    config: dict[str, Any],
    jobs: int | None,
    train_nodes_limit: float | None,
) -> tuple[str, str | None]:
    """(the plan in words: jobs, nodes, GPUs, hours, and for a GPU preset the per-GPU memory and cost per row; the
    refusal that stops a plan that cannot run, or None)."""
    from dapo.metric_names import PAPER_TABLE1

    base, chosen, seeds = next(iter(cfgs.values())), spec["rows"], spec["seeds"]
    tr = base.resources.train
    n = len(chosen) * len(seeds)
    jobs_per_run = 1 + spec["max_resubmits"]  # a train job may run that often (it evaluates inside)
    gpu_h = n * jobs_per_run * tr.nodes * tr.gpus_per_node * tr.runtime_min / 60
    lines = [
        f"dapo ablation: preset {spec['preset_name']}, {len(chosen)} rows x {len(seeds)} seeds = {n} runs "
        f"-> results in {spec['results']}, MLflow {spec['tracking_uri']} (experiment {spec['experiment']})",
        f"  train job: {tr.nodes} node(s) x {tr.ranks_per_node} rank(s) per node ("
        + (f"{tr.gpus_per_node} GPU(s) {tr.gpu_model or ''}".rstrip() if tr.gpus_per_node else "CPU")
        + f" per node), {tr.world_size // base.rollout.tensor_parallel_size} rollout replica(s) of tensor parallel "
        f"{base.rollout.tensor_parallel_size}, {tr.runtime_min / 60:.1f} h limit, {base.trainer.total_steps} rollout "
        f"steps, {base.trainer.updates_per_step} updates/step",
        f"  evaluation: inside the train job, avg@{base.eval.n} every {base.eval.every} steps and at the end",
    ]
    refusals: list[str] = []
    warnings: list[str] = []
    if tr.gpus_per_node:
        lines.append(
            f"  at most {gpu_h:,.0f} GPU-hours in all (SLURM time limits x GPUs, train jobs x (1 + {RESUBMITS_KEY}))"
        )
        concurrent = train_concurrency(n, tr.nodes, jobs, train_nodes_limit)
        p = plan_for_preset(config.get("plan") or {}, spec["preset_name"])
        more, refusals, warnings = _gpu_plan(spec, cfgs, p, concurrent)
        lines += more
    else:
        lines += _cpu_plan_lines(base, cfgs, chosen)
    for row in chosen:
        label = PAPER_TABLE1.get(row, (row, None))
        lines.append(f"  {row:<28} {label[0]:<28} paper AIME avg@32: {label[1]}")
    warnings += [f"not a clean ablation ({ALLOW_KEY}): {p}" for p in spec["ladder_problems"]]
    lines += [f"WARNING: {w}" for w in warnings]
    refusal = None
    if refusals:
        refusal = (
            f"{resolve_preset(spec['preset'])} (or --config overrides): the plan cannot run as configured (nothing was "
            "submitted; the per-GPU budget above); change the keys named:\n" + "\n".join(f"  - {x}" for x in refusals)
        )
    return "\n".join(lines), refusal


def _cpu_plan_lines(base: RunConfig, cfgs: dict[tuple[str, int], RunConfig], chosen: list[str]) -> list[str]:
    """The tiny (CPU) preset: what a step samples; no GPU budget, nothing to refuse."""
    r, a, t = base.rollout, base.algorithm, base.trainer
    ds = [row for (row, _), c in cfgs.items() if row in chosen and c.algorithm.dynamic_sampling]
    line = (
        f"  CPU only (no GPU budget): per rollout step {t.train_batch_size} prompts x {r.n} responses of up to "
        f"{r.max_response_length} tokens, {t.total_steps} steps, eval every {base.eval.every}"
    )
    if ds:
        line += (
            f"; dynamic sampling ({', '.join(sorted(set(ds)))}) draws up to {a.max_num_gen_batches} batches of "
            f"{a.gen_batch_size or t.train_batch_size} prompts"
        )
    return [line]


def gpu_memory_budget(base: RunConfig, p: dict[str, Any], shape: Any, gpu_memory_gib: float) -> Any:
    """`dapo.plan.memory_budget` of a run config on a `gpu_memory_gib` GPU (scripts/gpu_check.py measures against it);
    `p`: the preset's plan assumptions."""
    from dapo import plan as P
    from dapo.rollout.colocation import ENGINE_SLEEP_LEVEL  # the level the engine uses, not a setting
    from dapo.shapes import dtype_bytes, vllm_batching_defaults

    tr, r, t = base.resources.train, base.rollout, base.trainer
    max_len = base.data.max_prompt_length + max(r.max_response_length, base.resolved_eval_max_tokens())
    batched, seqs = vllm_batching_defaults(tr.gpu_model, gpu_memory_gib)
    return P.memory_budget(P.MemoryInputs(
        shape=shape, dtype_bytes=dtype_bytes(base.model.dtype), world_size=tr.world_size,
        tensor_parallel=r.tensor_parallel_size, zero_stage=t.zero_stage, gpu_memory_gib=gpu_memory_gib,
        gpu_memory_utilization=r.gpu_memory_utilization, max_model_len=max_len,
        mean_seq_tokens=p["mean_prompt_tokens"] + p["response_tokens"]["end"],
        micro_batch_tokens=t.micro_batch_tokens, logprob_chunk_tokens=t.logprob_chunk_size,
        gradient_checkpointing=base.model.gradient_checkpointing, sleep_mode=r.enable_sleep_mode,
        sleep_level=ENGINE_SLEEP_LEVEL, allowance_gib=p["allowance_gib"], vllm_batched_tokens=batched,
        vllm_max_seqs=seqs, gpus_per_node=max(1, tr.gpus_per_node), host_memory_gib=tr.mem_mb / 1024,
    ))  # fmt: skip


def _zero_stage_lines(base: RunConfig, p: dict[str, Any], m: Any) -> tuple[list[str], list[str]]:
    """Which ZeRO stage fits with the least traffic at the last step's lengths (`dapo.plan.zero_stage_options`),
    and a warning when the run's own is another."""
    from dapo import plan as P

    t, r = base.trainer, base.rollout
    seq = p["mean_prompt_tokens"] + p["response_tokens"]["end"]
    ranks = m.world_size
    micro = max(1, math.ceil(t.mini_batch_size * r.n * seq / ranks / t.micro_batch_tokens))
    forward = max(1, math.ceil(t.train_batch_size * r.n * seq / ranks / t.resolved_forward_micro_batch_tokens()))
    options = P.zero_stage_options(m, t.updates_per_step, micro, forward)
    best = P.best_zero_stage(options)
    lines = [
        f"  ZeRO stage: each GPU's traffic per rollout step ({t.updates_per_step} updates of about {micro} "
        f"micro-batch(es) a rank, {forward} no-grad one(s), at the last step's {seq:,.0f}-token sequences; "
        'docs/distributed.md, "ZeRO\'s collectives"):',
        P.render_zero_choice(options, t.zero_stage),
    ]
    warn = []
    if best is not None and best.stage != t.zero_stage:
        mine = next(o for o in options if o.stage == t.zero_stage)
        warn.append(
            f"trainer.zero_stage is {t.zero_stage} ({mine.gb_per_step:,.0f} GB a GPU per step); ZeRO-{best.stage} "
            f"fits and moves {best.gb_per_step:,.0f} GB: set trainer.zero_stage: {best.stage}"
        )
    return lines, warn


def _gpu_plan(
    spec: dict[str, Any], cfgs: dict[tuple[str, int], RunConfig], p: dict[str, Any], concurrent: int
) -> tuple[list[str], list[str], list[str]]:
    """A GPU preset's per-GPU memory budget and cost per row: (text lines, refusals, warnings)."""
    from dapo import cost as C
    from dapo import plan as P
    from dapo.decode import Replica
    from dapo.shapes import GPUS, PlanError, gpu_spec, resolve_shape
    from dapo.trainer import OVERFILL

    base, seeds = next(iter(cfgs.values())), spec["seeds"]
    tr, r, t = base.resources.train, base.rollout, base.trainer
    given = {"memory_gib": p["gpu_memory_gib"], "bf16_tflops": p["gpu_bf16_tflops"], "hbm_tb_s": p["gpu_hbm_tb_s"]}
    gpu = gpu_spec(tr.gpu_model, given)
    if gpu is None:
        # No budget means no check that the run fits: refuse rather than submit 128 GPUs blind.
        unknown = (
            f"resources.train.gpu_model {tr.gpu_model!r} is not in the GPU table ({', '.join(GPUS)}): name the GPU "
            "there (the cluster's own GRES name goes in resources.train.gres_type), or give its memory, bf16 peak "
            "and bandwidth: --config 'plan={gpu_memory_gib: 79.6, gpu_bf16_tflops: 989, gpu_hbm_tb_s: 3.35}'"
        )
        return [], [unknown], []
    local = tuple(d for d in (Path(base.model.path), Path(spec["base_model"]["path"])) if d.is_dir())
    try:
        shape, source = resolve_shape(base.model.path, local, p.get("model"))
    except PlanError as e:
        raise WorkflowSpecError(f"configs/workflow.yaml (or --config plan=...): {e}") from None
    if shape is None:
        return [f"  no GPU budget or cost: {source}: set plan.model (config.json names: hidden_size, ...)"], [], []
    context = base.model.config_overrides.get("max_position_embeddings")
    if context:  # what the learner and vLLM will see
        shape, source = dataclasses.replace(shape, max_positions=int(context)), f"{source} + model.config_overrides"
    budget = gpu_memory_budget(base, p, shape, gpu.memory_gib)
    m = budget.inputs
    b, seqs = m.dtype_bytes, m.vllm_max_seqs
    lines = [
        f"  per-GPU memory, colocated ({base.model.path}: {shape.params / 1e9:.2f}B parameters from {source}, "
        f"{b} B each; {tr.gpu_model} {gpu.memory_gib:g} GiB; {tr.world_size} GPUs, TP {r.tensor_parallel_size} "
        f"-> {tr.world_size // r.tensor_parallel_size} vLLM replicas; ZeRO-{t.zero_stage}; vLLM sleep level "
        f"{m.sleep_level} during updates):",
        P.render_memory(budget),
    ]
    refusals = P.plan_problems(budget)
    too_long = P.context_problem(shape.max_positions, m.max_model_len, base.model.path)
    refusals += [too_long] if too_long else []
    stage_lines, stage_warning = _zero_stage_lines(base, p, m)
    lines += stage_lines

    def cost_inputs(row: str, cfg: RunConfig) -> Any:
        a, own = cfg.algorithm, {**p["response_tokens"], **(p.get("rows") or {}).get(row, {})}
        return C.CostInputs(
            replica=Replica(
                shape=shape, dtype_bytes=b, tensor_parallel=r.tensor_parallel_size, hbm_tb_s=gpu.hbm_tb_s,
                bf16_tflops=gpu.bf16_tflops, efficiency=p["decode_efficiency"], kv_tokens=budget.kv_tokens_per_replica,
                step_overhead_s=p["decode_step_overhead_ms"] / 1000, max_seqs=seqs,
            ), world_size=tr.world_size, nodes=tr.nodes,
            prompts_per_step=cfg.trainer.train_batch_size, n=cfg.rollout.n, mean_prompt_tokens=p["mean_prompt_tokens"],
            response_tokens_start=own["start"], response_tokens_end=own["end"],
            max_response_tokens=cfg.rollout.max_response_length, dynamic_sampling=a.dynamic_sampling,
            gen_batch_prompts=a.gen_batch_size or cfg.trainer.train_batch_size, max_gen_batches=a.max_num_gen_batches,
            informative_fraction=p["informative_fraction"], packing=cfg.trainer.packing,
            micro_batch_tokens=cfg.trainer.micro_batch_tokens, mini_batch_prompts=cfg.trainer.mini_batch_size,
            forward_micro_batch_tokens=cfg.trainer.resolved_forward_micro_batch_tokens(),
            gradient_checkpointing=cfg.model.gradient_checkpointing, reference_forward=a.kl_coef > 0,
            covariance_forward=a.policy_loss in ("clip_cov", "kl_cov"),
            total_steps=cfg.trainer.total_steps, eval_every=cfg.eval.every, eval_problems=p["eval_problems"],
            eval_n=cfg.eval.n, eval_max_tokens=cfg.resolved_eval_max_tokens(), train_mfu=p["train_mfu"],
            step_overhead_s=p["step_overhead_s"], checkpoint_every=cfg.trainer.checkpoint_every,
            keep_checkpoints=cfg.trainer.keep_checkpoints, checkpoint_gb_s_per_node=p["checkpoint_gb_s_per_node"],
            max_staleness=cfg.rollout.max_staleness,
            overfill_groups=math.ceil(OVERFILL * cfg.trainer.train_batch_size),
        )  # fmt: skip

    def costs(runs: list[str], stop_margin_s: float | None = None, carry_over: bool = True) -> tuple[str, list[str]]:
        return C.render_costs(
            {run: cost_inputs(run, cfgs[(run, seeds[0])]) for run in runs}, seeds=len(seeds),
            limit_h=tr.runtime_min / 60, max_resubmits=spec["max_resubmits"], restart_h=p["restart_min"] / 60,
            concurrent_runs=concurrent, stop_margin_s=stop_margin_s, carry_over=carry_over,
        )  # fmt: skip

    text, warnings = costs(spec["rows"], stop_margin_s=t.stop_margin_s)
    warnings += stage_warning
    lines += ["  cost per row (estimates; the arithmetic and the sources of the defaults: docs/cost.md):", text]
    variants = [r for r in spec["designs"].get("variants", []) if r not in spec["rows"] and (r, seeds[0]) in cfgs]
    if variants:
        vtext, _ = costs(variants, carry_over=False)
        lines += [
            "  variants (`all_variants`, each beside its parent row above): GSPO, CISPO, Dr. GRPO and the rollout "
            "correction change nothing of the plan (the same tokens, passes and memory as their parent); Clip-Cov and "
            "KL-Cov add one no-grad forward pass per update (their covariance selection):",
            vtext,
        ]
    return lines, refusals, warnings
