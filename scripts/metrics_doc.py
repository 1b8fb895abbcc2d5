"""Write docs/metrics.md, the table of every metric the trainer logs, from `dapo/metric_names.py` itself.

The names, their section (`# --- ...` headers) and their explanations (trailing comments) are read from the
module's source, so the page cannot drift from the code:

    python -m dapo.trainer.metrics_doc            # rewrite docs/metrics.md
    python -m dapo.trainer.metrics_doc --check    # exit 1 if the page is stale (CI)
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
from pathlib import Path

from dapo import metric_names as M
from dapo.config import REPO_ROOT

DOC = REPO_ROOT / "docs" / "metrics.md"

# Where each group is logged from, and against which x-axis.
_INTRO = """# Metrics

Every metric a training run logs to MLflow, generated from `dapo/metric_names.py` by
`python -m dapo.trainer.metrics_doc` (do not edit by hand). Training metrics are logged once per rollout step
with MLflow `step` = rollout step; `counters/grad_updates` gives the paper's x-axis (gradient updates) at the same
step. Eval metrics are logged into the same run at the rollout step they were taken (step 0 = before training).
Points without a value in a step (e.g. Fig 3a's probability when no token was clipped) are left out, not
logged as 0. Tags name the row, seed, preset, git commit and config hash; params hold the full resolved config.
"""


# Explanations for names that carry no trailing comment in metric_names.py (a comment there wins).
_FALLBACK = {
    "ROLLOUT_STEP": "rollout steps completed (MLflow `step` of every training metric; the lr schedule's unit)",
    "GRAD_UPDATES": "optimizer updates so far (the paper's x-axis: 16 per rollout step at full scale)",
    "ALL_WRONG_FRAC": "groups with every response wrong (before filtering)",
    "OVERLONG_PENALTY_MEAN": "mean soft overlong penalty R_length (Eq. 13) of the trained responses; 0 when off",
    "ADV_MEAN": "mean advantage over trained responses (about 0 by construction)",
    "ADV_ABS_MEAN": "mean absolute advantage over trained responses",
    "RESP_LEN_MEAN": "mean response length in tokens (trained groups)",
    "RESP_LEN_MAX": "longest response in tokens (trained groups)",
    "POLICY_LOSS": "policy-gradient loss, mean over the step's updates",
    "GRAD_NORM": "gradient norm before clipping, mean over the step's updates",
    "LR": "learning rate in effect during the step",
    "DUAL_CLIPFRAC": "fraction of loss tokens where the dual-clip bound (A < 0) was active; 0 when off",
    "DS_GEN_BATCHES": "generation batches this step (1 without dynamic sampling)",
    "DS_GROUPS_KEPT": "groups that trained this step",
    "TIME_GENERATE": "generation (the slowest replica of each generation batch), summed over the step's batches",
    "TIME_SCORE": "reward verification (the slowest replica), summed over the step's generation batches",
    "TIME_OLD_LOGPROB": "old-policy log-probs and entropy (learner forward)",
    "TIME_UPDATE": "all mini-batch updates of the step",
    "TIME_SYNC": "weight sync learner -> rollout engine (every rank into its own replica, streamed)",
    "TIME_EVAL": "evaluation (logged at eval steps)",
    "TIME_STEP": "the whole rollout step",
    "TIME_TOTAL": "wall time since the run started, earlier attempts (before a resume) included",
    "EVAL_TRUNC_FRAC": "fraction of eval samples that hit the generation cap",
    "EVAL_LEN_MEAN": "mean eval response length in tokens",
    "TAG_ROW": "tag: ablation row, e.g. 05_dynamic_sampling",
    "TAG_SEED": "tag: trainer.seed",
    "TAG_PRESET": "tag: scale preset (tiny, qwen2.5-32b)",
    "TAG_GIT": "tag: git commit of the code (`-dirty` with uncommitted changes)",
    "TAG_CONFIG_HASH": "tag: hash of everything that changes the computation",
}


def _entries() -> list[tuple[str, str, str, str]]:
    """(section, constant, metric name, explanation) in source order."""
    src = inspect.getsource(M)
    lines = src.splitlines()
    section = ""
    out = []
    tree = ast.parse(src)
    headers = {i + 1: ln.strip("# -").strip() for i, ln in enumerate(lines) if ln.startswith("# ---")}
    for node in tree.body:
        for ln in sorted(h for h in headers if h < node.lineno):
            section = headers.pop(ln)
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            const = node.targets[0].id
            if not const.isupper() or not any(c in node.value.value for c in "/."):
                continue
            line = lines[node.lineno - 1]
            comment = line.split("#", 1)[1].strip() if "#" in line.split("=", 1)[1] else ""
            comment = (comment or _FALLBACK.get(const, "")).replace("|", "\\|")
            out.append((section, const, node.value.value, comment))
    return out


def render() -> str:
    parts = [_INTRO]
    current = None
    for section, const, name, comment in _entries():
        if section != current:
            current = section
            parts.append(f"\n## {section[:1].upper() + section[1:]}\n\n| metric | constant | meaning |\n|---|---|---|")
        parts.append(f"| `{name}` | `{const}` | {comment} |")
    ks = "k"
    parts.append(f"""
## Evaluation (logged by the trainer at every `eval.every` rollout steps and at the end)

| metric | helper | meaning |
|---|---|---|
| `{M.eval_avg(1).replace("1", ks)}` | `eval_avg(k)` | mean accuracy over all problems x n samples (the paper's avg@32) |
| `{M.eval_pass(1).replace("1", ks)}` | `eval_pass(k)` | unbiased pass@k, 1 - C(n-c, k)/C(n, k), for each k in `eval.pass_k` |
| `{M.eval_maj(1).replace("1", ks)}` | `eval_maj(k)` | majority-vote accuracy over the n samples |
| `<metric>_ci_low`, `<metric>_ci_high` | `ci_low`, `ci_high` | bootstrap confidence interval (`eval.confidence`) |
| `{M.TIME_EVAL}` | `TIME_EVAL` | seconds the evaluation took |
""")
    return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="Exit 1 if docs/metrics.md is out of date.")
    p.add_argument("--out", type=Path, default=DOC)
    args = p.parse_args(argv)
    text = render()
    if args.check:
        if not args.out.is_file() or args.out.read_text() != text:
            print(f"{args.out} is stale: run python -m dapo.trainer.metrics_doc", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
