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
# # The paper's figures, from an MLflow experiment
#
# Fig 1 (avg@k and pass@k, full recipe), Fig 2 (clip-higher: accuracy and entropy), Fig 3a (probability of
# upper-clipped tokens), Fig 3b (all-correct groups), Fig 4 (token-level loss: entropy and length), Fig 5
# (overlong filtering), Fig 6 (dynamic sampling), response length per row, and the mechanisms' intervals; PNG and
# PDF under `<out_dir>/figures`. Seeds are drawn as mean and ±1 s.d. band. The drawing code is `dapo.report.figures`.

# %%
from IPython.display import Image, display

from dapo.report.load import load_experiment
from dapo.report.pipeline import write_figures

# %% tags=["parameters"]
experiment = "dapo-ablation"
tracking_uri = None
out_dir = "results/report"
x_axis = "updates"  # "updates" (the paper's gradient updates) or "rollout" (rollout steps)

# %%
exp = load_experiment(experiment, tracking_uri)
print(f"{len(exp.runs)} runs, k = {exp.k}, from {exp.tracking_uri}")

# %%
results = write_figures(exp, out_dir, x_axis)
for r in results:
    print(r.title, "| missing: " + "; ".join(r.missing) if r.missing else "")
    display(Image(filename=str(r.paths[0])))
