# The DAPO cumulative ablation (paper Table 1) as a Snakemake workflow.
#   snakemake --cores all all_ablations           tiny CPU version (the embedded default)
#   snakemake --profile slurm all_ablations       on a SLURM cluster (profile in slurm/config.yaml)
#   snakemake --profile slurm all_ablations --config preset=qwen2.5-32b seeds=[0,1]
# This file is a shim: the rules live in workflow/ (see workflow/Snakefile).
include: "workflow/Snakefile"
