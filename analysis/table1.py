# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (dapo)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Table 1, the mechanisms, the marginal effects and the compute table, from an MLflow experiment
#
# Reads one run per (ablation row, seed) through MLflow's API and writes Table 1 (our avg@k beside the paper's
# AIME 2024 avg@32, intervals over problems and seeds), the mechanisms table (what each toggle moved, against the
# paper's expected sign), each toggle's marginal effect under the cumulative, leave-one-out and one-at-a-time
# designs, and the compute table as Markdown, CSV and LaTeX. The logic lives in `dapo.report` (tested);
# this notebook only calls it and shows the result. Run it with `dapo report`, or by hand:
#
#     jupytext --to ipynb analysis/table1.py && papermill analysis/table1.ipynb out.ipynb -p experiment NAME

# %%
from pathlib import Path

from IPython.display import Markdown, display

from dapo.report.load import load_experiment
from dapo.report.pipeline import write_tables

# %% tags=["parameters"]
experiment = "dapo-ablation"
tracking_uri = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///results/mlflow.db
out_dir = "results/report"
gpus_per_run = None  # None: from each run's tags/params, else 0 (costed in CPU-hours)
cpus_per_run = None
confidence = 0.95

# %%
exp = load_experiment(experiment, tracking_uri)
print(f"{len(exp.runs)} runs, k = {exp.k}, from {exp.tracking_uri}")
for w in exp.warnings:
    print("warning:", w)

# %%
missing = write_tables(exp, out_dir, gpus_per_run, cpus_per_run, confidence)
display(Markdown(Path(out_dir, "table1.md").read_text()))

# %%
display(Markdown(Path(out_dir, "mechanisms.md").read_text()))

# %%
display(Markdown(Path(out_dir, "marginal_effects.md").read_text()))

# %%
display(Markdown(Path(out_dir, "compute.md").read_text()))
