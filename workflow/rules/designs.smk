# The leave-one-out, one-at-a-time and async designs, generated from the same ladder (dapo/designs.py): no copied files;
# `snakemake --cores all <target>` for each target below (its docstring says what it runs). A design run is trained
# (and evaluated, inside its job) by the same train rule as a ladder row (its config file and overrides come from
# the spec's runs (dapo/workflow_spec.py)); a design run that computes what a ladder row computes is that row, so
# it is trained once. Each target ends with a report in results/<preset>/report/<design>/.

DESIGN_RUNS = SPEC["designs"]  # design -> its run names (the spec resolved and validated every one's config)


def design_report(design):
    return [RESULTS / "report" / design / f"{t}.{ext}" for t in REPORT_TABLES for ext in ("md", "csv", "tex")]


rule design_report:
    """The report (Table 1, mechanisms, each toggle's marginal effect under each design present) once every run of
    one design has finished training (the trainer evaluates inside its job)."""
    input:
        lambda wc: [m for name in DESIGN_RUNS[wc.design] for m in row_outputs(name)],
    output:
        [RESULTS / "report" / "{design}" / f"{t}.{ext}" for t in REPORT_TABLES for ext in ("md", "csv", "tex")],
    log:
        RESULTS / "logs" / "report_{design}.log",
    wildcard_constraints:
        design="|".join(d for d in DESIGN_RUNS if d not in ("variants", "async")),  # their reports: rules of their own
    localrule: True
    params:
        args=lambda wc: [
            "--experiment", EXPERIMENT, "--tracking-uri", TRACKING_URI, "--out", RESULTS / "report" / wc.design
        ],
    shell:
        "dapo report {params.args:q} > {log:q} 2>&1"


rule all_leave_one_out:
    """Full DAPO and full DAPO without each toggle, every seed; then their report."""
    input:
        design_report("leave_one_out"),
    localrule: True


rule all_one_at_a_time:
    """Naive GRPO and naive GRPO with each toggle, every seed; then their report."""
    input:
        design_report("one_at_a_time"),
    localrule: True


rule all_designs:
    """The cumulative ladder and both other designs, every seed; then one report with every marginal effect."""
    input:
        design_report("designs"),
    localrule: True


rule all_evidence:
    """The cumulative ladder and the placebo row (the ladder's second-to-last row with another sampling seed), every
    seed; then their report, whose version-2 mechanisms table counts what changed between the placebo and its twin."""
    input:
        design_report("evidence"),
    localrule: True


VARIANTS_REPORT = [RESULTS / "report" / "variants" / f"{t}.{ext}" for t in ("variants", *REPORT_TABLES) for ext in ("md", "csv", "tex")]


rule variants_report:
    """The report of the variants design: report/variants/variants.md (each variant against the ladder row it
    inherits: final avg@k, the accuracy areas over updates and over tokens, entropy, tokens per step, each with its
    interval over seeds) and figures/variants.png, beside the usual tables."""
    input:
        lambda wc: [m for name in DESIGN_RUNS["variants"] for m in row_outputs(name)],
    output:
        VARIANTS_REPORT,
    log:
        RESULTS / "logs" / "report_variants.log",
    localrule: True
    params:
        args=["--experiment", EXPERIMENT, "--tracking-uri", TRACKING_URI, "--out", RESULTS / "report" / "variants"],
    shell:
        "dapo report {params.args:q} > {log:q} 2>&1"


rule all_variants:
    """Each variant of configs/variants/ (GSPO, CISPO, Clip-Cov, KL-Cov, Dr. GRPO, the rollout correction, SAPO, GMPO,
    DPPO-TV and -KL, the off-policy sequence mask) and the ladder row it inherits, every seed; then their report
    (rule variants_report)."""
    input:
        VARIANTS_REPORT,
    localrule: True


ASYNC_REPORT = [RESULTS / "report" / "async" / f"{t}.{ext}" for t in ("async", *REPORT_TABLES) for ext in ("md", "csv", "tex")]


rule async_report:
    """The report of the async design: report/async/async.md (each ladder row carried over to the next step against
    itself synchronous: final avg@k, the accuracy areas over updates and over tokens, entropy, tokens and generation
    seconds per step, each with its interval over seeds; whether the rows keep their order), beside the usual
    tables."""
    input:
        lambda wc: [m for name in DESIGN_RUNS["async"] for m in row_outputs(name)],
    output:
        ASYNC_REPORT,
    log:
        RESULTS / "logs" / "report_async.log",
    localrule: True
    params:
        args=["--experiment", EXPERIMENT, "--tracking-uri", TRACKING_URI, "--out", RESULTS / "report" / "async"],
    shell:
        "dapo report {params.args:q} > {log:q} 2>&1"


rule all_async:
    """Each ladder row beside itself with rollouts carried over to the next step (rollout.max_staleness: 1, the
    decoupled objective's token_tis weight; docs/staleness.md), every seed; then their report (rule async_report)."""
    input:
        ASYNC_REPORT,
    localrule: True


rule assay_clip_higher:
    """The clip-higher assay (preset tiny-assay-clip; docs/evidence.md, section 8): rows 01 and 02, every seed; then
    their report, whose assays table (assays.md) has the declared statistics."""
    input:
        design_report("assay_clip_higher"),
    localrule: True


rule assay_token_level_loss:
    """The token-level-loss assay (preset tiny-assay-token; docs/evidence.md, section 8): rows 03 and 04, and row 00
    with and without token-mean, every seed; then their report, whose assays table (assays.md) has the declared
    statistics."""
    input:
        design_report("assay_token_level_loss"),
    localrule: True


rule assay_overlong_filtering:
    """The overlong-filtering assay (preset tiny-assay-overlong; docs/evidence.md, section 8): rows 00 and 01, every
    seed; then their report, whose assays table (assays.md) has the declared statistics."""
    input:
        design_report("assay_overlong_filtering"),
    localrule: True
