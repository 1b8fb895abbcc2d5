"""Evaluation: oracle engines through the real scoring path give 100 / 0 and hand-computed pass@k; `dapo eval`
runs a tiny random model end to end through real vLLM on the CPU and logs to MLflow."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dapo import metric_names as M
from dapo.evaluation import EvalResult, evaluate, write_samples
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

    def generate(self, prompt_ids, n, max_tokens, temperature=1.0, top_p=1.0):  # noqa: ANN001, ANN201
        self.calls.append((prompt_ids, n, max_tokens, temperature, top_p))
        out = []
        for p in prompt_ids:
            i = p[0]
            texts = [f"Let me think.\nAnswer: {self.answer_for(i, j)}" for j in range(n)]
            out.append(
                [Sample(list(p), [1, 2, 3], [-0.1] * 3, "length" if j == 0 else "stop", t) for j, t in enumerate(texts)]
            )
        return out


def run(engine, n: int = 4, **kw) -> EvalResult:  # noqa: ANN001
    prompts = [[i] for i in range(len(PROBLEMS))]
    return evaluate(
        engine,
        PROBLEMS,
        prompts,
        n=n,
        max_tokens=32,
        temperature=1.0,
        top_p=0.7,
        pass_k=[1, 2, 4],
        verifier="math_verify",
        bootstrap=200,
        confidence=0.9,
        seed=0,
        **kw,
    )


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
    assert eng.calls == [([[0], [1], [2]], 4, 32, 1.0, 0.7)]  # n samples per problem, one call, config passed
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


def test_tokenizer_form_builds_dapo_prompts(tmp_path: Path) -> None:
    """evaluate(engine, tokenizer, problems): prompts are the DAPO template (dapo.data), tokenised once each."""
    from test_rollout import build_tiny_qwen2
    from transformers import AutoTokenizer

    from dapo.data.prompts import build_prompt, encode_prompt

    tok = AutoTokenizer.from_pretrained(build_tiny_qwen2(tmp_path / "m", tie=True))
    seen: dict[tuple, str] = {}
    for p in PROBLEMS:
        seen[tuple(encode_prompt(build_prompt(p.problem, tok, False), tok))] = p.answer

    class ByPrompt(OracleEngine):
        def generate(self, prompt_ids, n, max_tokens, temperature=1.0, top_p=1.0):  # noqa: ANN001, ANN201
            return [[Sample(list(p), [1], None, "stop", f"Answer: {seen[tuple(p)]}")] * n for p in prompt_ids]

    res = evaluate(ByPrompt(None), tok, PROBLEMS, n=2, max_tokens=8, pass_k=[1], bootstrap=0, use_chat_template=False)
    assert res.metrics[M.eval_avg(2)] == pytest.approx(100.0)


@pytest.mark.slow
def test_dapo_eval_cli_tiny_model_through_vllm(tmp_path: Path) -> None:
    """`dapo eval` on a random tiny Qwen2 through real vLLM on CPU: metrics in range, P x n sample rows, files
    written, metrics and artifacts in MLflow; then an eval logged into an existing (finished) run keeps its
    status."""
    pytest.importorskip("vllm")
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
            "eval.pass_k=[1,2,4,8]",
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
    assert M.eval_pass(8) not in metrics  # k > n skipped
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
    from dapo.config import load_config
    from dapo.evaluation.cli import log_to_mlflow

    train = Tracker(uri, "eval-test", "row0-s0", spool_dir=tmp_path / "spool")
    train.log_metrics({M.ROLLOUT_STEP: 30}, step=30)
    train.finish("FINISHED")
    cfg = load_config(None, preset="tiny", overrides=[f"tracking.uri={uri}", "tracking.experiment=eval-test"])
    rid = log_to_mlflow(
        cfg, {M.eval_avg(4): 12.5}, [out / "metrics.json"], run_id=train.run_id, step=None, spool_dir=tmp_path / "spool"
    )
    assert rid == train.run_id
    hist = train.client.get_metric_history(rid, M.eval_avg(4))
    assert [(h.step, h.value) for h in hist] == [(30, 12.5)]
    assert train.client.get_run(rid).info.status == "FINISHED"
