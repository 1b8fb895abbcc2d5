"""`dapo train`: train one ablation row; rerunning the same command on the same run directory resumes it. Its exit
codes and what it checks before anything heavy, in order: docs/architecture.md, "trainer/"."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import time
from pathlib import Path

from dapo.commands.config import add_config_arguments, add_ladder_argument
from dapo.fsio import atomic_write
from dapo.trainer import DONE_FILE, RESUME_EXIT_CODE

log = logging.getLogger("dapo.train")
EXIT_FILE = "EXIT.json"  # the trainer's own verdict (code, step), read by workflow/scripts/train_job.sh


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    add_ladder_argument(p)
    p.add_argument(
        "--run-dir",
        help="Run directory (checkpoints, final model, DONE.json); default trainer.output_dir. "
        "An existing run directory with checkpoints is resumed.",
    )
    p.add_argument(
        "--progress",
        choices=["auto", "bar", "log"],
        default="auto",
        help="A rich progress bar (`bar`), one log line per step (`log`), or bar only on a terminal.",
    )


def run(args: argparse.Namespace) -> int:
    from dapo.trainer.signals import StartupGuard

    guard = StartupGuard(RESUME_EXIT_CODE).install()  # first: a preemption while loading exits 75, not 143
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from dapo.config import load_config
    from dapo.designs import check_run_file
    from dapo.tinyworld import TinyWorld
    from dapo.trainer.preflight import launched_world_size, preflight

    cfg = load_config(args.config, preset=args.preset, overrides=args.overrides)
    for problem in check_run_file(args.config, args.preset, args.overrides, allow=args.allow_confounded_ladder):
        log.warning("not a clean ablation: %s", problem)
    if args.run_dir:
        cfg.trainer.output_dir = args.run_dir
    run_dir = Path(cfg.trainer.output_dir)
    world = launched_world_size()
    rank = int(os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or 0)
    log.info(
        "dapo train: rank %d of %d on %s%s, run directory %s",
        rank,
        world,
        socket.gethostname(),
        f" (SLURM job {os.environ['SLURM_JOB_ID']})" if os.environ.get("SLURM_JOB_ID") else "",
        run_dir,
    )
    code: int | None = None
    forget = None
    if rank == 0:  # the failure watch may end this rank with os._exit (no finally): the exit file still says why
        from dapo.distributed import at_forced_exit

        forget = at_forced_exit(lambda forced: _write_exit(run_dir, forced))
    try:
        if rank == 0:
            _deliver_spools(run_dir)
        if (run_dir / DONE_FILE).is_file():
            log.info("%s/%s exists: this run is finished, nothing to do", run_dir, DONE_FILE)
            code = 0
            return code
        world_plugin = TinyWorld(cfg)  # the tiny world's names (`tiny`) and habit tags: the trainer imports no world
        preflight(cfg, world, world_plugin)
        if rank == 0 and not _open_run(cfg, run_dir):
            code = RESUME_EXIT_CODE  # the tracking server did not answer: nothing was done, try again later
            return code
        code = _train(cfg, run_dir, args.progress, guard, world_plugin)
        return code
    except BaseException as e:
        code = _exit_code_of(e)
        raise
    finally:
        guard.disarm()
        if forget is not None:
            forget()  # a later run in this process writes its own exit file, never this one's
        if rank == 0:
            _write_exit(run_dir, code)


def _exit_code_of(e: BaseException) -> int:
    from dapo.config import ConfigError
    from dapo.data.loaders import DataError
    from dapo.trainer.checkpoint import CheckpointError

    if isinstance(e, SystemExit):
        return e.code if isinstance(e.code, int) else 1
    if isinstance(e, ConfigError | DataError | CheckpointError):
        return 2
    from dapo.distributed import PeerLost, RendezvousError

    if isinstance(e, PeerLost | RendezvousError):  # a host, link or port, not the run: resume (the job requeues)
        return RESUME_EXIT_CODE
    return 1


def _train(cfg, run_dir: Path, progress: str, guard, world) -> int:  # noqa: ANN001 (RunConfig, StartupGuard, World)
    from dapo import distributed as dist
    from dapo.trainer.loop import Trainer
    from dapo.trainer.setup import build_components, run_settings

    # Join the job's group before building, so that a rank failing while it builds (a model that does not load on
    # one node) ends every rank at once, naming itself, as a failure in the loop does, instead of leaving the
    # others in a collective until the timeout when the launcher does not end them (`srun` without
    # --kill-on-bad-exit).
    # A stop signal's StartupStop (a SystemExit) is not reported: every rank gets that signal itself.
    t = cfg.trainer
    dist.init_distributed(timeout_s=t.collective_timeout_s, rendezvous_timeout_s=t.rendezvous_timeout_s)
    with dist.FailureWatch(heartbeat_timeout_s=t.heartbeat_timeout_s, lost_exit_code=RESUME_EXIT_CODE) as watch:
        try:
            components = build_components(cfg, run_dir, world)
        except Exception as e:
            lost = watch.peer_lost(e)
            if lost is not None:
                raise dist.PeerLost(lost) from e
            raise
    try:
        return Trainer(
            run_settings(cfg), run_dir, components, progress={"auto": None, "bar": True, "log": False}[progress]
        ).run()
    finally:
        guard.disarm()  # the loop has checkpointed or finished: a late signal must not turn that into 75
        components.close()


def _deliver_spools(run_dir: Path) -> None:
    """MLflow records an earlier invocation could not deliver (the server was down at its end)."""
    from dapo.tracking import replay_pending

    for s in replay_pending(run_dir / "mlflow_spool"):
        if s.waiting:
            log.warning(
                "%d MLflow record(s) of run %s still wait in %s (%s unreachable)", s.waiting, s.run_id, s.path, s.uri
            )
        else:
            log.info("delivered %d spooled MLflow record(s) to run %s", s.delivered, s.run_id)


def _open_run(cfg, run_dir: Path) -> bool:  # noqa: ANN001
    """Create the MLflow run (or find the one recorded in the run directory) before anything is logged, so a restart
    at any later moment resumes it. False when it could not be created (exit 75); ConfigError when refused (exit 2)."""
    from dapo.config import ConfigError
    from dapo.tracking import Tracker, TrackingRefused, TrackingUnavailable

    try:
        Tracker(
            cfg.tracking.uri,
            cfg.tracking.experiment,
            cfg.run_name(),
            spool_dir=run_dir / "mlflow_spool",
            start_timeout_s=cfg.tracking.start_timeout_s,
            record_run=True,
        )
    except TrackingUnavailable as e:
        log.error("%s", e)
        return False
    except TrackingRefused as e:  # wrong or missing credentials: final (exit 2), a requeue would be refused again
        raise ConfigError(str(e)) from None
    return True


def _write_exit(run_dir: Path, code: int | None) -> None:
    if code is None:
        return
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(run_dir / EXIT_FILE, json.dumps({"code": code, "time": time.time(), "pid": os.getpid()}))
    except OSError as e:  # a full disk must not hide the real exit code
        log.warning("could not write %s: %s", run_dir / EXIT_FILE, e)
