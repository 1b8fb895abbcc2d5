"""The learner: micro-batching, schedule, launcher env, and above all that one update's gradient does not depend on
how the mini-batch is split (1 or 4+ micro-batches, 1 or 2 data-parallel ranks) and equals the loss of
docs/algorithm.md computed naively on the whole mini-batch, for every aggregation mode (a pitfall of
docs/algorithm.md section 8).

The DeepSpeed cases run twice through tests/_learner_worker.py: in this process (world size 1) and in one
2-process gloo launch, each running every case and returning the gathered parameters after one SGD step (lr 1,
so the step *is* the gradient, to 1e-6 in float32).
"""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _env import free_port, rank_env
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo import metric_names as M
from dapo.algos.aggregation import MODES, aggregate
from dapo.algos.metrics import RARE_TOKEN_PROB
from dapo.algos.policy_loss import clipped_surrogate, covariance_selection, per_token_loss
from dapo.distributed import first_slurm_host, launcher_env
from dapo.learner import (
    UPDATE_SKIPPED,
    Learner,
    LossSpec,
    PolicyBatch,
    lr_at,
    plan_micro_batches,
    response_mask,
)
from dapo.learner.batch import collate, collate_packed, plan_packed_micro_batches, rank_loads, split_by_tokens

sys.path.insert(0, str(Path(__file__).parent))
import _learner_worker as W  # noqa: E402

TOL = 1e-6
# DeepSpeed calls torch.distributed collectives that torch 2.13 marks deprecated; nothing for us to act on.
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")


# ------------------------------------------------------------------------------------------------ pure parts
def test_micro_batches_respect_the_token_budget_and_cover_every_sequence():
    lengths = [5, 17, 3, 0, 9, 9, 12, 1, 30]
    plan = plan_micro_batches(lengths, token_budget=20)
    flat = sorted(i for mb in plan for i in mb)
    assert flat == [0, 1, 2, 4, 5, 6, 7, 8]  # the empty sequence (3) has nothing to compute
    for mb in plan:
        widest = max(lengths[i] for i in mb)
        assert len(mb) * widest <= 20 or len(mb) == 1  # 30 > budget: alone
        assert [lengths[i] for i in mb] == sorted((lengths[i] for i in mb), reverse=True)
    assert plan[0] == [8]  # longest first
    assert plan_micro_batches(lengths, 10**6) == [[8, 1, 6, 4, 5, 0, 2, 7]]


def _greedy_plan(lengths: list[int], budget: int) -> list[list[int]]:
    """Fill each micro-batch to the budget before opening the next (the fewest passes, not the least padding)."""
    out: list[list[int]] = []
    for i in sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (-lengths[i], i)):
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _padded(lengths: list[int], plan: list[list[int]]) -> int:
    return sum(len(mb) * max(lengths[i] for i in mb) for mb in plan)


def test_micro_batches_pad_less_than_filling_each_to_the_budget():
    """[20K, 6K | 3K, 1K] computes 46K tokens; [20K | 6K, 3K, 1K] 38K, in as many passes."""
    lengths = [20000, 6000, 3000, 1000]
    assert plan_micro_batches(lengths, 45056) == [[0], [1, 2, 3]]
    assert _padded(lengths, _greedy_plan(lengths, 45056)) == 46000 and _padded(lengths, [[0], [1, 2, 3]]) == 38000


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(0, 50), min_size=1, max_size=14), budget=st.integers(1, 200))
def test_micro_batches_are_as_few_as_filling_and_never_pad_more(lengths, budget):
    plan = plan_micro_batches(lengths, budget)
    greedy = _greedy_plan(lengths, budget)
    assert sorted(i for mb in plan for i in mb) == [i for i, n in enumerate(lengths) if n > 0]
    assert all(len(mb) == 1 or len(mb) * lengths[mb[0]] <= budget for mb in plan)
    assert len(plan) == len(greedy) and _padded(lengths, plan) <= _padded(lengths, greedy)


def test_collate_puts_each_target_at_the_position_that_predicts_it():
    mb = collate([[7, 8], [9]], [[1, 2, 3], [4]], rows=[0, 1])
    assert mb.input_ids.tolist() == [[7, 8, 1, 2], [9, 0, 0, 0]]  # last response token is never an input
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]
    assert mb.positions.tolist() == [1, 2, 3, 4]  # row 1 position 0 = flat 4
    assert mb.targets.tolist() == [1, 2, 3, 4]
    assert mb.token_rows.tolist() == [0, 0, 0, 1] and mb.token_cols.tolist() == [0, 1, 2, 0]


def test_packed_rows_share_the_prompt_and_keep_each_response_to_itself():
    prompts = [[7, 8], [7, 8], [9], [7, 8]]
    responses = [[1, 2, 3], [4], [5, 6], []]
    plan = plan_packed_micro_batches(prompts, responses, token_budget=100)
    assert plan == [[[0, 1], [2]]]  # one row per prompt; the empty response has nothing to compute
    mb = collate_packed(prompts, responses, plan[0])
    assert mb.input_ids.tolist() == [[7, 8, 1, 2], [9, 5, 0, 0]]  # the prompt once, then response[:-1] each
    assert mb.position_ids.tolist()[0] == [0, 1, 2, 3]
    # response 0's tokens at 0 <- prompt end (1), 1 <- its token 0 (2), 2 <- 3; response 1 (one token) <- 1
    assert mb.positions.tolist() == [1, 2, 3, 1, 4 + 0, 4 + 1]
    assert mb.targets.tolist() == [1, 2, 3, 4, 5, 6]
    assert mb.token_rows.tolist() == [0, 0, 0, 1, 2, 2] and mb.token_cols.tolist() == [0, 1, 2, 0, 0, 1]
    m = mb.attention_mask[:, 0].int().tolist()
    assert m[0] == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert m[1] == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]  # padding sees itself only
    # Two responses of one prompt: the second one does not see the first, and restarts at the prompt's end.
    two = collate_packed([[7, 8]] * 2, [[1, 2, 3], [4, 5]], [[0, 1]])
    assert two.position_ids.tolist() == [[0, 1, 2, 3, 2]]
    assert two.attention_mask[0, 0, 4].int().tolist() == [1, 1, 0, 0, 1]
    # Over the budget: the group is cut into rows that each repeat the prompt.
    cut = plan_packed_micro_batches([[7, 8]] * 3, [[1] * 6, [2] * 6, [3] * 6], token_budget=12)
    assert sorted(i for mb in cut for row in mb for i in row) == [0, 1, 2]
    assert all(len(row) <= 2 for mb in cut for row in mb)


def test_packing_refuses_an_attention_that_ignores_the_block_mask():
    from types import SimpleNamespace

    from dapo.learner.model import check_packable

    check_packable(SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa")))
    with pytest.raises(ValueError, match="pack_prompts: false"):
        check_packable(SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2")))


def test_lr_warms_up_linearly_over_rollout_steps_then_stays_constant():
    assert [lr_at(s, 1e-6, 4) for s in range(6)] == pytest.approx([0.25e-6, 0.5e-6, 0.75e-6, 1e-6, 1e-6, 1e-6])
    assert lr_at(0, 3e-4, 0) == 3e-4


def test_launcher_env_from_torchrun_slurm_or_nothing():
    assert launcher_env({}) is None
    tr = launcher_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert (tr["RANK"], tr["WORLD_SIZE"], tr["LOCAL_RANK"], tr["MASTER_ADDR"]) == ("3", "8", "1", "h")
    sl = launcher_env(
        {
            "SLURM_PROCID": "5",
            "SLURM_NTASKS": "16",
            "SLURM_LOCALID": "5",
            "SLURM_JOB_NODELIST": "gpu-[003-004,010],cpu1",
        }
    )
    assert (sl["RANK"], sl["WORLD_SIZE"], sl["LOCAL_RANK"], sl["MASTER_ADDR"]) == ("5", "16", "5", "gpu-003")
    # two SLURM jobs on one node must not rendezvous on the same port
    ports = {
        launcher_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": j})["MASTER_PORT"]
        for j in ("101", "102")
    }
    assert len(ports) == 2 and all(20000 <= int(p) < 40000 for p in ports)
    assert first_slurm_host("nodeA,nodeB") == "nodeA" and first_slurm_host("n[7-9]") == "n7"


def _costs(prompts, responses):
    return [len(p) + len(r) - 1 if r else 0 for p, r in zip(prompts, responses, strict=True)]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 60)), min_size=1, max_size=9),
    world=st.integers(1, 4),
    pack=st.booleans(),
)
def test_split_by_tokens_covers_every_row_once_within_its_bounds(lengths, world, pack):
    """Every row on exactly one rank, rows ascending, the same split when asked again; the busiest rank within
    mean + longest sequence, and (unpacked) within 4/3 of the best split found by brute force."""
    prompts = [[7] * p for p, _ in lengths]  # equal lengths share a prompt: the packing case
    responses = [[1] * r for _, r in lengths]
    split = split_by_tokens(prompts, responses, world, pack_prompts=pack)
    assert len(split) == world and sorted(i for rows in split for i in rows) == list(range(len(lengths)))
    assert all(rows == sorted(rows) for rows in split)
    assert split == split_by_tokens(prompts, responses, world, pack_prompts=pack)
    cost = _costs(prompts, responses)
    loads = rank_loads(prompts, responses, split, pack_prompts=pack)
    assert max(loads) <= sum(cost) / world + max(cost)
    if not pack and len(lengths) <= 7:
        best = min(
            max(sum(c for c, k in zip(cost, owner, strict=True) if k == r) for r in range(world))
            for owner in itertools.product(range(world), repeat=len(cost))
        )
        assert max(loads) <= (4 / 3 - 1 / (3 * world)) * best + 1e-9


def test_split_by_tokens_balances_where_whole_groups_cannot():
    """Two groups of four over four ranks: whole groups leave two ranks idle; by sequence every rank gets one
    long and one short response, at the mean exactly."""
    prompts = [[5, 5]] * 4 + [[6, 6]] * 4
    responses = [[1] * n for n in (30, 10, 30, 10, 30, 10, 30, 10)]
    split = split_by_tokens(prompts, responses, 4)
    assert rank_loads(prompts, responses, split) == [sum(_costs(prompts, responses)) // 4] * 4
    batch = PolicyBatch(prompts, responses, torch.zeros(8), response_mask(responses), torch.tensor([0] * 4 + [1] * 4))
    shards = [batch.shard_rows(r, 4) for r in range(4)]
    assert [len(s) for s in shards] == [2, 2, 2, 2]
    assert shards[3] == split[3] and batch.shard_rows(0, 1) == list(range(8))
    with pytest.raises(ValueError, match="rank 4 is outside a world of size 4"):
        batch.shard_rows(4, 4)


def test_packed_split_keeps_a_group_on_one_rank_when_its_prompt_dominates():
    """Long prompts, short responses (the tiny preset's shape): a split group would compute its prompt twice,
    so with pack_prompts each group stays whole and the ranks' packed loads are equal."""
    prompts = [[5] * 100] * 4 + [[6] * 100] * 4
    responses = [[1] * 9] * 8
    split = split_by_tokens(prompts, responses, 2, pack_prompts=True)
    assert sorted(split) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert rank_loads(prompts, responses, split, pack_prompts=True) == [100 + 4 * 8] * 2


# ---------------------------------------------------------------------------------------- the tiny world
def make_batch(seed: int = 4) -> PolicyBatch:
    """4 groups of 3 responses, unequal lengths; one overlong-filtered response and one group filtered whole.
    Seed 4: split over 2 ranks by tokens, with and without pack_prompts, some group has responses on both."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses, groups = [], [], []
    for gid, plen in enumerate([3, 6, 2, 5]):
        prompt = torch.randint(1, 100, (plen,), generator=g).tolist()
        for _ in range(3):
            rlen = int(torch.randint(1, 13, (1,), generator=g))
            prompts.append(prompt)
            responses.append(torch.randint(1, 100, (rlen,), generator=g).tolist())
            groups.append(gid)
    mask = response_mask(responses, width=14)
    mask[1] = 0  # overlong-filtered response
    mask[9:12] = 0  # a group whose responses were all truncated: it counts nowhere
    adv = torch.randn(len(prompts), generator=g) * 2
    return PolicyBatch(prompts, responses, adv, mask, torch.tensor(groups))


def reference_logp(model: torch.nn.Module, batch: PolicyBatch, temperature: float) -> torch.Tensor:
    """Full logits of each sequence alone, / temperature, log_softmax: the definition."""
    out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
    for i, (p, r) in enumerate(zip(batch.prompt_ids, batch.response_ids, strict=True)):
        logits = model(torch.tensor([p + r])).logits[0] / temperature
        lp = torch.log_softmax(logits.float(), -1)[len(p) - 1 : len(p) - 1 + len(r)]
        out[i, : len(r)] = lp.gather(-1, torch.tensor(r)[:, None])[:, 0]
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Runs every DeepSpeed case at world size 2 (subprocesses) and 1 (here); returns what the tests need."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tmp = tmp_path_factory.mktemp("learner")
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(cfg).float()
    model_dir = tmp / "model"
    model.save_pretrained(model_dir)
    (model_dir / "tokenizer.json").write_text("{}")  # save_hf copies tokenizer files beside the weights

    batch = make_batch()
    with torch.no_grad():
        current = reference_logp(model, batch, temperature=W.loss_spec("token-mean").temperature)
    # Old log-probs away from the current policy, so both clip bounds and the dual clip bind somewhere.
    noise = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(1)) * 0.4
    batch.old_logp = (current + noise) * response_mask(batch.response_ids, width=14)
    torch.save(batch, tmp / "batch.pt")

    port = free_port()
    (tmp / "w2").mkdir()
    procs = []
    for rank in range(2):
        env = rank_env(rank, 2, port)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(Path(W.__file__)),
                    str(model_dir),
                    str(tmp / "batch.pt"),
                    str(tmp / "w2.pt"),
                    str(tmp / "w2"),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        (tmp / "w1").mkdir()
        w1 = W.run_cases(str(model_dir), batch, tmp / "w1")
    finally:
        torch.set_num_threads(threads)
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-4000:] for log in logs)
    w2 = torch.load(tmp / "w2.pt", weights_only=False)
    return {"w1": w1, "w2": w2, "model": model, "model_dir": model_dir, "batch": batch, "tmp": tmp}


def reference_step(model, batch: PolicyBatch, mode: str, clip: float | None = None):
    """The loss of docs/algorithm.md on the whole mini-batch, one SGD step with lr 1 (optionally norm-clipped like
    DeepSpeed)."""
    spec = W.loss_spec(mode)
    model.zero_grad()
    logp = reference_logp(model, batch, spec.temperature)
    out = clipped_surrogate(logp, batch.old_logp, batch.advantages, spec.eps_low, spec.eps_high, spec.dual_clip_c)
    loss = aggregate(out.loss, batch.loss_mask, mode, batch.group_ids, seq_sum_constant=spec.seq_token_sum_constant)
    loss.backward()
    grads = [p.grad.double() for _, p in model.named_parameters()]
    norm = float(torch.sqrt(sum((g**2).sum() for g in grads)))
    coef = min(1.0, clip / (norm + 1e-6)) if clip else 1.0
    params = torch.cat(
        [
            (p.detach().double() - W.SGD_LR * coef * g).reshape(-1)
            for (_, p), g in zip(model.named_parameters(), grads, strict=True)
        ]
    )
    model.zero_grad()
    return params, float(loss.detach()), norm, out


@pytest.mark.parametrize("mode", MODES)
def test_one_update_equals_the_naive_whole_batch_step(world, mode):
    ref, ref_loss, ref_norm, out = reference_step(world["model"], world["batch"], mode)
    got = world["w1"][f"z2/{mode}/{W.BIG_BUDGET}"]
    init = world["w1"]["z2/init"]["params"]
    assert (ref - init).abs().max() > 1e-2  # the step is large enough to tell modes apart
    assert (got["params"] - ref).abs().max() < TOL
    m = got["metrics"]
    mask = world["batch"].loss_mask
    on = mask > 0
    low, high = (float((f & on).sum()) / float(on.sum()) for f in (out.clipped_lower, out.clipped_upper))
    assert m[M.POLICY_LOSS] == pytest.approx(ref_loss, abs=1e-6)
    assert m[M.GRAD_NORM] == pytest.approx(ref_norm, rel=1e-5)
    assert (m[M.CLIPFRAC_LOW], m[M.CLIPFRAC_HIGH]) == pytest.approx((low, high), abs=1e-9)
    assert 0 < low and 0 < high  # both bounds bind in this batch
    up = out.clipped_upper & (mask > 0)
    assert m[M.CLIP_HIGH_PROB] == pytest.approx(float(world["batch"].old_logp.exp()[up].mean()), abs=1e-6)
    assert m[M.DUAL_CLIPFRAC] > 0 and m[UPDATE_SKIPPED] == 0.0 and m[M.LR] == W.SGD_LR
    # of the rare tokens (old probability < RARE_TOKEN_PROB) with positive advantage, the share clipped above
    b = world["batch"]
    rare = (mask > 0) & (b.old_logp.exp() < RARE_TOKEN_PROB) & (b.advantages[:, None] > 0)
    assert rare.sum() > 0 and (out.clipped_upper & rare).sum() > 0  # the case occurs in this batch
    assert m[M.CLIPFRAC_HIGH_RARE] == pytest.approx(float((out.clipped_upper & rare).sum() / rare.sum()), abs=1e-9)


@pytest.mark.parametrize("mode", MODES)
def test_update_does_not_depend_on_micro_batches_ranks_or_packing(world, mode):
    """Packed (`pack_prompts`: each group's responses behind one copy of the prompt) is the same step too."""
    ref = world["w1"][f"z2/{mode}/{W.BIG_BUDGET}"]
    assert world["w1"][f"z2/{mode}/{W.SMALL_BUDGET}"]["micro_batches"] == 4
    assert world["w1"][f"z2/{mode}/packed/{W.SMALL_BUDGET}"]["micro_batches"] > 1
    for w in ("w1", "w2"):
        for case in (W.BIG_BUDGET, W.SMALL_BUDGET, f"packed/{W.BIG_BUDGET}", f"packed/{W.SMALL_BUDGET}"):
            got = world[w][f"z2/{mode}/{case}"]
            assert (got["params"] - ref["params"]).abs().max() < TOL, (w, case)
            assert got["metrics"][M.POLICY_LOSS] == pytest.approx(ref["metrics"][M.POLICY_LOSS], abs=1e-6)
            assert got["metrics"][M.CLIPFRAC_HIGH] == pytest.approx(ref["metrics"][M.CLIPFRAC_HIGH], abs=1e-9)
            assert got["metrics"][M.CLIPFRAC_HIGH_RARE] == pytest.approx(ref["metrics"][M.CLIPFRAC_HIGH_RARE], abs=1e-9)


def policy_loss_step(model, batch: PolicyBatch, name: str, is_weights: torch.Tensor | None = None):
    """The named policy loss (dapo.algos.policy_loss) on the whole mini-batch, from the definitions, one SGD step
    with lr 1: the covariance rules select over the whole batch from the current log-probs."""
    mode = W.POLICY_LOSS_CASES.get(name, "token-mean")
    spec = W.loss_spec(mode, name)
    model.zero_grad()
    logp = reference_logp(model, batch, spec.temperature)
    selected = None
    if name in ("clip_cov", "kl_cov"):
        selected = covariance_selection(
            name,
            logp.detach(),
            batch.old_logp,
            batch.advantages,
            batch.loss_mask,
            torch.arange(len(batch)),
            W.SALT,
            ratio=spec.clip_cov_ratio if name == "clip_cov" else spec.kl_cov_ratio,
            eps_low=spec.eps_low,
            eps_high=spec.eps_high,
            dual_clip_c=spec.dual_clip_c,
            lb=spec.clip_cov_lb,
            ub=spec.clip_cov_ub,
        )
    out = per_token_loss(
        name,
        logp,
        batch.old_logp,
        batch.advantages,
        batch.loss_mask,
        eps_low=spec.eps_low,
        eps_high=spec.eps_high,
        dual_clip_c=spec.dual_clip_c,
        cispo_clip_max=spec.cispo_clip_max,
        kl_cov_coef=spec.kl_cov_coef,
        selected=selected,
    )
    per_token = out.loss if is_weights is None else out.loss * is_weights
    loss = aggregate(per_token, batch.loss_mask, mode, batch.group_ids, seq_sum_constant=spec.seq_token_sum_constant)
    loss.backward()
    params = torch.cat([(p.detach().double() - W.SGD_LR * p.grad.double()).reshape(-1) for p in model.parameters()])
    model.zero_grad()
    return params, float(loss.detach()), out


@pytest.mark.parametrize("name", list(W.POLICY_LOSS_CASES))
def test_each_policy_loss_is_its_definition_in_any_split(world, name):
    """GSPO, CISPO, Clip-Cov and KL-Cov through the learner: the whole-batch step of their definitions, the same on
    1 and 2 ranks, in 1 or 4 micro-batches, packed or not (GSPO's ratio needs whole responses; the covariance rules
    the whole mini-batch's means and k-th token), with each loss's own metric over the whole mini-batch."""
    ref, ref_loss, out = policy_loss_step(world["model"], world["batch"], name)
    init = world["w1"]["z2/init"]["params"]
    assert (ref - init).abs().max() > 1e-2
    first = world["w1"][f"z2/{name}/{W.BIG_BUDGET}"]
    assert first["metrics"][M.POLICY_LOSS] == pytest.approx(ref_loss, abs=1e-6)
    m = world["batch"].loss_mask > 0
    if name == "gspo":  # responses with a clipped sequence ratio, of those with a loss token
        own = (M.SEQ_CLIPFRAC_HIGH, float((out.clipped_upper & m).any(-1).sum()) / float(m.any(-1).sum()))
    else:
        flag = out.capped if name == "cispo" else out.selected
        own = (
            M.CISPO_CAPPED_FRAC if name == "cispo" else M.COV_SELECTED_FRAC,
            float((flag & m).sum()) / float(m.sum()),
        )
    assert own[1] > 0  # the loss's own mechanism acts on this batch
    for w in ("w1", "w2"):
        for case in (W.BIG_BUDGET, W.SMALL_BUDGET, f"packed/{W.BIG_BUDGET}", f"packed/{W.SMALL_BUDGET}"):
            got = world[w][f"z2/{name}/{case}"]
            assert (got["params"] - ref).abs().max() < TOL, (w, case)
            assert got["metrics"][M.POLICY_LOSS] == pytest.approx(ref_loss, abs=1e-6), (w, case)
            assert got["metrics"][own[0]] == pytest.approx(own[1], abs=1e-9), (w, case)


def test_rollout_correction_weights_are_exact_in_any_split(world):
    """The rollout correction's weights (made on whole responses) multiply each token's clipped loss: the learner's
    step is that definition's, on 1 or 2 ranks and in 1 or 4 micro-batches."""
    batch = world["batch"]
    w = W.is_weights(batch)
    ref, ref_loss, _ = policy_loss_step(world["model"], batch, "ppo_clip", is_weights=w)
    unweighted = world["w1"][f"z2/token-mean/{W.BIG_BUDGET}"]["params"]
    assert (ref - unweighted).abs().max() > 1e-3  # the weights change the step
    for wname in ("w1", "w2"):
        for budget in (W.BIG_BUDGET, W.SMALL_BUDGET):
            got = world[wname][f"z2/is_weights/{budget}"]
            assert (got["params"] - ref).abs().max() < TOL, (wname, budget)
            assert got["metrics"][M.POLICY_LOSS] == pytest.approx(ref_loss, abs=1e-6)


def test_the_test_batch_has_groups_split_across_ranks():
    """What makes the world-size-2 cases exact only with the per-group counts summed over ranks."""
    batch = make_batch()
    for pack in (False, True):
        owners: dict[int, set[int]] = {}
        for rank in range(2):
            for g in batch.group_ids[batch.shard_rows(rank, 2, pack_prompts=pack)].tolist():
                owners.setdefault(g, set()).add(rank)
        live = {int(g) for g, n in zip(batch.group_ids, batch.loss_mask.sum(1), strict=True) if n > 0}
        assert any(len(owners[g]) == 2 for g in live), pack


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("engine", ["z3", "z0"])
def test_zero3_and_zero0_with_gradient_clipping_match_the_clipped_reference(world, engine, mode):
    ref, _, ref_norm, _ = reference_step(world["model"], world["batch"], mode, clip=W.CLIP)
    if mode == "token-mean":
        assert ref_norm > 2 * W.CLIP  # the clip binds
    for w in ("w1", "w2"):
        for case in (f"{W.SMALL_BUDGET}", f"packed/{W.SMALL_BUDGET}"):
            got = world[w][f"{engine}/{mode}/{case}"]
            assert got["params"].shape == ref.shape  # gathered to full size under ZeRO-3
            assert (got["params"] - ref).abs().max() < TOL, (w, case)
            assert got["metrics"][M.GRAD_NORM] == pytest.approx(ref_norm, rel=1e-5)


def test_a_zero3_learner_leaves_later_model_loads_in_the_process_whole(world):
    """ZeRO-3 loads the policy partitioned (zero.Init, through transformers and accelerate). A model loaded after
    it in the same process, the HF rollout engine's, must be whole: while transformers' process-wide ZeRO-3 flag
    stayed set, it was partitioned too and its first forward failed ("'weight' must be 2-D", found on a GPU)."""
    import accelerate  # noqa: F401  (a dependency: without it ZeRO-3 loads whole and this checks nothing)
    from transformers import AutoModelForCausalLM
    from transformers.integrations import is_deepspeed_zero3_enabled

    learner = Learner(str(world["model_dir"]), loss=LossSpec(), lr=1e-3, zero_stage=3, dtype="float32")
    assert hasattr(next(learner.engine.module.parameters()), "ds_id")  # partitioned
    assert not is_deepspeed_zero3_enabled()
    later = AutoModelForCausalLM.from_pretrained(world["model_dir"])
    assert later.get_input_embeddings().weight.shape == world["model"].get_input_embeddings().weight.shape
    assert torch.equal(later.get_input_embeddings().weight, world["model"].get_input_embeddings().weight)


@pytest.mark.parametrize("case", ["z2/nan", "z0/nan"])
def test_a_non_finite_loss_on_one_rank_skips_the_step_everywhere(world, case):
    """A NaN advantage on one response (held by the last rank at world size 2): no rank steps."""
    engine = case.split("/")[0]
    for w in ("w1", "w2"):
        got = world[w][case]
        assert got["metrics"][UPDATE_SKIPPED] == 1.0
        assert torch.equal(got["params"], world[w][f"{engine}/init"]["params"])


def test_after_a_skipped_step_the_next_update_is_the_ordinary_one(world):
    ordinary = world["w1"][f"z2/token-mean/{W.SMALL_BUDGET}"]["params"]
    for w in ("w1", "w2"):
        after = world[w]["z2/after_nan"]
        assert after["metrics"][UPDATE_SKIPPED] == 0.0
        assert (after["params"] - ordinary).abs().max() < TOL


# ---------------------------------------------------------------------- single-process learner behaviour
def _zero2_adamw(model_dir) -> Learner:
    """A ZeRO-2 AdamW learner with warm-up, in this process (world size 1)."""
    return Learner(
        str(model_dir),
        loss=W.loss_spec("token-mean"),
        lr=1e-3,
        warmup_steps=3,
        weight_decay=0.1,
        grad_clip=1.0,
        zero_stage=2,
        dtype="float32",
        micro_batch_tokens=W.SMALL_BUDGET,
        logprob_chunk_size=5,
    )


@pytest.fixture(scope="module")
def adamw(world):
    return _zero2_adamw(world["model_dir"])


def test_compute_logprobs_matches_full_logits_at_the_sampling_temperature(world, adamw):
    batch = world["batch"]
    with torch.no_grad():
        ref = reference_logp(world["model"], batch, temperature=0.7)
    logp, entropy = adamw.compute_logprobs(batch)
    valid = response_mask(batch.response_ids, width=14).bool()
    assert (logp - ref).abs().max() < 1e-5
    assert bool((logp[~valid] == 0).all()) and bool((entropy[valid] > 0).all())
    assert float(entropy[valid].max()) <= math.log(101) + 1e-5  # at most the uniform distribution's


def test_checkpoint_round_trip_is_exact_and_restores_the_schedule(world, adamw, tmp_path):
    batch = world["batch"]
    fresh = batch.select(list(range(len(batch))))
    fresh.old_logp, _ = adamw.compute_logprobs(batch)
    first = adamw.update(fresh)
    assert first[M.APPROX_KL] == pytest.approx(0.0, abs=1e-9) and first[M.CLIPFRAC_HIGH] == 0.0  # ratio 1
    assert first[M.LR] == pytest.approx(1e-3 / 3)
    assert adamw.schedule(1) == pytest.approx(2e-3 / 3)
    adamw.save_checkpoint(tmp_path / "ck")
    second = adamw.update(batch)
    after = W.flat_params(adamw)

    other = _zero2_adamw(world["model_dir"])  # a second learner, same settings
    other.load_checkpoint(tmp_path / "ck")
    assert other.lr == pytest.approx(2e-3 / 3) and other.engine.get_lr() == [pytest.approx(2e-3 / 3)]
    again = other.update(batch)  # same Adam moments and step count, so bit-identical
    assert torch.equal(W.flat_params(other), after)
    assert again[M.GRAD_NORM] == second[M.GRAD_NORM]


def test_save_hf_writes_a_model_transformers_loads(world, adamw, tmp_path):
    from transformers import AutoModelForCausalLM

    adamw.save_hf(tmp_path / "hf")
    loaded = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "hf").named_parameters())
    ours = dict(adamw.named_parameters_for_sync())
    assert ours.keys() == loaded.keys()
    # in vLLM's loading order: layer by layer, the vocabulary last (tests/test_rollout.py shows why)
    names = list(ours)
    assert names[0].startswith("model.layers.0.") and names[-1] in ("model.embed_tokens.weight", "lm_head.weight")
    assert all(torch.equal(loaded[k], ours[k]) for k in ours)
    assert (tmp_path / "hf" / "tokenizer.json").is_file()


def test_the_final_save_at_zero3_gathers_on_rank_0_only_and_writes_the_learners_weights(world):
    """At ZeRO-3 no rank holds the model; the final save gathers it a parameter at a time onto rank 0 alone (a
    32B node of 8 ranks would otherwise hold eight 65 GB host copies), and what rank 0 writes is the learner's."""
    from transformers import AutoModelForCausalLM

    n_params = len(list(world["model"].named_parameters()))
    for w, held in (("w1", [n_params]), ("w2", [n_params, 0])):
        got = world[w]["z3/save"]
        assert got["tensors_held_per_rank"] == held
        loaded = AutoModelForCausalLM.from_pretrained(got["hf_dir"])
        written = torch.cat([t.detach().double().reshape(-1) for _, t in loaded.named_parameters()])
        assert torch.equal(written, got["params"])
        assert not torch.equal(written, world[w]["z3/init"]["params"])  # the trained weights, not the input's


def test_update_needs_old_logprobs(world, adamw):
    batch = world["batch"].select([0, 1])
    batch.old_logp = None
    with pytest.raises(ValueError, match="old_logp"):
        adamw.update(batch)


def test_loss_spec_defaults_are_naive_grpo():
    spec = LossSpec()
    assert (spec.eps_low, spec.eps_high, spec.loss_agg, spec.dual_clip_c, spec.kl_coef) == (
        0.2,
        0.2,
        "seq-mean-token-mean",
        None,
        0.0,
    )


def test_kl_to_a_reference_policy_is_reported_and_needs_ref_logprobs(world, adamw):
    batch = world["batch"].select(list(range(len(world["batch"]))))
    adamw.loss = LossSpec(kl_coef=0.1, loss_agg="token-mean", temperature=0.7)
    try:
        with pytest.raises(ValueError, match="ref_logp"):
            adamw.update(batch)
        batch.ref_logp = batch.old_logp
        now, _ = adamw.compute_logprobs(batch)  # the weights the update's forward sees
        d = (batch.ref_logp - now).double()
        mask = batch.loss_mask.bool()
        expected = float((torch.exp(d) - d - 1)[mask].mean())  # k3 of KL(pi_theta || pi_ref), token mean
        metrics = adamw.update(batch)
        assert metrics[M.KL_REF] == pytest.approx(expected, rel=1e-4) and expected > 1e-4
    finally:
        adamw.loss = W.loss_spec("token-mean")
