#!/usr/bin/env bash
# Wait for a SLURM training job an earlier controller submitted, then report how its run ended.
#   wait_job.sh JOB_ID RUN_DIR POLL_S
# The job may requeue itself (same id; workflow/scripts/train_job.sh) and run again: it is waited for until SLURM
# no longer lists it. A failed squeue (the controller daemon restarting) is retried, not taken for the job's end.
# Exit 0 when the run wrote DONE.json, 1 otherwise (the run's FAILED file or its attempts say why).
set -u
job=$1 run_dir=$2 poll=$3
echo "waiting for SLURM job $job ($run_dir), polling every ${poll}s"
while true; do
  if state=$(squeue -h -j "$job" -o %T 2>&1); then
    [ -z "$state" ] && break
  elif echo "$state" | grep -qi "invalid job id"; then
    break
  fi
  sleep "$poll"
done
if [ -f "$run_dir/DONE.json" ]; then
  echo "SLURM job $job ended; the run is done"
  exit 0
fi
echo "SLURM job $job ended without finishing its run ($run_dir: FAILED says why when it failed; else it stopped" \
  "for resume after its resubmissions): run the workflow again to resume it" >&2
exit 1
