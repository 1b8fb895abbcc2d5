"""Table 1, the compute table and the paper's figures, regenerated from an MLflow experiment.

    from dapo.report.pipeline import build_report
    build_report("dapo-ablation", "sqlite:///results/mlflow.db", "results/report", x_axis="updates")

or `dapo report --experiment dapo-ablation`, which executes the analysis notebooks (analysis/*.py) that call the
same functions. Modules: `load` (MLflow -> RunData), `table1`, `compute`, `figures`, `formats` (Markdown, CSV,
LaTeX), `pipeline` (the steps), `notebooks` (papermill), `synthetic` (a made-up experiment for tests and demos).
"""
