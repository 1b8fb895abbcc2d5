# The base model and the data every row shares.


if IS_TINY:

    rule tiny_world:
        """Build the tiny world from nothing: synthetic task, offline tokenizer, tiny Qwen2 base model."""
        output:
            TINY_DIR / "manifest.json",
        log:
            RESULTS / "logs" / "tiny_world.log",
        threads: SPEC["resources"]["prepare"]["cpus_per_task"]
        resources:
            **SPEC["resources"]["prepare"],
        # Only the tiny.* overrides, the ones that define the world (`is_built` compares them): Snakemake reruns a
        # rule whose command changed and deletes its output first, so any other override (trainer.*, rollout.*)
        # in this command would throw away a built world's manifest and fail the next build on the leftovers.
        shell:
            "OMP_NUM_THREADS={threads:q} dapo build-tiny "
            + q("--preset", PRESET, *SPEC["tiny_overrides"], f"tiny.dir={TINY_DIR}")
            + " > {log:q} 2>&1"

elif BASE_MODEL["source"] == "hub":

    rule base_model:
        """Resolve a hub model once and cache it under results/ (the only rule that downloads a model). A local rule:
        compute nodes often have no internet, the submitting machine does."""
        output:
            touch(BASE_MODEL["marker"]),
        log:
            RESULTS / "logs" / "base_model.log",
        localrule: True
        shell:
            "hf download " + q(BASE_MODEL["id"], "--local-dir", BASE_MODEL["path"]) + " > {log:q} 2>&1"


rule prepare_data:
    """Load, deduplicate and template the train and eval sets into JSONL that every run reads. A local rule: hub
    datasets download here, on the submitting machine, not on a compute node."""
    input:
        TINY_DIR / "manifest.json" if IS_TINY else [],
    output:
        train=RESULTS / "data" / "train.jsonl",
        eval=RESULTS / "data" / "eval.jsonl",
    log:
        RESULTS / "logs" / "prepare_data.log",
    localrule: True
    shell:
        "dapo prepare-data "
        + q("--preset", PRESET, "--out", RESULTS / "data", *OVERRIDES, f"tiny.dir={TINY_DIR}")
        + " > {log:q} 2>&1"


rule tracking_store:
    """Create the MLflow store and experiment once, before runs start side by side (two processes creating a fresh
    SQLite store's tables at the same moment make one of them fail), as the trainer creates them (its artifact
    location: beside an SQLite database)."""
    output:
        touch(RESULTS / "logs" / "tracking_store.done"),
    log:
        RESULTS / "logs" / "tracking_store.log",
    localrule: True
    shell:
        "dapo tracking-store "
        + q("--tracking-uri", TRACKING_URI, "--experiment", EXPERIMENT)
        + " > {log:q} 2>&1"
