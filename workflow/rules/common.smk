# What the rules share: the workflow's spec, from `dapo plan --json` (dapo/workflow_spec.py). Every decision (rows,
# seeds, each run's config file and overrides, SLURM resources, the plan and its refusal) is made there, in Python;
# this file only runs that command once, when Snakemake parses the workflow, and reads its answer. A bad config
# stops the run here, before any job is submitted, with the file, the key and the fix.

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate


def _typed(value):
    """--config 'plan={train_mfu: 0.3}' arrives as text (Snakemake reads nested values with YAML's BaseLoader)."""
    import yaml

    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    return yaml.safe_load(value) if isinstance(value, str) else value


for _key in ("plan", "allow_confounded_ladder"):
    if _key in config:
        config[_key] = _typed(config[_key])
validate(config, schema="../schemas/config.schema.yaml")  # and fill in the schema's defaults

# Rules call the `dapo` CLI: make the environment Snakemake runs in (the project's venv) the one they find,
# locally and in SLURM jobs (the plugin submits with --export=ALL).
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def _spec():
    """`dapo plan --json` over this config: on the submitting machine with the plan (Snakemake's --jobs and
    --resources train_nodes size it; the train rule's slurm_extra from --set-resources is checked) and the SLURM
    jobs an earlier controller left; inside a job only what the rules need."""
    cmd = [shutil.which("dapo") or "dapo", "plan", "--json", "--config-json", json.dumps(config)]
    if workflow.is_main_process:
        cmd.append("--live-jobs")
        if workflow.resource_settings.nodes:  # --jobs (the profile's `jobs:`); unset: a local run
            cmd += ["--jobs", str(workflow.resource_settings.nodes)]
        limit = getattr(workflow.global_resources.get("train_nodes"), "value", None)  # --resources train_nodes=N
        if isinstance(limit, (int, float)):
            cmd += ["--train-nodes", str(limit)]
        extra = (workflow.resource_settings.overwrite_resources or {}).get("train", {}).get("slurm_extra")
        if extra is not None:
            cmd += ["--train-slurm-extra", str(getattr(extra, "raw", extra))]
    else:
        cmd.append("--no-plan")
    r = subprocess.run(cmd, capture_output=True, text=True)
    try:
        spec = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise WorkflowError(f"nothing was submitted: `dapo plan --json` failed (exit {r.returncode}):\n{r.stderr[-3000:]}") from None
    if "error" in spec:
        raise WorkflowError(spec["error"])
    return spec


SPEC = _spec()
PRESET = SPEC["preset"]
RESULTS = Path(SPEC["results"])
SEEDS = SPEC["seeds"]
ROWS = SPEC["rows"]
OVERRIDES = SPEC["overrides"]
TRACKING_URI = SPEC["tracking_uri"]
EXPERIMENT = SPEC["experiment"]
TINY_DIR = Path(SPEC["tiny_dir"])
BASE_MODEL = SPEC["base_model"]  # source (tiny, local or hub), id, path, marker
IS_TINY = BASE_MODEL["source"] == "tiny"
RUNS = SPEC["runs"]  # run name -> config file, and per seed: run_dir, train_args, srun, priority


def drop_cpu_defaults():
    """The CPU-only defaults `make` exports for the tests and the tiny world (DAPO_CPU_DEFAULTS names the ones it set
    itself: DS_ACCELERATOR=cpu, HF_HUB_OFFLINE=1) leave this process's environment, so that neither the rules nor
    the SLURM jobs (the profile submits with --export=ALL) of a real model's preset see them: DeepSpeed would run on
    the CPU, and the base model's download would be refused. A value the user set before `make` is kept."""
    names = os.environ.pop("DAPO_CPU_DEFAULTS", "").split()
    return [f"{n}={os.environ.pop(n)}" for n in names if n in os.environ]


if not IS_TINY:
    _dropped = drop_cpu_defaults()
    if _dropped and workflow.is_main_process:
        print(f"note: not passed on to the jobs of preset {SPEC['preset_name']} (make's CPU defaults): "
              f"{' '.join(_dropped)}", file=sys.stderr)


# Training jobs an earlier controller of this results folder left queued or running (it died, or was killed): a
# rerun waits for each of them (rule attach_train) instead of submitting the run a second time.
LIVE_TRAIN_JOBS = {(j["run"], j["seed"]): (j["job"], j["state"]) for j in SPEC["live_train_jobs"]}
for (_run, _seed), (_job, _state) in sorted(LIVE_TRAIN_JOBS.items()):
    print(f"note: {_run} s{_seed} is SLURM job {_job} ({_state}) from an earlier controller: waiting for it, not "
          "submitting it again", file=sys.stderr)


def q(*parts):
    """Shell-quote a command line's words for a rule's shell template (its braces doubled, so that Snakemake's
    formatting leaves a value's `{` and `}` alone). Values that vary per job go through params and `:q` instead."""
    return " ".join(shlex.quote(str(p)) for p in parts).replace("{", "{{").replace("}", "}}")


def run_of(name, seed):
    """One run's entry of the spec: run_dir, train_args, srun, priority."""
    return RUNS[name]["seeds"][str(seed)]


# The plan in words (printed once, by the main process); a plan that cannot run stops here.
if workflow.is_main_process:
    print(SPEC["plan_text"], file=sys.stderr)
    if SPEC["refusal"]:
        raise WorkflowError(SPEC["refusal"])


def _controller(action, *args):
    """`dapo controller start|stop` for this Snakemake process: its notes and warnings go to stderr; a refusal
    (another controller holds the results folder, a tracking store the runs cannot use) stops the workflow."""
    cmd = [shutil.which("dapo") or "dapo", "controller", action, "--results", str(RESULTS), "--pid", str(os.getpid())]
    r = subprocess.run([*cmd, *args], capture_output=True, text=True)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        raise WorkflowError((r.stderr.strip().splitlines() or [f"dapo controller {action}: exit {r.returncode}"])[-1])


onstart:
    # Once, on the submitting machine, before any job: a second controller of this results folder, or a tracking
    # store the runs cannot use, stops everything here.
    _controller("start", "--tracking-uri", TRACKING_URI, f"--argv={shlex.join(sys.argv)}",
                *(["--cluster"] if workflow.non_local_exec else []))


onsuccess:
    _controller("stop")


onerror:
    _controller("stop")
