"""Evaluation: oracle engines through the real scoring path give 100 / 0 and hand-computed pass@k; `dapo eval`
runs a tiny random model end to end through real vLLM on the CPU and logs to MLflow."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dapo import metric_names as M
from dapo.evaluation import EvalResult, EvalSettings, evaluate, evaluate_on_replicas, write_samples
from dapo.rollout.base import per_prompt_counts
from dapo.rollout.replicas import ReplicaLayout
from dapo.types import Problem, Sample

PROBLEMS = [
    Problem("p0", "What is 6 times 7?", "42"),
    Problem("p1", "Half of one?", "\\frac{1}{2}"),
    Problem("p2", "Sum of 100 and 4?", "104"),
]


class OracleEngine:
    """Answers problem i (prompt ids [i]) with `answer_for(i, j)` for its j-th sample; records its calls."""

    def __init__(self, answer_for) -> None:  # noqa: ANN001
        self.answer_for = answer_for
        self.calls: list[tuple] = []

    def generate(self, prompt_ids, n, max_tokens, temperature=1.0, top_p=1.0, seeds=None):  # noqa: ANN001, ANN201
        self.calls.append((prompt_ids, n, max_tokens, temperature, top_p))
        out = []
        for p, k in zip(prompt_ids, per_prompt_counts(n, len(prompt_ids)), strict=True):
            i = p[0]
            texts = [f"Let me think.\nAnswer: {self.answer_for(i, j)}" for j in range(k)]
            out.append([Sample([1, 2, 3], [-0.1] * 3, "length" if j == 0 else "stop", t) for j, t in enumerate(texts)])
        return out


def settings(n: int = 4) -> EvalSettings:
    return EvalSettings(
        n=n,
        max_tokens=32,
        temperature=1.0,
        top_p=0.7,
        pass_k=(1, 2, 4),
        verifier="math_verify",
        bootstrap=200,
        confidence=0.9,
        seed=0,
    )


def run(engine, n: int = 4) -> EvalResult:  # noqa: ANN001
    return evaluate(engine, PROBLEMS, [[i] for i in range(len(PROBLEMS))], settings(n))


def test_right_oracle_scores_100_and_wrong_oracle_0() -> None:
    right = run(OracleEngine(lambda i, j: PROBLEMS[i].answer))
    for name in (M.eval_avg(4), M.eval_pass(1), M.eval_pass(2), M.eval_pass(4), M.eval_maj(4)):
        assert right.metrics[name] == pytest.approx(100.0), name
    wrong = run(OracleEngine(lambda i, j: "7"))
    for name in (M.eval_avg(4), M.eval_pass(4), M.eval_maj(4)):
        assert wrong.metrics[name] == pytest.approx(0.0), name
    # math-verify equivalence, not string equality: 0.5 is \frac{1}{2}
    assert run(OracleEngine(lambda i, j: "0.5" if i == 1 else "0")).metrics[M.eval_avg(4)] == pytest.approx(100 / 3)


def test_hand_computed_avg_pass_maj_and_sample_records() -> None:
    # p0: 4/4 correct; p1: samples 0, 1 correct (c=2), majority "1/2" (2 vs 1 vs 1); p2: none, majority "5"
    def answer(i: int, j: int) -> str:
        return {0: "42", 1: ["1/2", "1/2", "3", "4"][j], 2: "5" if j < 3 else "6"}[i]

    eng = OracleEngine(answer)
    res = run(eng)
    assert eng.calls == [([[0], [1], [2]], [4, 4, 4], 32, 1.0, 0.7)]  # n samples per problem, one call, config passed
    m = res.metrics
    assert m[M.eval_avg(4)] == pytest.approx(100 * (4 + 2 + 0) / 12)
    # pass@2 = 1 - C(n-c, 2)/C(n, 2): p0 1, p1 1 - 1/6, p2 0
    assert m[M.eval_pass(2)] == pytest.approx(100 * (1 + (1 - 1 / 6) + 0) / 3)
    assert m[M.eval_pass(4)] == pytest.approx(200 / 3)
    assert m[M.eval_maj(4)] == pytest.approx(200 / 3)
    for name in (M.eval_avg(4), M.eval_pass(2)):
        assert m[M.ci_low(name)] <= m[name] <= m[M.ci_high(name)]
    assert dict(res) == res.metrics and len(res) == len(res.metrics)

    assert len(res.samples) == 3 * 4
    s = res.samples[5]  # problem p1, sample 1
    assert (s["problem_id"], s["sample_index"], s["extracted"], s["correct"], s["score"]) == ("p1", 1, "1/2", True, 1.0)
    assert res.samples[4]["truncated"] is True and s["truncated"] is False
    assert s["text"].endswith("Answer: 1/2") and s["num_tokens"] == 3


def test_pass_k_above_n_is_skipped_and_samples_jsonl(tmp_path: Path) -> None:
    res = run(OracleEngine(lambda i, j: PROBLEMS[i].answer), n=2)
    assert M.eval_pass(2) in res.metrics and M.eval_pass(4) not in res.metrics
    path = write_samples(res.samples, tmp_path / "out" / "samples.jsonl")
    rows = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert len(rows) == 3 * 2 and {r["problem_id"] for r in rows} == {"p0", "p1", "p2"}
    assert set(rows[0]) >= {"problem_id", "sample_index", "text", "extracted", "score", "truncated"}


def test_sharded_evaluation_gives_the_one_call_result_and_stops_between_shards() -> None:
    """In shards (one replica here): the same records and metrics as one call; a stop request ends it before
    the next shard and returns None."""

    def answer(i: int, j: int) -> str:
        return {0: "42", 1: ["1/2", "1/2", "3", "4"][j], 2: "5" if j < 3 else "6"}[i]

    whole = run(OracleEngine(answer))
    eng = OracleEngine(answer)
    one = ReplicaLayout(1, 1, 0)
    prompts = [[i] for i in range(len(PROBLEMS))]
    sharded = evaluate_on_replicas(eng, one, PROBLEMS, prompts, settings(), seed_base=0, shard_sequences=4)
    assert [c[0] for c in eng.calls] == [[[0]], [[1]], [[2]]]  # 4 sequences a shard: one problem of n=4
    assert sharded is not None and sharded.metrics == whole.metrics and sharded.samples == whole.samples

    polls = []
    stopped = evaluate_on_replicas(
        OracleEngine(answer),
        one,
        PROBLEMS,
        prompts,
        settings(),
        seed_base=0,
        shard_sequences=8,
        should_stop=lambda: polls.append(1) or True,
    )
    assert stopped is None and polls == [1]  # polled before the second shard, never before the first


def test_evaluate_rejects_an_empty_eval_set() -> None:
    with pytest.raises(ValueError, match="no problems"):
        evaluate(OracleEngine(lambda i, j: "1"), [], [], settings())


@pytest.mark.slow
def test_dapo_eval_cli_tiny_model_through_vllm(tmp_path: Path, vllm) -> None:
    """`dapo eval` on a random tiny Qwen2 through real vLLM on CPU: metrics in range, P x n sample rows, files
    written, metrics and artifacts in MLflow; then an eval logged into an existing (finished) run keeps its
    status."""
    from test_rollout import build_tiny_qwen2

    from dapo.cli import main
    from dapo.tracking import Tracker

    model = build_tiny_qwen2(tmp_path / "model", tie=True)
    data = tmp_path / "eval.jsonl"
    data.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(5)
        )
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "eval"
    rc = main(
        [
            "eval",
            "--preset",
            "tiny",
            "--model",
            str(model),
            "--out",
            str(out),
            f"data.eval={data}",
            "data.max_prompt_length=512",
            "data.use_chat_template=false",
            "rollout.engine=vllm",
            "model.dtype=float32",
            "eval.n=4",
            "eval.max_tokens=16",
            "eval.pass_k=[1,2,4]",  # k <= eval.n, or the config is refused (tests/test_config.py)
            "eval.bootstrap=50",
            f"tracking.uri={uri}",
            "tracking.experiment=eval-test",
        ]
    )
    assert rc == 0
    rows = [json.loads(ln) for ln in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 5 * 4
    assert all(r["num_tokens"] <= 16 and isinstance(r["text"], str) for r in rows)
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    for name in (M.eval_avg(4), M.eval_pass(1), M.eval_pass(4), M.eval_maj(4)):
        assert 0.0 <= metrics[name] <= 100.0 and math.isfinite(metrics[name])
    # a random model's accuracy equals the fraction of correct rows, whatever it is
    assert metrics[M.eval_avg(4)] == pytest.approx(100 * sum(r["correct"] for r in rows) / len(rows))

    tr = Tracker(uri, "eval-test", None)
    runs = tr.client.search_runs([tr.experiment_id], "attributes.status = 'FINISHED'")
    assert len(runs) == 1
    logged = runs[0].data.metrics
    assert logged[M.eval_avg(4)] == pytest.approx(metrics[M.eval_avg(4)])
    assert sorted(f.path for f in tr.client.list_artifacts(runs[0].info.run_id, "eval")) == [
        "eval/metrics.json",
        "eval/samples.jsonl",
    ]

    # into an existing training run: metrics at its last rollout step, its status untouched
    from dapo.commands.eval import log_to_mlflow, mlflow_step
    from dapo.config import load_config

    train = Tracker(uri, "eval-test", "row0-s0", spool_dir=tmp_path / "spool")
    train.log_metrics({M.ROLLOUT_STEP: 30}, step=30)
    train.finish("FINISHED")
    cfg = load_config(None, preset="tiny", overrides=[f"tracking.uri={uri}", "tracking.experiment=eval-test"])
    step = mlflow_step(cfg, model, train.run_id, None)  # no DONE.json beside the model: the run's last step
    assert step == 30
    rid = log_to_mlflow(
        cfg, {M.eval_avg(4): 12.5}, [out / "metrics.json"], run_id=train.run_id, step=step, spool_dir=tmp_path / "spool"
    )
    assert rid == train.run_id
    hist = train.client.get_metric_history(rid, M.eval_avg(4))
    assert [(h.step, h.value) for h in hist] == [(30, 12.5)]
    assert train.client.get_run(rid).info.status == "FINISHED"


def test_eval_cli_step_comes_from_done_json_or_the_run_never_silently_0(tmp_path: Path) -> None:
    """`dapo eval --run-id`: the model's training step from DONE.json beside it; an explicit --step wins; a new
    run is step 0; when neither DONE.json nor the tracking server can say, the command refuses, asking for --step."""
    from dapo.commands.eval import mlflow_step
    from dapo.config import load_config

    run_dir = tmp_path / "run"
    (run_dir / "final").mkdir(parents=True)
    (run_dir / "DONE.json").write_text(json.dumps({"run_id": "abc", "step": 17}))
    away = load_config(None, preset="tiny", overrides=["tracking.uri=http://127.0.0.1:9"])  # nothing listens
    assert mlflow_step(away, run_dir / "final", "abc", None) == 17
    assert mlflow_step(away, run_dir / "final", "abc", 5) == 5
    assert mlflow_step(away, run_dir / "final", None, None) == 0
    with pytest.raises(SystemExit, match="pass --step"):
        mlflow_step(away, run_dir / "final", "another-run", None)  # DONE.json names another run
