# Table 1 and the paper's figures, by executing the analysis notebooks over the MLflow experiment.

REPORT_DIR = RESULTS / "report"
REPORT_TABLES = ("table1", "mechanisms", "marginal_effects")
REPORT_OUTPUTS = [REPORT_DIR / f"{t}.{ext}" for t in REPORT_TABLES for ext in ("md", "csv", "tex")]


rule report:
    """Read the experiment from MLflow and write Table 1, the mechanisms and the marginal effects (Markdown, CSV,
    LaTeX) and the figures (PNG, PDF)."""
    input:
        [m for row in ROWS for m in row_outputs(row)],
    output:
        REPORT_OUTPUTS,
    log:
        RESULTS / "logs" / "report.log",
    localrule: True
    shell:
        # first deliver MLflow records the runs could not (the server was down at their end), and list every run's
        # jobs, attempts and state beside the tables (status.md says when records are still missing)
        "dapo status "
        + q(RESULTS / "runs", "--replay", "--out", REPORT_DIR / "status.md")
        + " > {log:q} 2>&1 && dapo report "
        + q("--experiment", EXPERIMENT, "--tracking-uri", TRACKING_URI, "--out", REPORT_DIR)
        + " >> {log:q} 2>&1"
