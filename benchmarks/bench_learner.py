"""One DAPO update (forward, loss, backward, optimizer step): dapo's Learner (ZeRO 0 and 2) versus TRL's GRPOTrainer.

    PYTHONPATH=/tmp/trl_site .venv/bin/python benchmarks/bench_learner.py [--quick] [--reps 5]

Same model weights, same batch (N responses of variable length after variable-length prompts), same old log-probs,
token-level (DAPO) loss with clip 0.2/0.28, AdamW, gradient clipping at 1.0, float32 on the CPU, world size 1.
TRL side: `GRPOTrainer.compute_loss` (its `_compute_loss`: fused-head log-probs and entropy, `loss_type="dapo"`)
+ `accelerator.backward` + `clip_grad_norm_` + `optimizer.step` on prepared inputs: the update path, no generation.
dapo side: `Learner.update` (one micro-batch holding the whole mini-batch), which computes the same things plus
its metrics (clip fractions, approx KL, entropy mean, gradient norm).

TRL is not a dependency: install it beside the venv, `pip install --no-deps --target /tmp/trl_site trl==1.16.0
accelerate`, and put that folder on PYTHONPATH. Without it only the dapo rows are measured.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from _common import (  # noqa: E402
    fmt,
    interleaved,
    machine,
    md_table,
    median,
    param_count,
    print_table,
    random_qwen2,
    record,
    spread,
)

# (name, model kwargs, responses per mini-batch, group size, max prompt length, max response length)
MODELS = {
    "tiny": (dict(vocab=1024, hidden=128, layers=4, heads=2), 16, 8, 96, 64),
    "qwen2-h512-l8-v32k": (dict(vocab=32000, hidden=512, layers=8, heads=8), 8, 8, 64, 128),
}


def make_batch(n: int, g: int, max_p: int, max_r: int, vocab: int, seed: int = 0) -> dict:
    """Prompts of max_p/2..max_p tokens (one per group), responses of max_r/4..max_r tokens, group-normalised
    random rewards as advantages."""
    rng = random.Random(seed)
    prompts, responses, adv, groups = [], [], [], []
    for k in range(n // g):
        p = [rng.randrange(3, vocab) for _ in range(rng.randint(max_p // 2, max_p))]
        rewards = [rng.choice([-1.0, 1.0]) for _ in range(g)]
        mu = sum(rewards) / g
        sd = (sum((r - mu) ** 2 for r in rewards) / (g - 1)) ** 0.5
        for r in rewards:
            prompts.append(p)
            responses.append([rng.randrange(3, vocab) for _ in range(rng.randint(max_r // 4, max_r))])
            adv.append((r - mu) / (sd + 1e-6))
            groups.append(k)
    return dict(prompts=prompts, responses=responses, advantages=torch.tensor(adv), groups=torch.tensor(groups))


def dapo_side(path: Path, b: dict, zero: int, tokens_budget: int):
    from dapo.learner import Learner, LossSpec, PolicyBatch, response_mask

    learner = Learner(
        str(path),
        loss=LossSpec(eps_low=0.2, eps_high=0.28, loss_agg="token-mean"),
        lr=1e-6,
        grad_clip=1.0,
        zero_stage=zero,
        dtype="float32",
        micro_batch_tokens=tokens_budget,
        packing="none",  # padded, as TRL's trainer and the plain side below (bench_packing.py: packed against padded)
    )
    batch = PolicyBatch(b["prompts"], b["responses"], b["advantages"], response_mask(b["responses"]), b["groups"])
    batch.old_logp, _ = learner.compute_logprobs(batch)
    return learner, batch


def plain_side(path: Path, batch, chunk: int = 1024, fused: bool = False):
    """dapo's model path and loss without DeepSpeed: the same PolicyModule (chunked head), clipped surrogate and
    token-mean weights, with a bare torch AdamW and clip_grad_norm_. Isolates the engine's share of an update."""
    from dapo.algos.aggregation import token_weights, weighted_sum
    from dapo.algos.policy_loss import clipped_surrogate
    from dapo.learner.batch import collate
    from dapo.learner.model import load_policy

    module = load_policy(str(path), torch.float32, False, {"zero_optimization": {"stage": 0}})
    module.train()
    opt = torch.optim.AdamW(module.parameters(), lr=1e-6, fused=fused or None)
    n = len(batch)
    weights = token_weights(
        batch.loss_mask,
        "token-mean",
        batch.group_ids,
        num_tokens=float(batch.loss_mask.sum()),
        num_seqs=float(n),
        num_groups=float(len(set(batch.group_ids.tolist()))),
    )

    def update() -> None:
        order = sorted(range(n), key=lambda i: len(batch.prompt_ids[i]) + len(batch.response_ids[i]))
        mb = collate(batch.prompt_ids, batch.response_ids, order)
        logp, _ = module(
            input_ids=mb.input_ids,
            attention_mask=mb.attention_mask,
            positions=mb.positions,
            targets=mb.targets,
            temperature=1.0,
            chunk_size=chunk,
            with_entropy=True,
        )
        r, c = mb.token_rows, mb.token_cols
        out = clipped_surrogate(logp, batch.old_logp[r, c], batch.advantages[r], 0.2, 0.28, None)
        weighted_sum(out.loss, weights[r, c]).backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        opt.zero_grad()

    return update


def trl_side(path: Path, b: dict, old_logp: torch.Tensor, g: int, max_r: int, workdir: str):
    """A GRPOTrainer on the same model, and the inputs its `_compute_loss` reads, built from the same batch."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    n = len(b["prompts"])
    args = GRPOConfig(
        output_dir=workdir,
        use_cpu=True,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
        per_device_train_batch_size=n,
        num_generations=g,
        gradient_accumulation_steps=1,
        max_completion_length=max_r,
        learning_rate=1e-6,
        max_grad_norm=1.0,
        report_to="none",
        bf16=False,
        use_vllm=False,
        logging_steps=1000,
        save_strategy="no",
    )
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(path))
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["x"] * n}),
        processing_class=tok,
    )
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop, which we bypass
    trainer.model.train()
    pw = max(len(p) for p in b["prompts"])
    rw = max(len(r) for r in b["responses"])
    pid = torch.full((n, pw), tok.pad_token_id, dtype=torch.long)
    pmask = torch.zeros(n, pw, dtype=torch.long)
    cid = torch.full((n, rw), tok.pad_token_id, dtype=torch.long)
    cmask = torch.zeros(n, rw, dtype=torch.long)
    for i, (p, r) in enumerate(zip(b["prompts"], b["responses"], strict=True)):
        pid[i, pw - len(p) :], pmask[i, pw - len(p) :] = torch.tensor(p), 1  # TRL left-pads prompts
        cid[i, : len(r)], cmask[i, : len(r)] = torch.tensor(r), 1
    inputs = dict(
        prompt_ids=pid,
        prompt_mask=pmask,
        completion_ids=cid,
        completion_mask=cmask,
        advantages=b["advantages"].float(),
        old_per_token_logps=old_logp[:, :rw].float(),
        num_items_in_batch=cmask.sum().float(),
    )
    return trainer, inputs


def trl_update(trainer, inputs) -> None:
    model = trainer.model
    loss = trainer.compute_loss(model, inputs)
    trainer.accelerator.backward(loss)
    trainer.accelerator.clip_grad_norm_(model.parameters(), 1.0)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad()


def profile(fn, top: int = 6) -> list[tuple[str, float]]:
    """Self CPU time (ms) of the heaviest ops in one call, from torch.profiler: where an update spends its time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    with tprofile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ev = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in ev) / 1e3
    return [("(total)", total)] + [(e.key, e.self_cpu_time_total / 1e3) for e in ev[:top]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="tiny model only, 2 repetitions, nothing recorded")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--profile", action="store_true", help="also show the heaviest ops of one update per path")
    ap.add_argument(
        "--ablate",
        action="store_true",
        help="plain-torch path with default vs fused AdamW, and TRL (where the gap to TRL comes from)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads (0: torch's default); 1 avoids OpenMP spin-waits on an oversubscribed machine",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine()
    reps = 2 if args.quick else args.reps
    models = ["tiny"] if args.quick else args.models
    try:
        import trl  # noqa: F401

        have_trl = True
    except ImportError:
        have_trl = False
    rows, prof_rows = [], []
    for name in models:
        kw, n, g, max_p, max_r = MODELS[name]
        path = random_qwen2(f"learner-{name}", **kw)
        b = make_batch(n, g, max_p, max_r, kw["vocab"])
        tokens = sum(len(p) + len(r) for p, r in zip(b["prompts"], b["responses"], strict=True))
        resp_tokens = sum(len(r) for r in b["responses"])
        budget = n * (max_p + max_r)  # the whole mini-batch in one micro-batch, as TRL does
        cases, old = {}, None
        for zero in (0, 2):
            learner, batch = dapo_side(path, b, zero, budget)
            old = batch.old_logp if old is None else old
            if not args.ablate:
                cases[f"dapo Learner ZeRO-{zero}"] = lambda lr=learner, bt=batch: lr.update(bt)
        cases["dapo model + loss, plain torch (no DeepSpeed)"] = plain_side(path, batch)
        if args.ablate:
            cases["same, fused AdamW"] = plain_side(path, batch, fused=True)
        if have_trl:
            tmp = tempfile.mkdtemp(prefix="trl-bench-")
            trainer, inputs = trl_side(path, b, old, g, max_r, tmp)
            cases["TRL GRPOTrainer (dapo loss)"] = lambda t=trainer, i=inputs: trl_update(t, i)
        times = interleaved(cases, reps=reps, warmup=1)
        if args.profile:
            for case, fn in cases.items():
                prof_rows.append([name, case, "; ".join(f"{k} {v:,.0f}" for k, v in profile(fn))])
        base = median(times[next(iter(times))])
        for case, ts in times.items():
            m = median(ts)
            rows.append(
                [
                    name,
                    f"{param_count(path) / 1e6:.2f}M",
                    f"{n} x (P<={max_p}, R<={max_r})",
                    case,
                    fmt(m * 1e3),
                    spread([t * 1e3 for t in ts]),
                    f"{tokens / m:,.0f}",
                    f"{resp_tokens / m:,.0f}",
                    f"{m / base:.2f}",
                ]
            )
    header = [
        "model",
        "params",
        "mini-batch",
        "update path",
        "median ms",
        "min-max ms",
        "tokens/s (all)",
        "response tokens/s",
        "time / first row",
    ]
    print_table("One DAPO update, world size 1, float32", header, rows)
    pheader = ["model", "update path", "self CPU ms: total; heaviest ops (one profiled update)"]
    if prof_rows:
        print_table("Where the time goes", pheader, prof_rows)
    if not have_trl:
        print("TRL not importable: only the dapo rows were measured (see the module docstring)")
    if not args.quick:
        body = (
            f"{reps} interleaved repetitions after 1 warm-up each; TRL {'present' if have_trl else 'absent'}."
            f"\n\n" + md_table(header, rows)
        )
        if prof_rows:
            body += "\n\n" + md_table(pheader, prof_rows)
        record(
            "learner_ablate" if args.ablate else "learner_profile" if args.profile else "learner",
            "PYTHONPATH=/tmp/trl_site .venv/bin/python benchmarks/bench_learner.py " + " ".join(sys.argv[1:]),
            info,
            body,
        )


if __name__ == "__main__":
    main()
