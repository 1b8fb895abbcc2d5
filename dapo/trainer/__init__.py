"""The trainer: one ablation row's loop (DAPO, arXiv:2503.14476, sections 2-4), checkpoints, resume, signals.

Importing this package is light (no torch, DeepSpeed or vLLM) so the CLI and the workflow can read the exit
codes below without paying for the heavy imports.

Exit codes of `dapo train` (the Snakemake workflow and SLURM wrappers key on them):

- 0: finished; `<run-dir>/DONE.json` holds the final metrics.
- 1: failed (e.g. too many non-finite steps in a row, the dynamic-sampling refill cap with
  `at_refill_cap: fail`, or an error on any rank of the job); the last good checkpoint is kept.
- 2: a config, data or checkpoint error, printed as one message naming the key, file or line and the fix; or a
  tripwire (`dapo.trainer.tripwires`): the engine does not sample what the learner trains on (a weight sync that
  did not load, samples that are not independent), a failure a requeue would repeat.
- 75 (`RESUME_EXIT_CODE`, EX_TEMPFAIL from sysexits.h): stopped on SIGTERM/SIGUSR1 (SLURM time limit or
  preemption) or before the job's time limit, after writing a checkpoint; or a stop signal during start-up (nothing
  to save yet), or a new run whose tracking server did not answer. Run the same command again to resume into the
  same MLflow run.
"""

RESUME_EXIT_CODE = 75
FAILURE_EXIT_CODE = 1
TRIPWIRE_EXIT_CODE = 2
DONE_FILE = "DONE.json"  # in the run directory: the run is finished (the workflow's output of a row)

__all__ = ["RESUME_EXIT_CODE", "FAILURE_EXIT_CODE", "TRIPWIRE_EXIT_CODE", "DONE_FILE"]
