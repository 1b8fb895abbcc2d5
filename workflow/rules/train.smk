# Train one ablation row x seed; the trainer evaluates it (every eval.every steps and at the end) inside the same
# job, and DONE.json carries the final metrics: there is no separate evaluation job.


rule train:
    """One ablation row x seed. A job stopped for resume (SLURM time limit, preemption: `dapo train` exits 75)
    requeues itself and resumes from the run's last checkpoint into the same MLflow run; any other failure is
    final (a FAILED file in the run folder). workflow/scripts/train_job.sh decides; Snakemake never retries it."""
    input:
        model=BASE_MODEL["marker"],
        train=rules.prepare_data.output.train,
        eval=rules.prepare_data.output.eval,
        store=rules.tracking_store.output,
    output:
        done=RESULTS / "runs" / "{row}" / "s{seed}" / "DONE.json",
    log:
        RESULTS / "logs" / "train" / "{row}-s{seed}.log",
    params:
        run_dir=lambda wc: run_of(wc.row, wc.seed)["run_dir"],
        args=lambda wc: run_of(wc.row, wc.seed)["train_args"],
        srun=lambda wc: run_of(wc.row, wc.seed)["srun"],
        local=SPEC["local_launcher"]["train"],
        max_resubmits=SPEC["max_resubmits"],
        resume_code=SPEC["resume_exit_code"],
        kernels=SPEC["kernel_env"],
    threads: SPEC["resources"]["train"]["cpus_per_task"]
    priority: lambda wc: run_of(wc.row, wc.seed)["priority"]
    resources:
        **SPEC["resources"]["train"],
    shell:
        # every field quoted (`:q`; a list: each word), so no value's spaces or shell characters can split or run
        "env {params.kernels:q} bash workflow/scripts/train_job.sh {params.run_dir:q} {log:q} {params.max_resubmits:q} "
        "{params.resume_code:q} {params.srun:q} {params.local:q} dapo train {params.args:q}"


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
            poll=SPEC["attach_poll_s"],
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
