"""The trainer: one ablation row's loop (DAPO, arXiv:2503.14476, sections 2-4), checkpoints, resume, signals.

Importing this package is light (no torch, DeepSpeed or vLLM), so the CLI and the workflow can read the exit codes
of `dapo train` below: docs/failure-modes.md, "`dapo train`'s exit codes". Exit 2 also covers a tripwire
(`dapo.trainer.tripwires`), a failure a requeue would repeat.
"""

RESUME_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): run the same command again to resume into the same MLflow run
FAILURE_EXIT_CODE = 1
TRIPWIRE_EXIT_CODE = 2
DONE_FILE = "DONE.json"  # in the run directory: the run is finished (the workflow's output of a row)
# carry-over's over-fill (`rollout.max_staleness` >= 1): a round keeps this share of the train batch in flight beyond
# the generation batch (`step.StepSettings.in_flight`; `dapo plan` prices it)
OVERFILL = 0.25

__all__ = ["RESUME_EXIT_CODE", "FAILURE_EXIT_CODE", "TRIPWIRE_EXIT_CODE", "DONE_FILE", "OVERFILL"]
