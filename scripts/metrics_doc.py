"""Write docs/metrics.md, the table of every metric the trainer logs, from `dapo/metric_names.py` itself.

The names, their section (`# --- ...` headers) and their explanations (the comment after a name, or the comment
lines just above it) are read from the module's source, so the page cannot drift from the code:

    python scripts/metrics_doc.py            # rewrite docs/metrics.md
    python scripts/metrics_doc.py --check    # exit 1 if the page is stale (the tests run it)
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
`python scripts/metrics_doc.py` (do not edit by hand). Training metrics are logged once per rollout step
with MLflow `step` = rollout step; `counters/grad_updates` gives the paper's x-axis (gradient updates) at the same
step. Eval metrics are logged into the same run at the rollout step they were taken (step 0 = before training).
Points without a value in a step (e.g. Fig 3a's probability when no token was clipped) are left out, not
logged as 0. Tags name the row, seed, preset, git commit and config hash; params hold the full resolved config.
"""


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
            out.append((section, const, node.value.value, _comment(lines, node.lineno - 1).replace("|", "\\|")))
    return out


def _comment(lines: list[str], i: int) -> str:
    """The comment after line i's assignment, else the comment lines just above it (not a section header)."""
    if "#" in lines[i].split("=", 1)[1]:
        return lines[i].split("#", 1)[1].strip()
    above: list[str] = []
    while i > 0 and lines[i - 1].startswith("# ") and not lines[i - 1].startswith("# ---"):
        i -= 1
        above.insert(0, lines[i][2:].strip())
    return " ".join(above)


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
            print(f"{args.out} is stale: run python scripts/metrics_doc.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
