"""The learner: schedule, launcher env, and above all that one update's gradient does not depend on how the
mini-batch is split or laid out (1 or 4+ micro-batches, 1 or 2 data-parallel ranks, padded or packed, ZeRO 0, 2 or 3,
gradient checkpointing or not) and equals the loss of docs/algorithm.md computed naively on the whole mini-batch,
for every aggregation mode and policy loss (a pitfall of docs/algorithm.md section 8). How batches become
micro-batches is tests/test_learner_batch.py's.

The DeepSpeed cases run twice through tests/_learner_worker.py: in this process (world size 1) and in one
2-process gloo launch, each running every case and returning the gathered parameters after one SGD step (lr 1,
so the step *is* the gradient).

Tolerances: float32 rounding, sized by the computation compared, never by what one machine gave (`world` computes
them; each says why). The two sides of a comparison run the same arithmetic in different orders (another split,
another layout, the reference's full-logit forward), so they differ by rounding; the a-priori bound for reordering
a float32 sum of n terms is about n x eps x the terms' scale.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from _env import free_port, rank_env

from dapo import metric_names as M
from dapo.algos.aggregation import MODES, aggregate
from dapo.algos.metrics import RARE_TOKEN_PROB
from dapo.algos.policy_loss import clipped_surrogate, covariance_selection, per_token_loss
from dapo.learner import UPDATE_SKIPPED, Learner, LossSpec, PolicyBatch, lr_at, response_mask
from dapo.packing import learner_tokens

sys.path.insert(0, str(Path(__file__).parent))
import _learner_worker as W  # noqa: E402

EPS32 = torch.finfo(torch.float32).eps  # 2^-23, float32's spacing at 1


def step_tol(ref: torch.Tensor, init: torch.Tensor, n_tokens: int) -> float:
    """How far two float32 computations of one SGD step at lr 1 (p' = p - g) may differ: half a unit of float32 storage
    of p' on each side (eps x |p'|), plus each side's gradient, a float32 sum over the `n_tokens` loss tokens taken
    in another order (n_tokens x eps x the step's scale, each side)."""
    return float(EPS32 * (2 * ref.abs().max() + 2 * n_tokens * (ref - init).abs().max()))


def loss_tol(per_token: torch.Tensor, weights: torch.Tensor) -> float:
    """How far two float32 computations of the mini-batch loss, sum_t w_t l_t over the loss tokens, may differ when
    they sum in another order (micro-batches, ranks, float64 partial sums): 16 x eps x sum_t |w_t l_t| (the a-priori
    bound of a reordered sum with depth to spare)."""
    return float(16 * EPS32 * (weights.double() * per_token.detach().double()).abs().sum())


# DeepSpeed calls torch.distributed collectives that torch 2.13 marks deprecated; nothing for us to act on.
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")


# ------------------------------------------------------------------------------------------------ pure parts
def test_lr_warms_up_linearly_over_rollout_steps_then_stays_constant():
    assert [lr_at(s, 1e-6, 4) for s in range(6)] == pytest.approx([0.25e-6, 0.5e-6, 0.75e-6, 1e-6, 1e-6, 1e-6])
    assert lr_at(0, 3e-4, 0) == 3e-4


# ---------------------------------------------------------------------------------------- the tiny world
def make_batch(seed: int = 4) -> PolicyBatch:
    """4 groups of 3 responses, unequal lengths; one overlong-filtered response and one group filtered whole.
    Seed 4: split over 2 ranks by tokens, with and without shared prompts, some group has responses on both."""
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
    # the engine's log-probs (the off-policy sequence mask reads them): the old ones with an engine's own noise
    engine_noise = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(2)) * 0.3
    batch.engine_logp = (batch.old_logp + engine_noise) * response_mask(batch.response_ids, width=14)
    torch.save(batch, tmp / "batch.pt")

    port = free_port()
    (tmp / "w2").mkdir()
    procs, logs = [], [tmp / f"w2_rank{rank}.log" for rank in range(2)]
    for rank, log in enumerate(logs):
        # to a file, not a pipe: nothing reads a pipe until this process's own cases are done, and a worker that
        # filled one would wait for it
        with log.open("w") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(Path(W.__file__)), str(model_dir), *(str(tmp / f) for f in W.WORKER_FILES)],
                    env=rank_env(rank, 2, port),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        (tmp / "w1").mkdir()
        w1 = W.run_cases(str(model_dir), batch, tmp / "w1")
    finally:
        torch.set_num_threads(threads)
    for p in procs:
        p.wait(timeout=600)
    assert all(p.returncode == 0 for p in procs), "\n".join(log.read_text()[-4000:] for log in logs)
    w2 = torch.load(tmp / "w2.pt", weights_only=False)
    n_tokens = int(batch.loss_mask.sum())  # the longest float sum of the step: each weight's over the loss tokens
    return {
        "w1": w1,
        "w2": w2,
        "model": model,
        "model_dir": model_dir,
        "batch": batch,
        "tmp": tmp,
        "n_tokens": n_tokens,
        # the gradient norm: its entries carry the step's rounding (below, relative: 2 x n_tokens x eps), and DeepSpeed
        # sums their squares in float32 (pairwise: log2(n_params) roundings deep)
        "norm_rtol": 2 * (n_tokens + math.log2(w1["z2/init"]["params"].numel())) * EPS32,
        # a per-token log-prob or entropy, relative to the largest: its forward's longest dot product is the MLP's
        # (intermediate_size terms), then a log-sum-exp over the vocabulary
        "logp_rtol": (model.config.intermediate_size + model.config.vocab_size) * EPS32,
    }


def definition_step(model, batch: PolicyBatch, loss: str, clip: float | None = None):
    """One SGD step (lr 1) of the loss named `loss`, written from the definitions on the whole mini-batch: the
    clipped surrogate under an aggregation mode (`loss` in MODES), another policy loss with its aggregation
    (`W.POLICY_LOSS_CASES`; the covariance rules select over the whole batch from the current log-probs), or
    `is_weights` (the clipped surrogate, token-mean, times the rollout correction's weights); optionally
    norm-clipped as DeepSpeed clips."""
    name = loss if loss in W.POLICY_LOSS_CASES else "ppo_clip"
    mode = W.POLICY_LOSS_CASES.get(name, loss if loss in MODES else "token-mean")
    spec = W.loss_spec(mode, name)  # the off-policy mask is applied below, from its definition
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
    if name == "ppo_clip":  # the paper's surrogate, straight from its definition
        out = clipped_surrogate(logp, batch.old_logp, batch.advantages, spec.eps_low, spec.eps_high, spec.dual_clip_c)
    else:
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
            sapo_tau_pos=spec.sapo_tau_pos,
            sapo_tau_neg=spec.sapo_tau_neg,
            selected=selected,
        )
    per_token = out.loss * W.is_weights(batch) if loss == "is_weights" else out.loss
    if loss == "off_policy_mask":  # DeepSeek-V3.2, Eq. 9: drop A < 0 responses whose mean log(pi_sample / pi) > delta
        m = batch.loss_mask
        kl = ((batch.engine_logp - logp.detach()) * m).sum(-1) / m.sum(-1).clamp(min=1)
        dropped = (batch.advantages < 0) & (kl > W.OFF_POLICY_MASK)
        per_token = per_token * (~dropped).to(per_token.dtype)[:, None]
        out.selected = dropped[:, None].expand_as(m)  # what the learner's metric counts
    value = aggregate(per_token, batch.loss_mask, mode, batch.group_ids, seq_sum_constant=spec.seq_token_sum_constant)
    # each token's weight in the aggregate (it is linear in the per-token losses): what `loss_tol` is sized by
    probe = per_token.detach().clone().requires_grad_()
    agg = aggregate(probe, batch.loss_mask, mode, batch.group_ids, seq_sum_constant=spec.seq_token_sum_constant)
    (weights,) = torch.autograd.grad(agg, probe)
    value.backward()
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
    return Definition(params, float(value.detach()), norm, out, loss_tol(per_token, weights))


class Definition(NamedTuple):
    """`definition_step`'s result: the weights after the step, the loss, the gradient norm, the per-token loss's
    output (its clip flags), and how far a float32 computation of that loss in another order may be from it."""

    params: torch.Tensor
    loss: float
    norm: float
    out: Any
    loss_tol: float


LOSSES = [*MODES, *W.POLICY_LOSS_CASES, "is_weights", "off_policy_mask"]
CLIPS = {"z2": None, "z2c": None, "z3": W.CLIP, "z0": W.CLIP, "z1": W.CLIP}  # the engines' clip (z2: none binds)


@pytest.fixture(scope="module")
def definitions(world):
    """`definition_step` of every loss, with and without the engines' clip: what every case is compared with."""
    return {
        (loss, clip): definition_step(world["model"], world["batch"], loss, clip)
        for loss in LOSSES
        for clip in set(CLIPS.values())
    }


def test_the_step_tolerance_is_rounding_and_catches_a_planted_error(world, definitions):
    """The bound every step comparison below uses (`step_tol`) is float32 rounding, and small against what it exists
    to catch: a normaliser off by one token, the smallest error a split could make (a micro-batch or a rank counting
    one token too many or too few), moves the step by far more. Planted here: the token-mean's normaliser + 1, and
    (larger still) one token's loss left out."""
    ref = definitions[("token-mean", None)].params
    got = world["w1"][W.case_name("z2", "token-mean", "none", W.BIG_BUDGET)]["params"]
    init = world["w1"]["z2/init"]["params"]
    bound = step_tol(ref, init, world["n_tokens"])
    assert (got - ref).abs().max() < bound
    n = world["n_tokens"]
    planted = init + (ref - init) * n / (n + 1)  # every token's weight 1 / (n + 1) instead of 1 / n
    assert (planted - ref).abs().max() > 100 * bound


@pytest.mark.parametrize("mode", MODES)
def test_one_update_equals_the_naive_whole_batch_step(world, definitions, mode):
    ref, ref_loss, ref_norm, out, tol = definitions[(mode, None)]
    got = world["w1"][W.case_name("z2", mode, "none", W.BIG_BUDGET)]
    init = world["w1"]["z2/init"]["params"]
    assert (ref - init).abs().max() > 1e-2  # the step is large enough to tell modes apart
    assert (got["params"] - ref).abs().max() < step_tol(ref, init, world["n_tokens"])
    m = got["metrics"]
    mask = world["batch"].loss_mask
    on = mask > 0
    low, high = (float((f & on).sum()) / float(on.sum()) for f in (out.clipped_lower, out.clipped_upper))
    assert m[M.POLICY_LOSS] == pytest.approx(ref_loss, abs=tol)
    assert m[M.GRAD_NORM] == pytest.approx(ref_norm, rel=world["norm_rtol"])
    assert (m[M.CLIPFRAC_LOW], m[M.CLIPFRAC_HIGH]) == pytest.approx((low, high), abs=1e-12)  # ratios of counts
    assert 0 < low and 0 < high  # both bounds bind in this batch
    up = out.clipped_upper & (mask > 0)
    clip_high_prob = float(world["batch"].old_logp.exp()[up].mean())  # a mean of float32 probabilities below 1
    assert m[M.CLIP_HIGH_PROB] == pytest.approx(clip_high_prob, abs=int(up.sum()) * EPS32)
    assert m[M.DUAL_CLIPFRAC] > 0 and m[UPDATE_SKIPPED] == 0.0 and m[M.LR] == W.SGD_LR
    # of the rare tokens (old probability < RARE_TOKEN_PROB) with positive advantage, the share clipped above
    b = world["batch"]
    rare = (mask > 0) & (b.old_logp.exp() < RARE_TOKEN_PROB) & (b.advantages[:, None] > 0)
    assert rare.sum() > 0 and (out.clipped_upper & rare).sum() > 0  # the case occurs in this batch
    assert m[M.CLIPFRAC_HIGH_RARE] == pytest.approx(float((out.clipped_upper & rare).sum() / rare.sum()), abs=1e-12)


def _every_split(world, engine: str, loss: str):
    """(world, packing, budget) of every case an engine ran for `loss` (the 2026 baselines run on ZeRO 2 and 3)."""
    if loss in W.NEW_LOSSES and engine not in ("z2", "z3"):
        return []
    budgets = (W.BIG_BUDGET, W.SMALL_BUDGET) if engine == "z2" else (W.SMALL_BUDGET,)
    return [(w, packing, b) for w in ("w1", "w2") for packing in W.PACKINGS for b in budgets]


@pytest.mark.parametrize("engine", list(CLIPS))
@pytest.mark.parametrize("loss", LOSSES)
def test_each_loss_is_its_definition_in_any_split_packing_and_zero_stage(world, definitions, engine, loss):
    """Every policy loss (the clipped surrogate under each aggregation, GSPO, CISPO, Clip-Cov, KL-Cov, SAPO, GMPO,
    DPPO-TV and -KL), the rollout correction's weights and DeepSeek-V3.2's off-policy sequence mask, through the
    learner: the whole-batch step of their definitions, the same on 1 and 2 ranks, in 1 or several micro-batches,
    padded or packed (`sequences`, `prompts`), at ZeRO 0, 1, 2 and 3 and with gradient checkpointing (the 2026
    baselines at ZeRO 2 and 3) (GSPO's and GMPO's ratios and the mask need whole responses; the covariance rules the
    whole mini-batch's means and k-th token; the group-token-mean every rank's per-group counts), with the loss's
    own metric over the whole mini-batch."""
    ref, ref_loss, ref_norm, out, tol = definitions[(loss, CLIPS[engine])]
    init = world["w1"][f"{engine}/init"]["params"]
    assert (ref - init).abs().max() > (1e-3 if CLIPS[engine] else 1e-2)  # the step tells losses apart
    bound = step_tol(ref, init, world["n_tokens"])
    m = world["batch"].loss_mask > 0
    own = None
    if loss == "gspo":  # responses with a clipped sequence ratio, of those with a loss token
        own = (M.SEQ_CLIPFRAC_HIGH, float((out.clipped_upper & m).any(-1).sum()) / float(m.any(-1).sum()))
    elif loss in ("cispo", "clip_cov", "kl_cov"):
        flag = out.capped if loss == "cispo" else out.selected
        own = (M.CISPO_CAPPED_FRAC if loss == "cispo" else M.COV_SELECTED_FRAC, int((flag & m).sum()) / int(m.sum()))
    elif loss in ("gmpo", "dppo_tv", "dppo_kl"):  # tokens the log-ratio clip held, or the trust region dropped
        own = (M.CLIPFRAC_HIGH, int((out.clipped_upper & m).sum()) / int(m.sum()))
    elif loss == "off_policy_mask":  # responses the mask left out, of those with a loss token
        own = (M.OFF_POLICY_MASKED_FRAC, int((out.selected & m).any(-1).sum()) / int(m.any(-1).sum()))
    if own is not None:
        assert own[1] > 0  # the loss's own mechanism acts on this batch
    for w, packing, budget in _every_split(world, engine, loss):
        got = world[w][W.case_name(engine, loss, packing, budget)]
        case = (w, packing, budget)
        assert got["params"].shape == ref.shape  # gathered to full size under ZeRO-3
        assert (got["params"] - ref).abs().max() < bound, case
        assert got["metrics"][M.POLICY_LOSS] == pytest.approx(ref_loss, abs=tol), case
        assert got["metrics"][M.GRAD_NORM] == pytest.approx(ref_norm, rel=world["norm_rtol"]), case
        if own is not None:
            assert got["metrics"][own[0]] == pytest.approx(own[1], abs=1e-12), case


def test_the_engines_clip_binds_and_the_splits_are_real(world, definitions):
    """What makes the cases above exact only with every rule in place: the clipped engines' clip binds, several
    micro-batches run at the small budget (padded and packed), and groups straddle the ranks."""
    assert definitions[("token-mean", None)].norm > 2 * W.CLIP
    for packing in W.PACKINGS:
        assert world["w1"][W.case_name("z2", "token-mean", packing, W.SMALL_BUDGET)]["micro_batches"] > 1, packing
        assert world["w1"][W.case_name("z2", "token-mean", packing, W.BIG_BUDGET)]["micro_batches"] == 1, packing
    assert world["w1"][W.case_name("z2", "token-mean", "none", W.SMALL_BUDGET)]["micro_batches"] == 4


def test_the_test_batch_has_groups_split_across_ranks():
    """What makes the world-size-2 cases exact only with the per-group counts summed over ranks."""
    batch = make_batch()
    for share in (False, True):
        owners: dict[int, set[int]] = {}
        for rank in range(2):
            for g in batch.group_ids[batch.shard_rows(rank, 2, share_prompts=share)].tolist():
                owners.setdefault(g, set()).add(rank)
        live = {int(g) for g, n in zip(batch.group_ids, batch.loss_mask.sum(1), strict=True) if n > 0}
        assert any(len(owners[g]) == 2 for g in live), share


def test_packed_log_probs_and_entropies_are_the_padded_ones(world):
    """After the same update, `compute_logprobs` packed (`sequences`, `prompts`) gives the padded path's per-token
    log-probs and entropies, on 1 and 2 ranks."""
    for w in ("w1", "w2"):
        padded = world[w][W.case_name("z2", "token-mean", "none", W.SMALL_BUDGET)]
        for packing in ("sequences", "prompts"):
            got = world[w][W.case_name("z2", "token-mean", packing, W.SMALL_BUDGET)]
            for key in ("logp_after", "entropy_after"):
                scale = float(padded[key].abs().max())
                assert (got[key] - padded[key]).abs().max() <= world["logp_rtol"] * scale, (w, packing, key)


def test_the_update_reports_its_padded_share(world):
    """`perf/learner_padded_fraction` is what `learner_tokens` counts for the split: above 0 padded at the small
    budget, 0 packed on one rank (on two, only the one-token dummy passes that even out the ranks, if any)."""
    batch = world["batch"]
    for w, ranks in (("w1", 1), ("w2", 2)):
        for packing in W.PACKINGS:
            got = world[w][W.case_name("z2", "token-mean", packing, W.SMALL_BUDGET)]["metrics"]
            counts = learner_tokens(batch.lengths(), ranks, W.SMALL_BUDGET, packing)
            assert got[M.LEARNER_PADDED_FRACTION] == counts.padded_fraction, (w, packing)
            if packing == "none":
                assert counts.padded_fraction > 0.05
            else:
                assert counts.padding <= ranks * counts.passes_per_rank  # dummies only, one token each


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
    ordinary = world["w1"][W.case_name("z2", "token-mean", "sequences", W.SMALL_BUDGET)]["params"]
    for w in ("w1", "w2"):
        after = world[w]["z2/after_nan"]
        assert after["metrics"][UPDATE_SKIPPED] == 0.0
        bound = step_tol(ordinary, world[w]["z2/init"]["params"], world["n_tokens"])
        assert (after["params"] - ordinary).abs().max() < bound


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
    assert (logp - ref).abs().max() <= world["logp_rtol"] * ref.abs().max()  # chunked head against full logits
    assert bool((logp[~valid] == 0).all()) and bool((entropy[valid] > 0).all())
    # at most the uniform distribution's, up to the entropy's own rounding
    assert float(entropy[valid].max()) <= math.log(101) * (1 + world["logp_rtol"])


def test_checkpoint_round_trip_is_exact_and_restores_the_schedule(world, adamw, tmp_path):
    batch = world["batch"]
    fresh = batch.select(list(range(len(batch))))
    fresh.old_logp, _ = adamw.compute_logprobs(batch)
    first = adamw.update(fresh)
    # ratio 1: the same weights give the old and the new log-probs up to rounding (|d| ~ 1e-6), and k3 ~ d^2 / 2
    assert first[M.APPROX_KL] == pytest.approx(0.0, abs=1e-9) and first[M.CLIPFRAC_HIGH] == 0.0
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


def test_an_update_refuses_a_token_older_than_max_staleness_and_changes_nothing(world, adamw):
    """Carry-over's guard (`PolicyBatch.versions`): at the version `schedule` set, a trained token sampled more than
    `LossSpec.max_staleness` versions before it, or by a version after it, raises `StalenessError` before anything
    is computed; a token the loss mask leaves out does not count."""
    import dataclasses

    from dapo.learner import StalenessError

    batch = world["batch"].select([0, 2, 3])  # rows 0 and 2-3: every token trains
    before = {n: p.detach().clone() for n, p in adamw.engine.module.named_parameters()}
    spec = adamw.loss
    try:
        adamw.loss = dataclasses.replace(spec, max_staleness=1)
        adamw.schedule(5)
        for version, problem in ((3, "2 weight versions before"), (6, "newer than the learner's 5")):
            old = batch.loss_mask.long() * 5 + (1 - batch.loss_mask.long()) * -1
            old[1, 0] = version  # one token of the second row
            with pytest.raises(StalenessError, match=problem):
                adamw.update(dataclasses.replace(batch, versions=old))
    finally:
        adamw.loss = spec
    assert all(torch.equal(p, before[n]) for n, p in adamw.engine.module.named_parameters())


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
