"""`dapo prepare-data`: resolve a run's train and eval sources (a hub id, a local .parquet/.jsonl path, or the tiny
world's `tiny` / `tiny-large`), load and deduplicate them, write `<out>/train.jsonl` and `<out>/eval.jsonl` (raw
problem text: the template is applied when prompts are built) and print the counts. With the model's tokenizer at
hand (the tiny world's, or a local model directory), prompts longer than `data.max_prompt_length` are dropped here."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dapo.commands.config import add_config_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument("--out", required=True, help="Directory for train.jsonl and eval.jsonl.")
    p.add_argument(
        "--no-length-filter",
        action="store_true",
        help="Keep prompts longer than data.max_prompt_length (the trainer filters them again).",
    )


def run(args: argparse.Namespace) -> int:
    from dapo.config import load_config
    from dapo.data.loaders import DataError, load_problems_with_stats, places_note, write_problems
    from dapo.tinyworld.build import TINY, TINY_LARGE, resolve_source

    cfg = load_config(args.config, preset=args.preset, overrides=args.overrides)
    tiny_dir = None
    # the tiny world is built only when its files or its tokenizer are needed
    if {cfg.data.train, cfg.data.eval} & {TINY, TINY_LARGE} or (cfg.model.path == "tiny" and not args.no_length_filter):
        from dapo.tinyworld.build import ensure_tiny_world

        tiny_dir = ensure_tiny_world(cfg)
    tokenizer = None if args.no_length_filter else _tokenizer_or_none(cfg, tiny_dir)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "eval"):
        resolved = resolve_source(cfg, split)
        try:
            problems, stats = load_problems_with_stats(resolved)
        except DataError as e:
            print(f"dapo prepare-data: {e}", file=sys.stderr)
            return 2
        dropped, dropped_at = 0, []
        if tokenizer is not None:
            from dapo.data.prompts import tokenize_problems

            kept, _, dropped = tokenize_problems(
                problems,
                tokenizer,
                use_chat_template=cfg.data.use_chat_template,
                max_prompt_length=cfg.data.max_prompt_length,
            )
            kept_ids = {id(p) for p in kept}
            dropped_at = [where for p, where in zip(problems, stats.origins, strict=True) if id(p) not in kept_ids]
            problems = kept
        n = write_problems(out / f"{split}.jsonl", problems)
        print(
            f"{split}: {n} problems -> {out / f'{split}.jsonl'}  ({stats.describe(resolved)}, "
            f"{dropped} over {cfg.data.max_prompt_length} prompt tokens dropped{places_note(dropped_at[:3])})"
        )
        if n == 0:
            why = "the source has no usable rows"
            if dropped:
                why = (
                    f"data.max_prompt_length={cfg.data.max_prompt_length} "
                    f"(from {cfg.source_of('data.max_prompt_length')}) drops every prompt; raise it"
                )
            print(f"dapo prepare-data: no {split} problems left from {resolved}: {why}", file=sys.stderr)
            return 2
    return 0


def _tokenizer_or_none(cfg, tiny_dir: Path | None):  # noqa: ANN001, ANN202 (config and tokenizer types are heavy)
    """The run model's tokenizer if it can be loaded offline, else None (and say so)."""
    from transformers import AutoTokenizer

    path = str(tiny_dir / "model") if cfg.model.path == "tiny" and tiny_dir is not None else cfg.model.path
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        print(f"note: prompt length filter skipped: tokenizer for {path} not available offline ({type(e).__name__})")
        return None
