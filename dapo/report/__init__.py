"""Table 1, the mechanisms table, the designs' marginal effects, the compute table and the paper's figures,
regenerated from an MLflow experiment.

    from dapo.report.pipeline import build_report
    build_report("dapo-ablation", "sqlite:///results/mlflow.db", "results/report", x_axis="updates")

or `dapo report --experiment dapo-ablation`, which executes the analysis notebooks (analysis/*.py) that call the
same functions; `dapo compare A B` puts two rows side by side. Modules: `load` (MLflow -> RunData, with each run's
final-eval samples), `table1`, `mechanisms` (the declared statistics), `marginal` (effects under each design),
`compute`, `figures`, `compare`, `formats` (Markdown, CSV, LaTeX), `pipeline` (the steps), `notebooks`
(papermill).
"""
