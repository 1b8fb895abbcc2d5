# Train one ablation row x seed; the trainer evaluates it (every eval.every steps and at the end) inside the same
# job, and DONE.json carries the final metrics: there is no separate evaluation job.


rule train:
    """One ablation row x seed. A job stopped for resume (SLURM time limit, preemption: `dapo train` exits 75)
    requeues itself and resumes from the run's last checkpoint into the same MLflow run; any other failure is
    final (a FAILED file in the run folder). workflow/scripts/train_job.sh decides; Snakemake never retries it."""
    input:
        model=base_model_marker(),
        train=rules.prepare_data.output.train,
        eval=rules.prepare_data.output.eval,
        store=rules.tracking_store.output,
    output:
        done=RESULTS / "runs" / "{row}" / "s{seed}" / "DONE.json",
    log:
        RESULTS / "logs" / "train" / "{row}-s{seed}.log",
    params:
        run_dir=lambda wc: run_dir(wc.row, wc.seed),
        args=lambda wc: [
            "--config", run_config(wc.row), "--preset", PRESET,
            "--run-dir", run_dir(wc.row, wc.seed), "--progress", "log", *run_overrides(wc.row, int(wc.seed)),
        ],
        srun=lambda wc: srun_args(wc.row, wc.seed),
        local=local_launcher("train"),
        max_resubmits=config.get("max_resubmits", 5),
        kernels=kernel_env(),
    threads: BASE.resources.train.cpus_per_task
    priority: lambda wc: train_priority(wc.row, wc.seed)
    resources:
        **slurm_resources("train"),
    shell:
        # every field quoted (`:q`; a list: each word), so no value's spaces or shell characters can split or run
        "env {params.kernels:q} bash workflow/scripts/train_job.sh {params.run_dir:q} {log:q} {params.max_resubmits:q} "
        "{params.srun:q} {params.local:q} dapo train {params.args:q}"


refuse_batch_signal(rules.train.rule.resources.get("slurm_extra"))


if LIVE_TRAIN_JOBS:
    import re as _re

    ruleorder: attach_train > train

    rule attach_train:
        """A run an earlier controller left queued or running as a SLURM job (dapo.cluster.live_train_jobs): wait
        for that job on this machine, instead of submitting the run a second time. Its own job script resubmits it
        as usual; when the job ends, the run is done (DONE.json) or this rule fails with what the run left."""
        output:
            done=RESULTS / "runs" / "{run}" / "DONE.json",
        log:
            RESULTS / "logs" / "attach" / "{run}.log",
        wildcard_constraints:
            run="|".join(_re.escape(f"{name}/s{seed}") for name, seed in LIVE_TRAIN_JOBS),
        params:
            job=lambda wc: LIVE_TRAIN_JOBS[(wc.run.split("/s")[0], int(wc.run.rsplit("/s", 1)[1]))][0],
            run_dir=lambda wc: RESULTS / "runs" / wc.run,
            poll=config.get("attach_poll_s", 60),
        localrule: True
        shell:
            "bash workflow/scripts/wait_job.sh {params.job:q} {params.run_dir:q} {params.poll:q} > {log:q} 2>&1"


def row_outputs(row):
    return [RESULTS / "runs" / row / f"s{s}" / "DONE.json" for s in SEEDS]


# One target per row: `snakemake --cores all row_02_clip_higher`
for _row in ROWS:

    rule:
        name:
            f"row_{_row}"
        input:
            row_outputs(_row),
        localrule: True
