"""The KL term for real (docs/algorithm.md section 9): a frozen reference policy whose log-probs come through the
learner's own chunked head, one update with kl_coef > 0 against a hand computation, the reference partitioned
at ZeRO-3 over two ranks, and `dapo train` end to end with kl_coef > 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _env import free_port, rank_env

from dapo import metric_names as M
from dapo.learner import Learner, LossSpec, PolicyBatch, ReferencePolicy, response_mask

pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")
REPO = Path(__file__).resolve().parent.parent
TEMPERATURE = 0.7  # the worker's too (tests/_reference_worker.py)
WIDTH = 10
VOCAB, INTERMEDIATE = 61, 64  # the models' (`_qwen2`)
EPS32 = torch.finfo(torch.float32).eps


def logp_tol(exact: torch.Tensor) -> float:
    """The learner's float32 log-probs against the float64 definition: the forward's longest float32 sums are the
    MLP's dot products (INTERMEDIATE terms) and the log-sum-exp over the vocabulary (VOCAB terms), each rounding by
    at most its length x eps relative to its terms' scale, here the largest |log-prob| (Higham's a-priori bound)."""
    return (INTERMEDIATE + VOCAB) * EPS32 * float(exact.abs().max())


def _qwen2(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(cfg).float()


def _batch(seed: int = 0) -> PolicyBatch:
    """4 groups of 3 responses of unequal lengths; one response overlong-filtered (mask 0)."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses, groups = [], [], []
    for gid, plen in enumerate([3, 5, 2, 4]):
        prompt = torch.randint(1, 61, (plen,), generator=g).tolist()
        for _ in range(3):
            prompts.append(prompt)
            responses.append(
                torch.randint(1, 61, (int(torch.randint(1, WIDTH, (1,), generator=g)),), generator=g).tolist()
            )
            groups.append(gid)
    mask = response_mask(responses, width=WIDTH)
    mask[4] = 0
    adv = torch.randn(len(prompts), generator=g)
    return PolicyBatch(prompts, responses, adv, mask, torch.tensor(groups))


def _naive_logp(model: torch.nn.Module, batch: PolicyBatch) -> torch.Tensor:
    """Full logits of each sequence alone, / temperature, log_softmax: the definition."""
    out = torch.zeros(batch.loss_mask.shape, dtype=torch.float64)
    for i, (p, r) in enumerate(zip(batch.prompt_ids, batch.response_ids, strict=True)):
        logits = model(torch.tensor([p + r])).logits[0].double() / TEMPERATURE
        lp = torch.log_softmax(logits, -1)[len(p) - 1 : len(p) - 1 + len(r)]
        out[i, : len(r)] = lp.gather(-1, torch.tensor(r)[:, None])[:, 0]
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The policy's initial model, and another one to serve as a reference that differs from it."""
    tmp = tmp_path_factory.mktemp("reference")
    policy, other = _qwen2(0), _qwen2(1)
    policy.save_pretrained(tmp / "policy")
    other.save_pretrained(tmp / "other")
    return {"policy": policy, "other": other, "policy_dir": tmp / "policy", "other_dir": tmp / "other", "tmp": tmp}


def _reference(model_dir: Path, zero_stage: int = 2) -> ReferencePolicy:
    return ReferencePolicy(
        str(model_dir),
        zero_stage=zero_stage,
        dtype="float32",
        micro_batch_tokens=40,  # several micro-batches
        logprob_chunk_size=5,
        temperature=TEMPERATURE,
    )


def _learner(model_dir: Path, kl_coef: float) -> Learner:
    return Learner(
        str(model_dir),
        loss=LossSpec(eps_low=0.2, eps_high=0.28, kl_coef=kl_coef, loss_agg="token-mean", temperature=TEMPERATURE),
        lr=1.0,  # SGD with lr 1: the step is the gradient itself
        grad_clip=1e6,
        zero_stage=0,
        dtype="float32",
        optimizer=lambda params: torch.optim.SGD(params, lr=1.0),  # one step = lr x gradient: exactness checks
        micro_batch_tokens=40,
        logprob_chunk_size=5,
    )


def test_reference_logprobs_are_the_models_own_and_stay_frozen_while_the_policy_learns(models):
    batch = _batch()
    ref = _reference(models["policy_dir"])
    before = ref.compute_logprobs(batch)
    with torch.no_grad():
        exact = _naive_logp(models["policy"], batch)
    valid = response_mask(batch.response_ids, width=WIDTH).bool()
    assert before.shape == (len(batch), WIDTH) and bool((before[~valid] == 0).all())
    assert (before.double() - exact).abs().max() < logp_tol(exact)  # a wrong model or temperature: O(0.1)
    assert not any(p.requires_grad for p in ref.engine.module.parameters())

    learner = _learner(models["policy_dir"], kl_coef=0.0)
    batch.old_logp, _ = learner.compute_logprobs(batch)
    torch.testing.assert_close(batch.old_logp, before, rtol=0, atol=0)  # same head, same weights: identical
    learner.update(batch)
    moved, _ = learner.compute_logprobs(batch)
    assert (moved - before)[valid].abs().max() > 1e-3  # the policy learned ...
    assert torch.equal(ref.compute_logprobs(batch), before)  # ... the reference did not


def test_one_update_with_a_kl_term_equals_the_hand_computed_step(models):
    """SGD, lr 1, token-mean, kl_coef 0.5, against a reference that differs from the policy:

        l_t = max(-A rho_t, -A clip(rho_t, 0.8, 1.28)) + beta (pi_ref/pi - log(pi_ref/pi) - 1)

    on full logits in float64; the learner's weights after its step must equal w - grad."""
    beta = 0.5
    batch = _batch(seed=3)
    learner = _learner(models["policy_dir"], kl_coef=beta)
    ref = _reference(models["other_dir"])
    batch.ref_logp = ref.compute_logprobs(batch)
    current, _ = learner.compute_logprobs(batch)
    # old log-probs away from the current policy, so that both clip bounds bind somewhere
    noise = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(7)) * 0.3
    batch.old_logp = (current + noise) * response_mask(batch.response_ids, width=WIDTH)
    metrics = learner.update(batch)
    streamed = dict(learner.named_parameters_for_sync())  # in the model's order below (the stream's puts vocab last)
    got = torch.cat([streamed[n].detach().double().reshape(-1) for n, _ in learner.engine.module.lm.named_parameters()])

    model = _qwen2(0).double()  # the same initial weights, in float64
    logp = _naive_logp(model, batch)
    old, ref_lp = batch.old_logp.double(), _naive_logp(models["other"].double(), batch).detach()
    adv, mask = batch.advantages.double()[:, None], batch.loss_mask.double()
    rho = torch.exp(logp - old)
    pg = torch.maximum(-adv * rho, -adv * rho.clamp(0.8, 1.28))
    d = ref_lp - logp
    k3 = torch.exp(d) - d - 1
    params = list(model.parameters())
    pg_grads = torch.autograd.grad((pg * mask).sum() / mask.sum(), params, retain_graph=True)
    kl_grads = torch.autograd.grad((beta * k3 * mask).sum() / mask.sum(), params)
    want = torch.cat([(p.detach() - a - b).reshape(-1) for p, a, b in zip(params, pg_grads, kl_grads, strict=True)])
    kl_step = torch.cat([g.reshape(-1) for g in kl_grads])

    assert kl_step.abs().max() > 1e-2  # the KL term moves the weights: a learner without it would fail below
    # float32 against float64: half a unit of storage of each new weight, and the gradient's float32 sum over the loss
    # tokens (n_tokens x eps x the step's scale); a step without the KL term is off by kl_step, 1e-2 and more
    n_tokens = int(mask.sum())
    step = (want - torch.cat([p.detach().reshape(-1) for p in params])).abs().max()
    assert (got - want).abs().max() < EPS32 * (want.abs().max() + n_tokens * step)
    kl_mean = float((k3.detach() * mask).sum() / mask.sum())
    assert metrics[M.KL_REF] == pytest.approx(kl_mean, rel=1e-4) and kl_mean > 1e-3
    assert metrics[M.CLIPFRAC_LOW] > 0 and metrics[M.CLIPFRAC_HIGH] > 0


def test_the_reference_is_partitioned_at_zero3_and_gives_the_same_logprobs_on_two_ranks(models):
    """ZeRO-3 over 2 ranks: each rank stores about half of the reference's parameters and computes its shard of the
    batch (split by tokens), and both get every row's log-probs, the model's own."""
    tmp = models["tmp"]
    batch = _batch(seed=5)
    torch.save(batch, tmp / "batch.pt")
    out = tmp / "z3"
    out.mkdir(exist_ok=True)
    port = free_port()
    worker = Path(__file__).with_name("_reference_worker.py")
    # each rank logs to a file: with pipes read one after the other, a rank that filled its pipe would block, and
    # the other with it inside a collective
    procs, logs = [], [out / f"rank{rank}.log" for rank in range(2)]
    for rank, log in enumerate(logs):
        env = rank_env(rank, 2, port)
        cmd = [sys.executable, str(worker), str(models["policy_dir"]), str(tmp / "batch.pt"), str(out)]
        with log.open("w") as sink:
            procs.append(subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT))
    for p in procs:
        p.wait(timeout=600)
    assert all(p.returncode == 0 for p in procs), "\n".join(log.read_text()[-3000:] for log in logs)

    parts = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    with torch.no_grad():
        exact = _naive_logp(models["policy"], batch)
    rows = sorted(i for part in parts for i in part["rows"])
    assert rows == list(range(len(batch)))  # the shards partition the batch
    for part in parts:
        assert part["rows"] and (part["logp"].double() - exact).abs().max() < logp_tol(exact)
        assert part["local_numel"] <= 0.55 * part["full_numel"]  # about half each (partitions are padded)


@pytest.mark.slow
def test_dapo_train_with_a_kl_term_runs_and_logs_it(tmp_path, small_world):
    """`dapo train` with algorithm.kl_coef > 0 on a small tiny world (built here, 20 supervised steps): the run
    finishes and logs actor/kl_ref at every step, 0 at the first update (policy = reference) and positive once
    the policy has moved."""
    from mlflow.tracking import MlflowClient

    world = small_world
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    argv = [
        "--config",
        str(REPO / "configs" / "ablations" / "00_naive_grpo.yaml"),
        "--preset",
        "tiny",
        f"tiny.dir={world}",
        "tiny.sft_steps=20",
        "tiny.n_train=64",
        "tiny.n_eval=4",
        "trainer.total_steps=3",
        "trainer.train_batch_size=2",
        "trainer.mini_batch_size=1",
        "trainer.checkpoint_every=0",
        "rollout.n=4",
        "rollout.max_response_length=24",
        "rollout.engine=hf",
        "algorithm.overlong_buffer_len=8",
        # the soft penalty's rewards differ by length inside a group, so the policy moves even if every answer is
        # wrong (the weak 20-step base model's usual case), and the KL to the reference grows from 0
        "algorithm.overlong_penalty=true",
        "algorithm.kl_coef=0.1",
        "trainer.packing=none",  # the padded layout end to end (the reference's passes too)
        "data.eval=tiny",
        "eval.every=0",
        "eval.n=2",
        "eval.pass_k=[1,2]",
        "eval.bootstrap=10",
        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
        "tracking.experiment=kl",
        "--run-dir",
        str(run_dir),
        "--progress",
        "log",
    ]
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false"
    )
    p = subprocess.run(
        [sys.executable, "-m", "dapo.cli", "train", *argv], env=env, capture_output=True, text=True, timeout=1200
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    done = json.loads((run_dir / "DONE.json").read_text())
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    kl = {m.step: m.value for m in client.get_metric_history(done["run_id"], M.KL_REF)}
    assert sorted(kl) == [1, 2, 3]
    assert all(v >= 0 for v in kl.values()) and kl[3] > kl[1] > 0  # the policy moves away from the reference
    # padded, the learner computes padding (the same shape packed logs at most 2%: tests/test_trainer_e2e.py)
    padded = [m.value for m in client.get_metric_history(done["run_id"], M.LEARNER_FORWARD_PADDED_FRACTION)]
    assert len(padded) == 3 and min(padded) > 0.02
