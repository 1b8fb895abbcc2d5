"""Table 1, the mechanisms tables, the designs' marginal effects, the compute table and the paper's figures,
regenerated from an MLflow experiment: `dapo report --experiment dapo-ablation` executes the analysis notebooks
(analysis/*.py) that call `dapo.report.pipeline` (or `build_report(experiment, tracking_uri, out_dir)` in Python);
`dapo compare A B` puts two rows side by side. `load` reads MLflow into `runs`' plain data, from which every table
(`table1`, `mechanisms`, `evidence`, `marginal`, `compute`, `variants`; written by `formats`) and `figures` is made.
"""
