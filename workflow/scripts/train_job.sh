#!/usr/bin/env bash
# Run one training job and sort its exit into "resume me" and "failed for good".
#   train_job.sh RUN_DIR ATTEMPT LOG CMD...
# Exit 75 (dapo train's "resume me": SLURM time limit or preemption) lets Snakemake resubmit the job, which
# resumes from the run's last checkpoint. Any other failure leaves RUN_DIR/FAILED, and later attempts of the
# same Snakemake invocation stop at once instead of burning GPU-hours; a new invocation (attempt 1) tries again.
# The output of every attempt is also appended to RUN_DIR/train.log, which Snakemake never cleans up (it may
# truncate LOG when it retries a job), so the first failure's traceback survives.
set -u
run_dir=$1 attempt=$2 log=$3; shift 3
mkdir -p "$run_dir" "$(dirname "$log")"
if [ "$attempt" -gt 1 ] && [ -f "$run_dir/FAILED" ]; then
  echo "dapo train failed for good on an earlier attempt (exit $(cat "$run_dir/FAILED")); see $run_dir/train.log" >&2
  exit 1
fi
rm -f "$run_dir/FAILED"
echo "== attempt $attempt, $(date -u +%FT%TZ), ${SLURM_JOB_ID:+SLURM job $SLURM_JOB_ID}" | tee -a "$run_dir/train.log" >> "$log"
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-${OMP_NUM_THREADS:-1}}
"$@" 2>&1 | tee -a "$run_dir/train.log" >> "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 75 ]; then
  echo "dapo train asked to be resumed (exit 75); Snakemake resubmits it" >&2
elif [ "$rc" -ne 0 ]; then
  echo "$rc" > "$run_dir/FAILED"
  echo "dapo train failed (exit $rc); log: $log (every attempt: $run_dir/train.log)" >&2
fi
exit "$rc"
