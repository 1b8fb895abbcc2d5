"""Build the tiny world (tasks -> tokenizer -> SFT base model -> measurement) once per config, and cache it.

The cache key hashes the `tiny:` section (without `tiny.dir`, `tiny.n_eval_large`) and `BUILD_VERSION`; a directory
whose manifest has the same hash is reused, so `dapo build-tiny`, the tests and the workflow share one build. The
large eval split (`data.eval: tiny-large`) is not part of it: drawn on first use into `eval_large_<n>.jsonl` beside
the world, in seconds. A build is written to a temporary sibling and renamed into place under a file lock: no process
sees a half-written world.

The build runs in a child process with the CPU kernels `tiny.kernels` pins (`dapo.tinyworld.kernels`): PyTorch, MKL
and oneDNN pick vector code by CPU, and SFT amplifies the rounding into another base model. `portable` (the default)
builds the same weights on Intel and AMD.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo.tinyworld import habits
from dapo.tinyworld.kernels import kernels_record, pinned_kernels
from dapo.tinyworld.tasks import Splits, Task, make_large_eval, make_splits, solution_lines

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dapo.config import RunConfig, TinyWorldConfig

# Bump when the task generator, tokenizer, training recipe or build environment changes: old caches are rebuilt.
# 4: built in a child process with pinned kernels (3 used whatever kernels the host CPU offered).
BUILD_VERSION = 4
# Bump when only the habits world's recipe changes (its worlds are rebuilt, the arithmetic world's kept).
# 2: SFT loss normalised by a constant under length-grouped batches. 3: random batches again (length grouping cost
# most of the arithmetic: docs/evidence.md, W101-W103). 4: length-sorted micro-batches (`HABITS_SFT_MICRO_BATCHES`).
# 5: a verbose line does not restate the running total ("He buys 3 more: 5 + 3 = 8."): fits the cap on core problems.
# 6: a loop re-checks once or twice, not 2-3 times (a looping answer to a long problem fits the cap).
# 7: long problems have 4-6 operations (from 5-6), verbose working fits on some; `tiny.sft_long_slip`.
HABITS_RECIPE = 7
SFT_BATCH = 32  # sequences per supervised step
# Habits batches mix 15- and 150-token solutions: length-sorted micro-batches (gradients summed) pad far less. The
# arithmetic world keeps one micro-batch: its worlds stay bit for bit.
HABITS_SFT_MICRO_BATCHES = 4
SFT_LR = 3e-3  # trained a 1.1M-parameter prototype to 30% avg@16 in 5 CPU-minutes
VOCAB_SIZE = 1024  # an upper bound: the BPE saturates near 500 on this task's text
MAX_POSITIONS = 512
TOKENIZER_CORPUS = 4000  # problems whose prompts and solutions train the BPE
GROUP_PROMPTS = 64  # train prompts sampled to measure all-correct / all-wrong group fractions
HABITS_GROUP_PROMPTS = 256  # ... in the habits world, whose profile (tags by kind) needs more
# Least samples per problem of the build-end measurement on the AIME-sized split (the tiny preset's eval.n is 1).
MEASURE_MIN_N = 16
# `data.train` / `data.eval` values naming the world's files: train and AIME-sized eval, and (eval) the large split.
TINY = "tiny"
TINY_LARGE = "tiny-large"
# tiny.* keys the built world does not depend on (left out of its hash; see world_hash)
UNHASHED_KEYS = ("dir", "n_eval_large")
# tiny.* keys added after worlds had been built, with the value those were built with: at that value a key is left
# out of the hash, so old worlds stay valid (sft_connectives: a no-op at 0, after build 3; kernels' avx2: build 4's
# pins; build_threads: one before; sft_long_slip: recipe 7; sft_combine off, sft_mix_* unset: nothing drawn anew).
KEYS_ADDED_LATER = {
    "sft_connectives": 0.0,
    "kernels": "avx2",
    "build_threads": 1,
    "sft_long_slip": None,
    "sft_combine": 0.0,
    "sft_mix_easy": None,
    "sft_mix_fork": None,
    "sft_mix_long": None,
    "assay": "none",
    "sft_fork_right_control": 0.3,
    "sft_short_wrong": 0.0,
    "sft_loop_continue": 0.5,
    "sft_careful": 0.5,
}
# tiny.* keys that only one kind of world reads (left out of the other kind's hash)
ARITHMETIC_ONLY_KEYS = ("difficulty", "sft_guess", "sft_connectives")
HABITS_ONLY_KEYS = (
    "mix_easy",
    "mix_fork",
    "mix_long",
    "mix_unsolvable",
    "sft_mix_easy",
    "sft_mix_fork",
    "sft_mix_long",
    "sft_verbose_slip",
    "sft_long_slip",
    "sft_combine",
    "sft_loop",
    "sft_loop_slip",
    "sft_fork_right",
    "sft_fork_right_control",
    "assay",
    "sft_short_wrong",
    "sft_loop_continue",
    "sft_careful",
)

# progress(phase, done, total): phases "tasks", "tokenizer", "sft", "measure"
Progress = Callable[[str, int, int], None]

# the child's stdout lines that carry progress and errors to the parent (anything else is passed through)
_PROTOCOL = "@dapo-build "
_CHILD = "import sys; from dapo.tinyworld.build import _child_main; sys.exit(_child_main(sys.argv[1:]))"


@dataclass(frozen=True)
class TinyPaths:
    root: Path
    model: Path
    train: Path
    eval: Path
    manifest: Path


@dataclass(frozen=True)
class MeasureSettings:
    """The base model's measurement settings: the eval's sampling, the rollout's (`group_*`), the prompt length cap."""

    eval_n: int
    eval_temperature: float
    eval_top_p: float
    max_new_tokens: int
    group_n: int
    group_temperature: float
    group_top_p: float
    max_prompt_length: int


def tiny_paths(root: str | Path) -> TinyPaths:
    root = Path(root)
    return TinyPaths(root, root / "model", root / "train.jsonl", root / "eval.jsonl", root / "manifest.json")


def _world_settings(tiny: dict[str, Any]) -> dict[str, Any]:
    """The `tiny.*` settings (a config's or a manifest's) defining a world: its kind's, less UNHASHED_KEYS and the
    KEYS_ADDED_LATER at their old value."""
    arithmetic = tiny.get("kind", "arithmetic") == "arithmetic"
    d = dict(tiny)
    for key in UNHASHED_KEYS + (HABITS_ONLY_KEYS + ("kind",) if arithmetic else ARITHMETIC_ONLY_KEYS):
        d.pop(key, None)
    for key, built_before in KEYS_ADDED_LATER.items():
        if key in d and d[key] == built_before:
            d.pop(key)
    return d


def world_hash(tiny: TinyWorldConfig) -> str:
    """What the built world depends on: every `tiny.*` key but `dir`, and the build recipe version."""
    d = _world_settings(tiny.model_dump(mode="json"))
    d["build_version"] = BUILD_VERSION
    if tiny.kind == "habits":
        d["habits_recipe"] = HABITS_RECIPE
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def read_manifest(root: str | Path) -> dict[str, Any] | None:
    path = tiny_paths(root).manifest
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # missing or unreadable: the world counts as not built, and is built again
        return None


def is_built(root: str | Path, tiny: TinyWorldConfig) -> bool:
    m = read_manifest(root)
    p = tiny_paths(root)
    return (
        m is not None
        and m.get("hash") == world_hash(tiny)
        and (p.model / "config.json").is_file()
        and p.train.is_file()
        and p.eval.is_file()
    )


def world_mismatch(root: str | Path, tiny: TinyWorldConfig) -> str | None:
    """Why the world at `root` is not `tiny`'s (the keys, both values); None when it is, or nothing / part of it is
    built there yet."""
    m = read_manifest(root)
    if m is None or m.get("hash") == world_hash(tiny):  # an unfinished build of this world is finished in place
        return None
    config = tiny.model_dump(mode="json")
    built, want = _world_settings(m.get("tiny", {})), _world_settings(config)
    shown = {k: built.get(k, KEYS_ADDED_LATER.get(k)) for k in [*want, *built]}  # a key it lacks: its value then
    diff = [f"tiny.{k}={v} (this config: {config.get(k)})" for k, v in shown.items() if v != config.get(k)]
    if diff:
        return "built with " + ", ".join(diff)
    recipe = f", habits recipe {HABITS_RECIPE}" if tiny.kind == "habits" else ""
    return (
        f"built by build version {m.get('build_version')} with the same settings, but this code builds version "
        f"{BUILD_VERSION}{recipe}: the world's text or model would differ"
    )


@contextlib.contextmanager
def _lock(root: Path) -> Iterator[None]:
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_tiny_world(
    cfg: RunConfig,
    *,
    out: str | Path | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> Path:
    """The tiny world directory for `cfg` (default `cfg.tiny.dir`; layout: `tiny_paths`), built when missing or stale.

    The build-end measurement uses the run's eval settings (eval.n, at least `MEASURE_MIN_N`) and rollout settings
    (train-group fractions), recorded in the manifest, not hashed; `tiny.build_threads` torch threads (hashed).
    """
    root = Path(out if out is not None else cfg.tiny.dir)
    if not force and is_built(root, cfg.tiny):
        return root
    with _lock(root):
        if not force and is_built(root, cfg.tiny):  # another process built it while we waited
            return root
        if root.exists() and any(root.iterdir()) and read_manifest(root) is None:
            raise FileExistsError(
                f"{root}: exists and is not a tiny world (no manifest.json); refusing to "
                "overwrite it. Point tiny.dir (or --out) at a new or tiny-world directory."
            )
        tmp = root.parent / f".{root.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            settings = MeasureSettings(
                eval_n=max(cfg.eval.n, MEASURE_MIN_N),
                eval_temperature=cfg.eval.temperature,
                eval_top_p=cfg.eval.top_p,
                max_new_tokens=cfg.resolved_eval_max_tokens(),
                group_n=cfg.rollout.n,
                group_temperature=cfg.rollout.temperature,
                group_top_p=cfg.rollout.top_p,
                max_prompt_length=cfg.data.max_prompt_length,
            )
            build_tiny_world(cfg.tiny, tmp, settings, progress)
            if root.exists():
                old = root.parent / f".{root.name}.old-{os.getpid()}"
                os.replace(root, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def large_eval_path(root: str | Path, n: int) -> Path:
    return Path(root) / f"eval_large_{n}.jsonl"


def ensure_large_eval(cfg: RunConfig) -> Path:
    """The large eval split's file for `cfg` (`tiny.n_eval_large` problems), drawn (and the world built) when missing.
    It shares no text with the train, AIME-sized eval or supervised problems (redrawn from the world's seed)."""
    root = ensure_tiny_world(cfg)
    tiny = cfg.tiny
    path = large_eval_path(root, tiny.n_eval_large)
    if path.is_file():
        return path
    with _lock(root):
        if path.is_file():
            return path
        splits = world_splits(tiny)
        exclude = {t.text for t in splits.train + splits.eval + splits.sft}
        if tiny.kind == "habits":
            tasks = habits.make_large_eval(tiny.seed, habits_mix(tiny), tiny.n_eval_large, exclude, tiny.assay)
        else:
            tasks = make_large_eval(tiny.seed, tiny.difficulty, tiny.n_eval_large, exclude)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        _write_jsonl(tmp, tasks, "tiny-eval-large", kinds=tiny.kind == "habits")
        os.replace(tmp, path)  # a cache, drawn again in seconds if lost: not fsynced
    return path


def resolve_source(cfg: RunConfig, split: str, source: str | None = None) -> str:
    """`data.<split>` (or `source`) as a loadable path or hub id: `tiny` is the world's `train.jsonl` / `eval.jsonl`,
    `tiny-large` its large eval split (each made when missing); anything else unchanged."""
    if source is None:
        source = cfg.data.train if split == "train" else cfg.data.eval
    if source == TINY:
        paths = tiny_paths(ensure_tiny_world(cfg))
        return str(paths.train if split == "train" else paths.eval)
    if source == TINY_LARGE:
        if split != "eval":
            raise ValueError(f"data.{split}: `{TINY_LARGE}` is an eval split; use `{TINY}` for training prompts")
        return str(ensure_large_eval(cfg))
    return source


def resolve_model_path(cfg: RunConfig) -> str:
    """`model.path`, with `tiny` resolved to the tiny world's model directory (built if needed)."""
    if cfg.model.path == "tiny":
        return str(tiny_paths(ensure_tiny_world(cfg)).model)
    return cfg.model.path


def habits_mix(tiny: TinyWorldConfig) -> habits.Mix:
    return habits.Mix(easy=tiny.mix_easy, fork=tiny.mix_fork, long=tiny.mix_long, unsolvable=tiny.mix_unsolvable)


def world_splits(tiny: TinyWorldConfig) -> Splits:
    """The world's RL train prompts, AIME-sized eval problems and supervised problems (pure in `tiny`)."""
    n_sft = tiny.sft_steps * SFT_BATCH
    if tiny.kind == "habits":
        own = tiny.sft_mix()
        sft_mix = None if own is None else habits.Mix(easy=own[0], fork=own[1], long=own[2], unsolvable=0.0)
        return habits.make_splits(tiny.seed, habits_mix(tiny), tiny.n_train, tiny.n_eval, n_sft, sft_mix, tiny.assay)
    return make_splits(tiny.seed, tiny.difficulty, tiny.n_train, tiny.n_eval, n_sft)


def supervised_solutions(tiny: TinyWorldConfig, tasks: list[Task]) -> list[str]:
    """The supervised phase's response for each task, written with the world's habits (seeded by tiny.seed)."""
    rng = random.Random(f"tinyworld-solutions-{tiny.seed}")
    out = []
    if tiny.kind == "habits":
        h = habits.Habits(
            verbose=tiny.sft_verbose,
            loop=tiny.sft_loop,
            loop_slip=tiny.sft_loop_slip,
            fork_right=tiny.sft_fork_right,
            slip=tiny.sft_corruption,
            verbose_slip=tiny.sft_verbose_slip,
            long_slip=tiny.sft_long_slip,
            combine=tiny.sft_combine,
            fork_right_control=tiny.sft_fork_right_control,
            short_wrong=tiny.sft_short_wrong,
            loop_continue=tiny.sft_loop_continue if tiny.assay == habits.TOKEN_LOSS else 0.0,
            careful=tiny.sft_careful,
        )
        return ["\n".join(habits.solution_lines(t, h, rng)[0]) for t in tasks]
    for t in tasks:
        u, corrupt = rng.random(), rng.random() < tiny.sft_corruption
        guess, verbose = u < tiny.sft_guess, tiny.sft_guess <= u < tiny.sft_guess + tiny.sft_verbose
        lines, _ = solution_lines(
            t, verbose=verbose, corrupt=corrupt, guess=guess, connectives=tiny.sft_connectives, rng=rng
        )
        out.append("\n".join(lines))
    return out


def world_tokenizer(sft_tasks: list[Task], solutions: list[str]) -> PreTrainedTokenizerBase:
    """The world's BPE tokenizer, trained on chat roles, the DAPO template and TOKENIZER_CORPUS problems / solutions."""
    from dapo.data.prompts import apply_dapo_template
    from dapo.tinyworld.tokenizer import train_tokenizer

    corpus = [f"user\n{apply_dapo_template(t.text)}" for t in sft_tasks[:TOKENIZER_CORPUS]]
    corpus += [f"assistant\n{s}" for s in solutions[:TOKENIZER_CORPUS]]
    return train_tokenizer(corpus, VOCAB_SIZE)


def _write_jsonl(path: Path, tasks: list[Task], prefix: str, *, kinds: bool = False) -> None:
    """One problem per line (id, problem, answer, n_ops; with `kinds`, the habits world's problem kind too)."""
    width = len(str(max(1, len(tasks) - 1)))
    with path.open("w") as fh:
        for i, t in enumerate(tasks):
            row = {"id": f"{prefix}-{i:0{width}d}", "problem": t.text, "answer": str(t.answer), "n_ops": t.n_ops}
            if kinds:
                row["kind"] = habits.problem_kind(t.text)
            fh.write(json.dumps(row) + "\n")


def weights_digest(model_dir: str | Path) -> str:
    """SHA-256 of the model's safetensors files, in name order: two builds made the same world when these agree."""
    h = hashlib.sha256()
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def build_tiny_world(
    tiny: TinyWorldConfig, out_dir: str | Path, settings: MeasureSettings, progress: Progress | None = None
) -> dict[str, Any]:
    """Build into `out_dir` (no caching) in a child process with pinned kernels; return its manifest. The build's
    ValueError (a config it cannot build) is raised here with its message."""
    request = {"tiny": tiny.model_dump(mode="json"), "out_dir": str(out_dir), "settings": asdict(settings)}
    threads_env = {k: str(tiny.build_threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env = {**os.environ, **pinned_kernels(tiny.kernels), **threads_env}
    error: dict[str, str] | None = None
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, json.dumps(request)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as child:
        assert child.stdout is not None
        try:
            for line in child.stdout:
                if not line.startswith(_PROTOCOL):
                    sys.stdout.write(line)
                    continue
                msg = json.loads(line[len(_PROTOCOL) :])
                if "progress" in msg and progress is not None:
                    progress(*msg["progress"])
                error = msg.get("error", error)
        except BaseException:  # a stop signal or Ctrl-C in this process: the build must not outlive it
            child.kill()
            raise
    if error is not None:
        raise (ValueError if error["type"] == "ValueError" else RuntimeError)(error["message"])
    if child.returncode != 0:
        raise RuntimeError(f"the tiny world build exited with {child.returncode}; its error is above")
    manifest = read_manifest(out_dir)
    if manifest is None:
        raise RuntimeError(f"the tiny world build wrote no manifest into {out_dir}")
    return manifest


def _child_main(argv: list[str]) -> int:
    """The child process's entry (`_CHILD`): the build of REQUEST, in the environment `build_tiny_world` pinned."""
    import torch

    from dapo.config import TinyWorldConfig

    def say(msg: dict[str, Any]) -> None:
        print(_PROTOCOL + json.dumps(msg), flush=True)

    request = json.loads(argv[0])
    tiny = TinyWorldConfig.model_validate(request["tiny"])
    torch.set_num_threads(tiny.build_threads)
    try:
        _build(
            tiny,
            Path(request["out_dir"]),
            MeasureSettings(**request["settings"]),
            lambda phase, done, total: say({"progress": [phase, done, total]}),
        )
    except Exception as e:  # reported to the parent, which raises it with this message
        say({"error": {"type": type(e).__name__, "message": str(e)}})
        raise
    return 0


def _build(
    tiny: TinyWorldConfig, out_dir: Path, settings: MeasureSettings, progress: Progress | None
) -> dict[str, Any]:
    """Build one world into `out_dir` (in the pinned child) and return its manifest: the stages below, in order."""
    import torch

    from dapo.tinyworld.model import param_count

    report = progress or (lambda phase, done, total: None)
    t0, c0 = time.perf_counter(), time.process_time()
    out = tiny_paths(out_dir)
    out.model.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(tiny.seed)
    splits, solutions = _tasks_stage(tiny, out, report)
    tokenizer = _tokenizer_stage(splits, solutions, report)
    eval_prompts, longest = _prompts_stage(tokenizer, splits, settings.max_prompt_length)
    model, sft = _sft_stage(tiny, tokenizer, splits, solutions, report)
    _save_stage(model, tokenizer, out)
    measured = _measure_stage(tiny, model, tokenizer, splits, eval_prompts, settings, report)
    manifest = {
        "hash": world_hash(tiny),
        "build_version": BUILD_VERSION,
        "seed": tiny.seed,
        "tiny": {k: v for k, v in tiny.model_dump(mode="json").items() if k != "n_eval_large"},
        "recipe": {"sft_batch": SFT_BATCH, "sft_lr": SFT_LR, "n_sft_examples": tiny.sft_steps * SFT_BATCH},
        "created_unix": time.time(),
        "build_seconds": round(time.perf_counter() - t0, 1),
        "build_cpu_seconds": round(time.process_time() - c0, 1),
        "kernels": {**kernels_record(tiny.kernels), "cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "weights_sha256": weights_digest(out.model),
        "param_count": param_count(model),
        "vocab_size": len(tokenizer),
        "max_prompt_tokens": longest,
        "n_train": len(splits.train),
        "n_eval": len(splits.eval),
        "sft": {k: round(v, 4) for k, v in sft.items()},
        **measured,
    }
    out.manifest.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _tasks_stage(tiny: TinyWorldConfig, out: TinyPaths, report: Progress) -> tuple[Splits, list[str]]:
    """1. Tasks: train / eval splits as JSONL, and the supervised problems' solutions (pure in `tiny`)."""
    report("tasks", 0, 1)
    splits = world_splits(tiny)
    solutions = supervised_solutions(tiny, splits.sft)
    _write_jsonl(out.train, splits.train, "tiny-train", kinds=tiny.kind == "habits")
    _write_jsonl(out.eval, splits.eval, "tiny-eval", kinds=tiny.kind == "habits")
    report("tasks", 1, 1)
    return splits, solutions


def _tokenizer_stage(splits: Splits, solutions: list[str], report: Progress) -> PreTrainedTokenizerBase:
    """2. Tokenizer: a byte-level BPE trained on the texts the model will see (`world_tokenizer`)."""
    report("tokenizer", 0, 1)
    tokenizer = world_tokenizer(splits.sft, solutions)
    report("tokenizer", 1, 1)
    return tokenizer


def _prompt_ids(tokenizer: PreTrainedTokenizerBase, tasks: list[Task]) -> list[list[int]]:
    """The ids data.prompts.build_prompt + encode_prompt give, encoded as one batch (19k prompts)."""
    from dapo.data.prompts import build_prompt

    texts = [build_prompt(t.text, tokenizer, use_chat_template=True) for t in tasks]
    return [list(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _prompts_stage(tokenizer: PreTrainedTokenizerBase, splits: Splits, limit: int) -> tuple[list[list[int]], int]:
    """3. Prompts: the eval prompt ids and the longest train / eval prompt, refused above `data.max_prompt_length`."""
    eval_prompts = _prompt_ids(tokenizer, splits.eval)
    longest = max(len(p) for p in eval_prompts + _prompt_ids(tokenizer, splits.train))
    if longest > limit:
        raise ValueError(
            f"tiny world prompts reach {longest} tokens > data.max_prompt_length "
            f"({limit}); raise data.max_prompt_length or lower tiny.difficulty"
        )
    return eval_prompts, longest


def _sft_stage(
    tiny: TinyWorldConfig, tokenizer: PreTrainedTokenizerBase, splits: Splits, solutions: list[str], report: Progress
) -> tuple[Any, dict[str, float]]:
    """4. SFT: the Qwen2 base model trained `tiny.sft_steps` steps on the solutions; (model, loss record)."""
    from dapo.tinyworld.model import SFTExample, make_model, train_sft

    eos = tokenizer.eos_token_id
    responses = tokenizer(solutions, add_special_tokens=False)["input_ids"]
    prompts = _prompt_ids(tokenizer, splits.sft)
    examples = [SFTExample(p, list(r) + [eos]) for p, r in zip(prompts, responses, strict=True)]
    model = make_model(
        len(tokenizer),
        hidden_size=tiny.hidden_size,
        num_layers=tiny.num_layers,
        num_heads=tiny.num_heads,
        tie_embeddings=tiny.tie_embeddings,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        max_positions=MAX_POSITIONS,
        seed=tiny.seed,
    )
    report("sft", 0, tiny.sft_steps)
    sft = train_sft(
        model,
        examples,
        steps=tiny.sft_steps,
        batch_size=SFT_BATCH,
        lr=SFT_LR,
        pad_id=tokenizer.pad_token_id,
        seed=tiny.seed,
        on_step=lambda step, loss: report("sft", step, tiny.sft_steps),
        micro_batches=HABITS_SFT_MICRO_BATCHES if tiny.kind == "habits" else 1,
    )
    return model, sft


def _save_stage(model: Any, tokenizer: PreTrainedTokenizerBase, out: TinyPaths) -> None:
    """5. Save: model, tokenizer and generation config, so AutoModel / AutoTokenizer / vLLM load them offline."""
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    model.save_pretrained(out.model)
    tokenizer.save_pretrained(out.model)


def _measure_stage(
    tiny: TinyWorldConfig,
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    splits: Splits,
    eval_prompts: list[list[int]],
    s: MeasureSettings,
    report: Progress,
) -> dict[str, Any]:
    """6. Measure where RL starts: avg@n / pass@n on the eval split, and the first train prompts' groups at the
    rollout settings (with the habits profile): the manifest's `eval` and `train_groups`, each with its settings."""
    from dapo.tinyworld.measure import measure

    report("measure", 0, 2)
    n, g = s.eval_n, s.group_n
    ev = measure(
        model,
        tokenizer,
        eval_prompts,
        [str(t.answer) for t in splits.eval],
        n=n,
        max_new_tokens=s.max_new_tokens,
        temperature=s.eval_temperature,
        top_p=s.eval_top_p,
        seed=tiny.seed,
    )
    report("measure", 1, 2)
    group_tasks = splits.train[: HABITS_GROUP_PROMPTS if tiny.kind == "habits" else GROUP_PROMPTS]
    gr = measure(
        model,
        tokenizer,
        _prompt_ids(tokenizer, group_tasks),
        [str(t.answer) for t in group_tasks],
        n=g,
        max_new_tokens=s.max_new_tokens,
        temperature=s.group_temperature,
        top_p=s.group_top_p,
        seed=tiny.seed + 1,
        habit_problems=[t.text for t in group_tasks] if tiny.kind == "habits" else None,
    )
    report("measure", 2, 2)
    return {
        "eval": {
            "n": n,
            "temperature": s.eval_temperature,
            "top_p": s.eval_top_p,
            "max_new_tokens": s.max_new_tokens,
            f"avg@{n}": round(ev["avg"], 2),
            f"pass@{n}": round(ev["pass"], 2),
            "truncated_fraction": round(ev["truncated_fraction"], 4),
        },
        "train_groups": {
            "prompts": len(group_tasks),
            "n": g,
            "temperature": s.group_temperature,
            "top_p": s.group_top_p,
            f"avg@{g}": round(gr["avg"], 2),
            "all_correct_fraction": round(gr["all_correct_fraction"], 4),
            "all_wrong_fraction": round(gr["all_wrong_fraction"], 4),
            "truncated_fraction": round(gr["truncated_fraction"], 4),
            **({"habits": gr["habits"]} if "habits" in gr else {}),
        },
    }
