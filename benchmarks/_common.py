"""Shared helpers for the benchmark scripts: the machine, interleaved timing, random Qwen2 models, tables, and the
BENCHMARKS.md section each script rewrites.

Measurements, not tests: each comparison runs in one process, its sides interleaved (A, B, A, B, ...) after a
warm-up, and the median is reported, so the shared machine's noise falls on every side alike.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH_MD = ROOT / "BENCHMARKS.md"
MODEL_CACHE = Path(os.environ.get("DAPO_BENCH_MODELS", "/tmp/dapo_bench_models"))


# ---------------------------------------------------------------------------------------------- the machine
def loadavg() -> str:
    """The 1/5/15-minute load averages, as `uptime` prints them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> dict[str, str]:
    """nproc, CPU model, memory, load average, date, git commit: what a reader needs to compare a number."""
    cpu = "unknown"
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = m.group(1).strip() if m else cpu
        kb = int(re.search(r"^MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text(), re.M).group(1))
        mem = f"{kb / 2**20:.1f} GiB"
    except (OSError, AttributeError):
        mem = "unknown"
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = "?"
    import torch

    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "memory": mem,
        "load average (1/5/15 min) at start": loadavg(),
        "python / torch": f"{platform.python_version()} / {torch.__version__} ({torch.get_num_threads()} threads)",
        "commit": commit,
    }


# ---------------------------------------------------------------------------------------------- timing
def interleaved(cases: dict[str, Callable[[], Any]], reps: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each case: `warmup` untimed calls each, then `reps` rounds of one call per case, the
    order rotating each round (A,B,C / B,C,A / ...) so drift in the machine's load hits every case alike."""
    names = list(cases)
    for _ in range(warmup):
        for name in names:
            cases[name]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            t0 = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - t0)
    return times


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def spread(xs: Sequence[float]) -> str:
    """min-max of the repetitions, to show how noisy the machine was."""
    return f"{min(xs):.3g}-{max(xs):.3g}"


# ---------------------------------------------------------------------------------------------- models
def random_qwen2(
    name: str,
    *,
    vocab: int,
    hidden: int,
    layers: int,
    heads: int,
    intermediate: int | None = None,
    tie: bool = False,
    max_positions: int = 4096,
    seed: int = 0,
    kv_heads: int | None = None,
    dtype: str = "float32",
    device: str = "cpu",
) -> Path:
    """A randomly initialised Qwen2ForCausalLM saved with a tokenizer, cached under MODEL_CACHE/name; built on
    `device` (a GPU initialises a 7B model in seconds) and saved in `dtype`.

    The tokenizer is a byte-level BPE trained on a little synthetic text (a few hundred tokens); the model's
    vocabulary may be larger (as Qwen2.5's 152,064 rows exceed its tokenizer's), which only matters for decoding.
    """
    out = MODEL_CACHE / name
    if (out / "config.json").is_file():
        return out
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from dapo.tinyworld.tokenizer import train_tokenizer

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    corpus = [
        f"Tom has {i} apples and buys {i * 7 % 13} more. {i} + {i * 7 % 13} = {i + i * 7 % 13}. Answer: "
        f"{i + i * 7 % 13}"
        for i in range(2000)
    ]
    tok = train_tokenizer(corpus, vocab_size=min(vocab, 512))
    tok.save_pretrained(tmp)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate or 4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie,
        rope_theta=10000.0,
        eos_token_id=eos,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(getattr(torch, dtype))
    model.save_pretrained(tmp)
    del model
    tmp.rename(out)
    return out


def linears(s: Any) -> list[tuple[int, int]]:
    """(in, out) of one decoder layer's linear layers (q, k, v, o, gate, up, down) of a `dapo.shapes.ModelShape`."""
    h, i = s.hidden, s.intermediate
    return [(h, s.q_dim), (h, s.kv_dim), (h, s.kv_dim), (s.q_dim, h), (h, i), (h, i), (i, h)]


def useful_flops(s: Any, prompts: list[list[int]], responses: list[list[int]]) -> dict[str, float]:
    """Model FLOPs of one forward + backward of a learner update (bench_learner_flops.py's docstring): 6 x the
    linear layers' weights x tokens, the head on response positions, causal attention 6 x L^2 x q_dim per layer."""
    lengths = [len(p) + len(r) - 1 for p, r in zip(prompts, responses, strict=True) if r]
    tokens, scored = sum(lengths), sum(len(r) for r in responses)
    linear = 6.0 * s.layers * sum(a * b for a, b in linears(s)) * tokens
    head = 6.0 * s.vocab * s.hidden * scored
    attention = 6.0 * s.layers * s.q_dim * sum(n * n for n in lengths)
    return {"linear": linear, "head": head, "attention": attention, "total": linear + head + attention}


def param_count(path: Path) -> int:
    import json

    c = json.loads((path / "config.json").read_text())
    h, v, n, i = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["intermediate_size"]
    per_layer = 4 * h * h + 3 * h * i  # q,k,v,o (kv heads = heads here) + gate, up, down
    return v * h * (1 if c.get("tie_word_embeddings") else 2) + n * per_layer


def tiny_training_prompts() -> tuple[Any, str, list, list]:
    """The tiny preset's config, its world's base model (the world is built on first use), and its training
    problems with their prompts tokenized as the preset does (chat template, prompt cap)."""
    from transformers import AutoTokenizer

    from dapo.config import load_config
    from dapo.data.loaders import load_problems
    from dapo.data.prompts import tokenize_problems
    from dapo.tinyworld import ensure_tiny_world, tiny_paths

    cfg = load_config(preset="tiny")
    paths = tiny_paths(Path(ensure_tiny_world(cfg)))
    tok = AutoTokenizer.from_pretrained(str(paths.model))
    problems, prompts, _ = tokenize_problems(
        load_problems(str(paths.train)),
        tok,
        use_chat_template=cfg.data.use_chat_template,
        max_prompt_length=cfg.data.max_prompt_length,
    )
    return cfg, str(paths.model), problems, prompts


# ---------------------------------------------------------------------------------------------- output
def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        for h in header:
            t.add_column(str(h))
        for r in rows:
            t.add_row(*[str(x) for x in r])
        Console(width=160).print(t)
    except ImportError:  # plain text
        print(title)
        print(" | ".join(map(str, header)))
        for r in rows:
            print(" | ".join(map(str, r)))


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def record(name: str, command: str, info: dict[str, str], body: str) -> None:
    """Replace (or append) the generated section `name` of BENCHMARKS.md: the command, the machine, the body.
    Text outside the markers (the analysis) is left alone."""
    info = dict(info)
    info["load average (1/5/15 min) at end"] = loadavg()
    text = BENCH_MD.read_text() if BENCH_MD.is_file() else "# Benchmarks\n"
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    machine_lines = "\n".join(f"- {k}: {v}" for k, v in info.items())
    section = f"{start}\nCommand: `{command}`\n\n{machine_lines}\n\n{body.strip()}\n{end}"
    if start in text and end in text:
        text = text[: text.index(start)] + section + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + f"\n\n{section}\n"
    BENCH_MD.write_text(text)


OMP_WAITS = ("default", "passive")


def add_omp_wait_option(ap: Any) -> None:
    """`--omp-wait` for a benchmark that compares thread and process counts (an argparse parser)."""
    ap.add_argument(
        "--omp-wait",
        choices=OMP_WAITS,
        default="default",
        help="OpenMP's waiting policy for both sides: the library default (what users get) or PASSIVE",
    )


def omp_wait_label(omp_wait: str) -> str:
    return "OpenMP's default waiting" if omp_wait == "default" else f"OMP_WAIT_POLICY={omp_wait.upper()}"


def child_env(omp_wait: str, threads: int) -> dict[str, str]:
    """This process's environment for a launch of `threads` OpenMP threads per process: no rank variables of a
    surrounding torchrun, and OpenMP's waiting policy as asked. "default" leaves the library's own (GNU OpenMP spins
    a while before it sleeps), as `dapo train` gets it; PASSIVE makes a 2-thread process wake its second thread at
    every parallel region, which slows it by 13-15% here (BENCHMARKS.md 8 and 10)."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "OMP_WAIT_POLICY")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["OMP_NUM_THREADS"] = str(threads)
    if omp_wait != "default":
        env["OMP_WAIT_POLICY"] = omp_wait.upper()
    return env


def fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}g}" if abs(x) < 10**digits else f"{x:,.0f}"
