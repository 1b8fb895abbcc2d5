"""The dry run's cost model on published setups, against what those runs measured (docs/cost.md prints this).

    python scripts/plan_vs_published.py            # Markdown table, plan against measured
    python scripts/plan_vs_published.py --plan 'train_mfu=0.25' 'decode_efficiency=0.6'

Each setup is written down from its own source (URLs below), with the model's shape from `dapo.shapes`, the KV
cache from the same memory budget the dry run uses, and every rate from configs/workflow.yaml's `plan:` block
(the dry run's defaults), overridable with --plan. Nothing here is fitted to the measurements.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dapo.cost import CostInputs, row_cost  # noqa: E402
from dapo.decode import Replica  # noqa: E402
from dapo.plan import MemoryInputs, memory_budget  # noqa: E402
from dapo.shapes import GPUS, KNOWN_MODELS, vllm_batching_defaults  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Setup:
    name: str
    source: str
    measured: str  # what the source reports, in words
    measured_s: float | None  # seconds per rollout step the source's figures give (None: not published)
    model: str
    gpu: str
    gpus: int
    nodes: int
    tp: int
    vllm_util: float  # the run's gpu_memory_utilization
    zero_stage: int  # 3: states sharded over every GPU (FSDP, Megatron's distributed optimizer, ZeRO-3); 2: ZeRO-2
    prompts: int  # per rollout step
    n: int
    prompt_tokens: float
    response_tokens: tuple[float, float]  # mean at the first and last step of the stretch measured
    cap: int
    reference: bool  # reference log-probs computed each step
    checkpointing: bool  # gradient (activation) checkpointing
    steps: int  # the stretch the measurement covers
    gen_batch: int = 0  # dynamic sampling's generation batch (0: off)
    eval_every: int = 0  # evaluations inside the measured time (0: none)
    eval_problems: int = 30
    eval_n: int = 1
    checkpoint_every: int = 0  # checkpoints inside the measured time (0: none)


SETUPS = [
    Setup(
        name="verl DAPO, Qwen2.5-32B, 128 x A800",
        source="https://github.com/volcengine/verl/issues/795 (the recipe: recipe/dapo/run_dapo_qwen2.5_32b.sh)",
        measured="230 rollout steps in 5 days, slowing as responses grew",
        measured_s=5 * 86400 / 230,
        model="Qwen/Qwen2.5-32B",
        gpu="a800",
        gpus=128,
        nodes=16,
        tp=4,
        vllm_util=0.8,
        zero_stage=3,
        prompts=512,
        n=16,
        prompt_tokens=200,
        # unknown (the issue shows them as images): row 05's defaults, 1,000 -> 4,000 over 400 steps, up to step 230
        response_tokens=(1000, 2725),
        cap=20480,
        reference=True,  # that recipe's main_dapo.py always built a reference worker (Role.RefPolicy)
        checkpointing=True,
        steps=230,
        gen_batch=1536,
        eval_every=5,  # test_freq=5: AIME 2024 repeated 32 times, one sample each
        eval_problems=30,
        eval_n=32,
        checkpoint_every=5,  # save_freq=5
    ),
    Setup(
        name="NeMo RL GRPO, Qwen3-32B, 32 x H100",
        source="https://github.com/NVIDIA-NeMo/RL docs/about/performance-summary.md, v0.4 table (recipe: "
        "examples/configs/recipes/llm/performance/grpo-qwen3-32b-4n8g.yaml)",
        measured="393 s per step on policy, 2,048 samples of 3,206 tokens on average (540 tokens/s/GPU)",
        measured_s=393,
        model="Qwen/Qwen3-32B",
        gpu="h100",
        gpus=32,
        nodes=4,
        tp=4,
        vllm_util=0.6,  # grpo_math_1B.yaml's default, not changed by the recipe
        zero_stage=3,
        prompts=64,
        n=32,
        prompt_tokens=150,  # OpenMathInstruct-2 problem with the cot prompt (stated)
        response_tokens=(3056, 3056),  # 3,206 per sample less the prompt
        cap=4096 - 150,
        reference=True,  # grpo_math_1B.yaml: reference_policy_kl_penalty 0.01
        checkpointing=False,  # megatron_cfg.activation_checkpointing: false
        steps=1,
    ),
    Setup(
        name="Oat Dr. GRPO, Qwen2.5-Math-7B, 8 x A100",
        source="https://github.com/sail-sg/understand-r1-zero (README and examples/qwen2.5-math-7b.sh)",
        measured="27 hours in all; the number of steps is not published",
        measured_s=None,
        model="Qwen/Qwen2.5-Math-7B",
        gpu="a100-80",
        gpus=8,
        nodes=1,
        tp=1,
        vllm_util=0.35,
        zero_stage=2,
        prompts=128,
        n=8,
        prompt_tokens=150,
        response_tokens=(700, 700),  # unknown: Dr. GRPO keeps lengths flat (the paper's Fig. 5); stated
        cap=3000,
        reference=False,  # beta 0
        checkpointing=True,
        steps=1,
    ),
]


def plan_defaults(overrides: list[str]) -> dict:
    plan = yaml.safe_load((ROOT / "configs" / "workflow.yaml").read_text())["plan"]
    for text in overrides:
        key, value = text.split("=", 1)
        plan[key] = yaml.safe_load(value)
    return plan


def cost_of(s: Setup, plan: dict):
    shape, gpu = KNOWN_MODELS[s.model], GPUS[s.gpu]
    batched, seqs = vllm_batching_defaults(s.gpu, gpu.memory_gib)
    budget = memory_budget(
        MemoryInputs(
            shape=shape, dtype_bytes=2, world_size=s.gpus, tensor_parallel=s.tp, zero_stage=s.zero_stage,
            gpu_memory_gib=gpu.memory_gib, gpu_memory_utilization=s.vllm_util,
            max_model_len=int(s.prompt_tokens + s.cap), mean_seq_tokens=s.prompt_tokens + s.response_tokens[1],
            micro_batch_tokens=8192, logprob_chunk_tokens=256, gradient_checkpointing=s.checkpointing,
            sleep_mode=True, sleep_level=2, allowance_gib=plan["allowance_gib"], vllm_batched_tokens=batched,
            vllm_max_seqs=seqs,
        )
    )  # fmt: skip
    c = CostInputs(
        replica=Replica(
            shape=shape, dtype_bytes=2, tensor_parallel=s.tp, hbm_tb_s=gpu.hbm_tb_s, bf16_tflops=gpu.bf16_tflops,
            efficiency=plan["decode_efficiency"], step_overhead_s=plan["decode_step_overhead_ms"] / 1000,
            kv_tokens=budget.kv_tokens_per_replica, max_seqs=seqs,
        ), world_size=s.gpus, nodes=s.nodes, prompts_per_step=s.prompts, n=s.n,
        mean_prompt_tokens=s.prompt_tokens, response_tokens_start=s.response_tokens[0],
        response_tokens_end=s.response_tokens[1], max_response_tokens=s.cap, dynamic_sampling=bool(s.gen_batch),
        gen_batch_prompts=s.gen_batch or s.prompts, max_gen_batches=10,
        informative_fraction=plan["informative_fraction"], gradient_checkpointing=s.checkpointing,
        # the published runs pack sequences (verl's use_remove_padding, NeMo RL's sequence packing); the update's
        # mini-batch: the step's prompts in 16 updates, as each of these recipes
        packing="sequences", micro_batch_tokens=8192, forward_micro_batch_tokens=12288,
        mini_batch_prompts=max(1, s.prompts // 16),
        reference_forward=s.reference, total_steps=s.steps, eval_every=s.eval_every, eval_problems=s.eval_problems,
        eval_n=s.eval_n, eval_max_tokens=s.cap, train_mfu=plan["train_mfu"], step_overhead_s=plan["step_overhead_s"],
        checkpoint_every=s.checkpoint_every or s.steps, keep_checkpoints=1,
        checkpoint_gb_s_per_node=plan["checkpoint_gb_s_per_node"],
    )  # fmt: skip
    rc = row_cost(c)
    evals_s = rc.eval_s_total if s.eval_every else 0.0
    ckpt_s = rc.checkpoints * rc.checkpoint_s if s.checkpoint_every else 0.0
    per_step = rc.step_s_mean + (evals_s + ckpt_s) / s.steps
    return rc, per_step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", nargs="*", default=[], help="plan keys to override, key=value (YAML values)")
    args = ap.parse_args()
    plan = plan_defaults(args.plan)
    print("| setup | measured | plan: generation + training per step | plan per step | plan / measured |")
    print("|---|---|---|---|---|")
    for s in SETUPS:
        rc, per_step = cost_of(s, plan)
        a, b = rc.first, rc.last
        gen = f"{a.gen_s:,.0f}-{b.gen_s:,.0f}" if a.gen_s != b.gen_s else f"{a.gen_s:,.0f}"
        train = f"{a.train_s:,.0f}-{b.train_s:,.0f}" if a.train_s != b.train_s else f"{a.train_s:,.0f}"
        ratio = f"{per_step / s.measured_s:.2f}" if s.measured_s else "n/a (steps not published)"
        measured = f"{s.measured} ({s.measured_s:,.0f} s/step)" if s.measured_s else s.measured
        print(f"| {s.name} | {measured} | {gen} s + {train} s | {per_step:,.0f} s | {ratio} |")
    print()
    for s in SETUPS:
        print(f"- {s.name}: {s.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
