#!/usr/bin/env bash
# Run one training job, sort its end into "done", "resume me" and "failed for good", and resubmit a job that
# asked to be resumed. This script is the one place that decides about resubmission (Snakemake never retries a
# training job: its retries would run inside the dying SLURM job, see docs/failure-modes.md).
#   train_job.sh RUN_DIR LOG MAX_RESUBMITS RESUME_CODE SRUN_ARGS LOCAL_LAUNCHER CMD...
# RESUME_CODE is `dapo train`'s "resume me" exit code (dapo.trainer.RESUME_EXIT_CODE, passed in by the train rule).
# Under SLURM the ranks start with `srun SRUN_ARGS CMD...` (explicit nodes, tasks, tasks per node, GPUs per node:
# the job step that runs this script has no SLURM_* task variables, so a bare srun would start one task);
# elsewhere with `LOCAL_LAUNCHER CMD...` (empty: one process; or torchrun).
#
# Verdict, from the trainer's own word (RUN_DIR/EXIT.json written this attempt) or else its exit status:
#   0                      done (DONE.json written)
#   RESUME_CODE, or killed by TERM/INT/HUP/USR1/KILL
#                          resume: under SLURM the job requeues itself (`scontrol requeue`: same job id, so
#                          Snakemake keeps waiting on it) up to MAX_RESUBMITS times per submission; elsewhere exit RESUME_CODE
#                          and the same command resumes
#   anything else          failed for good: RUN_DIR/FAILED holds the code, the job ends failed, nothing resubmits
# Stop signals to this script (a time limit signals every process of the job) are passed on to the trainer and
# otherwise ignored, and the log's `tee` ignores them, so the trainer's code always comes back out of here.
# Every attempt appends to RUN_DIR/train.log (Snakemake may truncate LOG) and to RUN_DIR/attempts.jsonl; the SLURM
# log of each job is linked into RUN_DIR/slurm/.
set -u
run_dir=$1 log=$2 max_resubmits=$3 resume_code=$4 srun_args=$5 local_launcher=$6
shift 6
mkdir -p "$run_dir" "$(dirname "$log")"
job=${SLURM_JOB_ID:-}
attempts="$run_dir/attempts.jsonl"
# counted by the attempts that started (train.log), not those that ended (attempts.jsonl): an attempt whose node
# died ended without a word
attempt=$(( $(grep -c '^== attempt ' "$run_dir/train.log" 2>/dev/null || true) + 1 ))
started=$(date +%s)
mark="$run_dir/.attempt-start"
touch "$mark"
rm -f "$run_dir/FAILED"

if [ -n "$job" ]; then
  # the SLURM log (its path is only known to the job itself) beside the run's own log, for every attempt
  slurm_log=$(scontrol show job "$job" 2>/dev/null | sed -n 's/^ *StdOut=//p' | head -n 1)
  if [ -n "$slurm_log" ] && [ -f "$slurm_log" ]; then
    mkdir -p "$run_dir/slurm"
    ln -f "$slurm_log" "$run_dir/slurm/$job.log" 2>/dev/null || ln -sf "$slurm_log" "$run_dir/slurm/$job.log"
  fi
  # srun's tasks take their rank and world size from SLURM_PROCID / SLURM_NTASKS; torchrun's variables, inherited
  # from wherever Snakemake was started, would win over them and make every task rank 0 of 1
  unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT
  # shellcheck disable=SC2206  # SRUN_ARGS is a list of options by design
  launcher=(srun $srun_args)
else
  # shellcheck disable=SC2206
  launcher=($local_launcher)
fi
echo "== attempt $attempt, $(date -u +%FT%TZ)${job:+, SLURM job $job}: ${launcher[*]} $*" \
  | tee -a "$run_dir/train.log" >> "$log"
# what decides where the ranks run and what they may download, as this job sees it (make's CPU defaults must not
# reach a GPU preset's job: workflow/rules/common.smk; NCCL settings: docs/cluster.md)
env_line="== environment:"
for v in DS_ACCELERATOR HF_HUB_OFFLINE CUDA_VISIBLE_DEVICES; do env_line+=" $v=${!v-<unset>}"; done
env_line+=" $(env | grep -E '^NCCL_' | sort | tr '\n' ' ')"
echo "$env_line" | tee -a "$run_dir/train.log" >> "$log"
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-${OMP_NUM_THREADS:-1}}

exec 3>> "$log"
# tee ignores stop signals (a dead tee would break the trainer's stdout in the middle of its checkpoint)
"${launcher[@]}" "$@" > >(trap '' TERM INT HUP USR1; exec tee -a "$run_dir/train.log" >&3) 2>&1 &
child=$!
for sig in TERM INT HUP USR1; do
  # srun passes TERM on to every task; the trainer treats TERM and USR1 alike (stop, checkpoint, exit RESUME_CODE)
  trap 'echo "train_job.sh: got a stop signal; passing it on and waiting for the trainer" >&3; kill -TERM $child 2>/dev/null' "$sig"
done
while kill -0 "$child" 2>/dev/null; do wait "$child"; done
wait "$child"
rc=$?
wait  # tee: the log is complete before the verdict

code=$rc
if [ -f "$run_dir/EXIT.json" ] && [ "$run_dir/EXIT.json" -nt "$mark" ]; then
  code=$(sed -n 's/.*"code": *\([0-9]*\).*/\1/p' "$run_dir/EXIT.json")
  code=${code:-$rc}
fi
# A task that failed on its own (srun: "task N: Exited with exit code C", C neither 0 nor RESUME_CODE) before the
# ranks could tell each other (while importing, before they met) makes srun stop the rest, and rank 0, stopped
# during start-up, says "resume": the task's own code is the verdict, or the job would resubmit a crash. Not once a
# rank has found a peer lost (its host or link gone): the others' codes are then the loss seen from elsewhere.
attempt_log() { awk -v a="== attempt $attempt," 'index($0, a) == 1 {on = 1} on' "$run_dir/train.log"; }
if [ -n "$job" ] && [ "$code" = "$resume_code" ] && ! attempt_log | grep -q "a peer is lost ("; then
  task_code=$(attempt_log \
    | sed -n 's/^srun: error: .*: tasks\{0,1\} [0-9,-]*: Exited with exit code \([0-9]*\)$/\1/p' \
    | grep -vx -e 0 -e "$resume_code" | head -n 1)
  if [ -n "$task_code" ]; then
    echo "train_job.sh: a task exited with $task_code before its ranks could report it; that is the verdict" \
      | tee -a "$run_dir/train.log" >&3
    code=$task_code
  fi
fi
case "$code" in
  0) verdict=done ;;
  "$resume_code" | 129 | 130 | 137 | 138 | 143) verdict=resume ;;
  *) verdict=failed ;;
esac
# A node of this job that SLURM has marked down or not responding (a `*` after its state) took its ranks with it,
# whatever the others then ended with (NCCL's watchdog aborting them, a connection error): resume from the last
# checkpoint, never a failure for good. A config or data error (2) stays one. srun returns only once SLURM has
# declared a dead node failed, so its state is known here.
if [ -n "$job" ] && [ "$verdict" = failed ] && [ "$code" != 2 ]; then
  lost=$(sinfo -h -N -n "${SLURM_JOB_NODELIST:-}" -o '%N %T' 2>/dev/null \
    | awk '$2 ~ /[*]$/ || $2 ~ /^(down|fail)/ {print $1 " (" $2 ")"}' | sort -u | tr '\n' ' ')
  if [ -n "$lost" ]; then
    echo "train_job.sh: the trainer ended with $code while node(s) of this job are down or not responding:" \
      "${lost}; resuming from the last checkpoint" | tee -a "$run_dir/train.log" >&3
    verdict=resume
  fi
fi
printf '{"attempt": %d, "job": "%s", "start": %d, "end": %d, "exit": %d, "code": %s, "verdict": "%s"}\n' \
  "$attempt" "$job" "$started" "$(date +%s)" "$rc" "$code" "$verdict" >> "$attempts"

case "$verdict" in
  done) exit 0 ;;
  failed)
    echo "$code" > "$run_dir/FAILED"
    echo "dapo train failed (exit $code); log: $log (every attempt: $run_dir/train.log)" >&2
    exit "$code" ;;
esac
if [ -z "$job" ]; then
  echo "dapo train stopped for resume (exit $code); run the same command again to resume" >&2
  exit "$resume_code"
fi
this_job=$(grep -c "\"job\": \"$job\"" "$attempts" || true)
if [ "$this_job" -gt "$max_resubmits" ]; then
  echo "dapo train stopped for resume (exit $code), but SLURM job $job was already resubmitted $max_resubmits" \
    "time(s) (max_resubmits); giving up in this invocation: rerun the workflow to resume" >&2
  exit "$resume_code"
fi
echo "dapo train stopped for resume (exit $code): requeueing SLURM job $job (resubmission $this_job of" \
  "$max_resubmits); it resumes from the last checkpoint" | tee -a "$run_dir/train.log" >&3
if ! scontrol requeue "$job"; then
  echo "scontrol requeue $job failed: SLURM may be requeueing it already (after a node failure, or an" \
    "administrator's requeue), or the cluster forbids requeueing (sbatch --requeue, JobRequeue); if the job does" \
    "not come back, rerun the workflow to resume" >&2
fi
exit "$resume_code"
