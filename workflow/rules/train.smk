# Train and evaluate one ablation row x seed.


rule train:
    """One ablation row x seed. A job cut off by SLURM exits 75 ("resume me") and is resubmitted; the new job
    resumes from the run's last checkpoint into the same MLflow run. Any other failure is final (FAILED marker),
    so a broken run does not burn its resubmissions."""
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
        args=lambda wc: q(
            "--config", run_config(wc.row), "--preset", PRESET,
            "--run-dir", run_dir(wc.row, wc.seed), *run_overrides(wc.row, int(wc.seed)),
        ),
        launcher=launcher("train"),
    threads: BASE.resources.train.cpus_per_task
    priority: lambda wc: train_priority(wc.row, wc.seed)
    retries: config.get("max_resubmits", 5)
    resources:
        **slurm_resources("train"),
        attempt=lambda wc, attempt: attempt,
    shell:
        "bash workflow/scripts/train_job.sh {params.run_dir:q} {resources.attempt} {log:q} "
        "{params.launcher} dapo train {params.args}"


rule evaluate:
    """The final evaluation of a trained row (avg@k, pass@k, maj@k), logged into the row's MLflow run."""
    input:
        done=rules.train.output.done,
    output:
        metrics=RESULTS / "runs" / "{row}" / "s{seed}" / "eval" / "metrics.json",
    log:
        RESULTS / "logs" / "eval" / "{row}-s{seed}.log",
    params:
        args=lambda wc: q(
            "--config", run_config(wc.row), "--preset", PRESET,
            "--model", run_dir(wc.row, wc.seed) / "final", "--out", run_dir(wc.row, wc.seed) / "eval",
            *run_overrides(wc.row, int(wc.seed)),
        ),
    threads: BASE.resources.eval.cpus_per_task
    resources:
        **slurm_resources("eval"),
    shell:
        "OMP_NUM_THREADS={threads} dapo eval {params.args} "
        "--run-id $(python -c 'import json,sys; print(json.load(open(sys.argv[1]))[\"run_id\"])' {input.done:q}) "
        "> {log} 2>&1"


def row_outputs(row):
    return [RESULTS / "runs" / row / f"s{s}" / "eval" / "metrics.json" for s in SEEDS]


# One target per row: `snakemake --cores all row_02_clip_higher`
for _row in ROWS:

    rule:
        name:
            f"row_{_row}"
        input:
            row_outputs(_row),
        localrule: True
