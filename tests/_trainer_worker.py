"""One rank of a training run with the real loop and the real learner (DeepSpeed on gloo), a scripted engine and a
file tracker; tests/test_trainer_dist.py starts it at world size 1 and 2.

    [torchrun --nproc-per-node=2] python tests/_trainer_worker.py MODEL_DIR OUT_DIR [config overrides ...]

The engine answers from the prompt alone (not the seed), so every world size collects the same batch: problem i
(prompt [i + 1, 7, 9]) is answered all right when i % 3 == 0, all wrong when i % 3 == 2 and half right otherwise,
so dynamic sampling drops two groups in three and refills. Each rank writes OUT_DIR/calls.rank<R>.json (the
problem indices of each generate call, with their sample counts), rank 0 writes OUT_DIR/result.pt (final weights, logged
metrics, counters).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from dapo_faults import Faults, FaultyLearner  # noqa: E402  (tests/faults, on PYTHONPATH: _env.child_env)

from dapo import distributed as dist  # noqa: E402
from dapo.config import load_config  # noqa: E402
from dapo.evaluation.evaluate import EvalSettings  # noqa: E402
from dapo.rollout.base import per_prompt_counts  # noqa: E402
from dapo.trainer.components import Components, EvalSet  # noqa: E402
from dapo.trainer.loop import Trainer  # noqa: E402
from dapo.trainer.setup import make_learner, run_settings  # noqa: E402
from dapo.types import Problem, Sample  # noqa: E402

N_PROBLEMS = 48


class ScriptedEngine:
    def __init__(self, eos: int) -> None:
        self.eos, self.calls = eos, []

    def generate(self, prompt_ids, n, max_tokens, temperature=1.0, top_p=1.0, seeds=None):  # noqa: ANN001, ANN201
        idx = [p[0] - 1 for p in prompt_ids]
        counts = per_prompt_counts(n, len(idx))
        self.calls.append({"counts": counts, "problems": idx})
        # Sample j of a problem is scripted by its index among the problem's n: the test's 2 replicas divide every
        # n, so replica r draws samples r * k .. r * k + k - 1 of each problem (dapo.rollout.replicas).
        replica = int(os.environ.get("RANK", "0"))
        out = []
        for i, k in zip(idx, counts, strict=True):
            group = []
            for j in range(replica * k, replica * k + k):
                right = i % 3 == 0 or (i % 3 == 1 and j % 2 == 0)
                length = 1 + (i + 2 * j) % max_tokens
                stop = length < max_tokens
                ids = [20 + (i * 7 + j * 3 + t) % 200 for t in range(length - 1)] + [self.eos if stop else 33]
                text = f"Answer: {1 if right else 0}"
                group.append(Sample(ids, None, "stop" if stop else "length", text))
            out.append(group)
        return out

    def generate_partial(self, requests, temperature, top_p, poll):  # noqa: ANN001, ANN201
        """Carry-over: each request's tokens come from a generator seeded by its own seed, one a decode step, each
        ending the response with probability 0.15 (else the request's cap); right per the problem's script (i % 3 == 1:
        by the parity of the response's tokens). A request's samples depend on its seed and the decode step a poll
        stops it at, which every replica shares: the same on any number of replicas."""
        import random

        rngs = [random.Random(r.seed) for r in requests]
        toks: list[list[int]] = [[] for _ in requests]
        reasons: list[str | None] = [None] * len(requests)

        def whole(k: int, reason: str) -> Sample:
            r = requests[k]
            ids = list(r.prefix_ids) + toks[k]
            i = r.prompt_ids[0] - 1
            right = i % 3 == 0 or (i % 3 == 1 and sum(ids) % 2 == 0)
            return Sample(ids, list(r.prefix_logprobs) + [-1.0] * len(toks[k]), reason, f"Answer: {int(right)}")

        while True:
            finished = []
            for k, r in enumerate(requests):
                if reasons[k] is None:
                    end = rngs[k].random() < 0.15
                    toks[k].append(self.eos if end else 20 + rngs[k].randrange(200))
                    if end or len(toks[k]) >= r.max_tokens:
                        reasons[k] = "stop" if end else "length"
                        finished.append((k, whole(k, reasons[k])))
            if poll(finished):
                break
        return [whole(k, reasons[k] or "abort") for k in range(len(requests))]

    def sync_weights(self, named):  # noqa: ANN001, ANN201
        for _ in named:  # a ZeRO-3 learner gathers as the stream is read: read it all
            pass

    def score(self, prompt_ids, response_ids):  # noqa: ANN001, ANN201
        raise NotImplementedError

    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass

    def close(self) -> None:
        pass


class FileTracker:
    def __init__(self, run_id: str | None) -> None:
        self.run_id, self.metrics, self.tags, self.status = run_id or "run", {}, {}, None

    def log_params(self, params):  # noqa: ANN001, ANN201
        pass

    def set_tags(self, tags):  # noqa: ANN001, ANN201
        self.tags.update(tags)

    def log_metrics(self, metrics, step):  # noqa: ANN001, ANN201
        for k, v in metrics.items():
            self.metrics.setdefault(k, {})[step] = v

    def log_artifact(self, path, artifact_path=None):  # noqa: ANN001, ANN201
        pass

    def flush(self) -> bool:
        return True

    def finish(self, status="FINISHED"):  # noqa: ANN001, ANN201
        self.status = status


def main() -> None:
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    cfg = load_config(
        str(Path(__file__).resolve().parent.parent / "configs/ablations/05_dynamic_sampling.yaml"),
        preset="tiny",
        overrides=[
            "trainer.total_steps=2",
            "trainer.train_batch_size=4",
            "trainer.mini_batch_size=2",
            "trainer.epochs=1",
            "trainer.zero_stage=2",
            "trainer.checkpoint_every=0",
            "trainer.lr=2e-4",  # AdamW: a small step keeps float noise in near-zero gradients small
            "trainer.warmup_steps=0",
            "trainer.packing=sequences",
            "model.dtype=float32",
            "rollout.n=4",
            "rollout.max_response_length=6",
            "algorithm.overlong_buffer_len=3",
            "algorithm.gen_batch_size=4",
            "algorithm.max_num_gen_batches=0",
            "algorithm.verifier=dapo_rule",
            "eval.every=0",
            "eval.n=2",
            "eval.pass_k=[1,2]",
            "eval.bootstrap=10",
            *sys.argv[3:],
        ],
    )
    dist.init_distributed(timeout_s=cfg.trainer.collective_timeout_s)
    learner = make_learner(cfg, model_dir)
    # a fault a test asks for (DAPO_TEST_FAIL_AT): this worker builds its own components, so it wraps the learner
    # itself (dapo train gets the same wrapper through setup.build_components: tests/faults)
    learner = FaultyLearner(learner, Faults.from_env())
    engine = ScriptedEngine(eos=learner.engine.module.lm.config.eos_token_id)
    problems = [Problem(str(i), f"p{i}", "1") for i in range(N_PROBLEMS)]
    prompts = [[i + 1, 7, 9] for i in range(N_PROBLEMS)]
    trackers: list[FileTracker] = []

    def make_tracker(run_id: str | None) -> FileTracker:
        trackers.append(FileTracker(run_id))
        return trackers[-1]

    comps = Components(
        engine=engine,
        learner=learner,
        problems=problems,
        prompts=prompts,
        make_tracker=make_tracker,
        eval_set=EvalSet(problems[:10], prompts[:10], EvalSettings(n=2, max_tokens=6, pass_k=(1, 2), bootstrap=10)),
    )
    code = Trainer(run_settings(cfg), out / "run", comps, progress=False).run()
    (out / f"calls.rank{dist.rank()}.json").write_text(json.dumps(engine.calls))
    params = {k: v.detach().clone() for k, v in learner.named_parameters_for_sync()}
    if dist.is_main():
        torch.save(
            {"code": code, "params": params, "metrics": trackers[0].metrics, "status": trackers[0].status},
            out / "result.pt",
        )
    dist.shutdown()
    sys.exit(code)


if __name__ == "__main__":
    main()
