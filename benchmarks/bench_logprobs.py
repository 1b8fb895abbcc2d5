"""The log-prob and entropy head: the library's chunked head (`dapo.algos.logprobs.chunked_logprobs_entropy`, the
one the learner runs) versus naive (full logits), peak memory and time, forward and forward + backward, at a 152K
vocabulary (Qwen2.5's 152,064 rows).

    .venv/bin/python benchmarks/bench_logprobs.py [--quick] [--hidden 1024] [--tokens 1024 4096 16384]
        [--chunks 1024 256]        # 256: trainer.logprob_chunk_size's default

Memory: each case runs in a fresh subprocess; once the inputs (hidden [T, H], head [V, H], targets) exist, the
RSS high-water mark is reset (`/proc/self/clear_refs`) and the reported "extra" is the mark (VmHWM) minus the RSS
then, so it is what the head itself needs, gradients of hidden and head included. glibc's malloc is told to
return every buffer of 1 MiB or more to the system when freed (MALLOC_MMAP_THRESHOLD_), so the mark counts live
memory, not the allocator's cache. (tracemalloc does not see torch's
allocations, and torch.cuda is not available here.) Naive is skipped where its estimate (about 4.5 x T x V x 4
bytes) would not fit in 20 GB or in the memory available now. Times: median of the repetitions inside the case's
process (one warm-up first); cases alternate chunked / naive.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

VOCAB = 152064


def status_bytes(key: str) -> int:
    """VmRSS or VmHWM (the high-water mark) of this process, from /proc/self/status."""
    m = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    return int(m.group(1)) * 1024 if m else 0


def run_case(method: str, tokens: int, hidden: int, chunk: int, reps: int, vocab: int = VOCAB) -> dict:
    """Inside the subprocess: one case. Returns times (s) and memory (bytes)."""
    import torch

    from dapo.algos.logprobs import chunked_logprobs_entropy, naive_logprobs_entropy

    torch.manual_seed(0)
    h = (torch.randn(tokens, hidden) * 0.5).requires_grad_(True)
    w = (torch.randn(vocab, hidden) / hidden**0.5).requires_grad_(True)
    y = torch.randint(0, vocab, (tokens,))
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark to the RSS now
    base = status_bytes("VmRSS")

    def fwd():
        if method == "naive":
            return naive_logprobs_entropy(h, w, y)
        return chunked_logprobs_entropy(h, w, y, chunk_size=chunk)

    def fwd_bwd():
        lp, ent = fwd()
        (lp.sum() + 0.01 * ent.sum()).backward()
        h.grad = w.grad = None

    out = {}
    with torch.no_grad():
        if tokens <= 4096:  # a warm-up; at 16K tokens one pass takes minutes on 2 cores and warms nothing more
            fwd()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fwd()
            ts.append(time.perf_counter() - t0)
    out["fwd_s"] = sorted(ts)[len(ts) // 2]
    peak_fwd = status_bytes("VmHWM")
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fwd_bwd()
        ts.append(time.perf_counter() - t0)
    out["fwd_bwd_s"] = sorted(ts)[len(ts) // 2]
    out["peak_fwd_extra"] = peak_fwd - base
    out["peak_extra"] = status_bytes("VmHWM") - base
    out["base"] = base
    return out


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: method,tokens,hidden,chunk,reps,vocab
    ap.add_argument("--quick", action="store_true", help="1K tokens, hidden 256, a 32K vocabulary, nothing recorded")
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--tokens", type=int, nargs="*", default=[1024, 4096, 16384])
    ap.add_argument("--chunks", type=int, nargs="*", default=[1024, 256])
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--methods", nargs="*", default=["chunked", "naive"], choices=["chunked", "naive"])
    args = ap.parse_args()
    if args.case:
        m, t, h, c, r, v = args.case.split(",")
        print(json.dumps(run_case(m, int(t), int(h), int(c), int(r), int(v))))
        return

    from _common import fmt, machine, md_table, print_table, record

    info = machine()
    if args.quick:
        args.hidden, args.tokens, args.chunks, args.reps, args.vocab = 256, [1024], [256], 1, 32768
    rows, results = [], {}
    for t in args.tokens:
        # above 4K tokens only the first chunk size: one pass there takes minutes on 2 cores
        chunks = args.chunks if t <= 4096 else args.chunks[:1]
        cases = [("chunked", c) for c in chunks] if "chunked" in args.methods else []
        cases += [("naive", 0)] if "naive" in args.methods else []
        for method, c in cases:
            need = 4.5 * t * args.vocab * 4
            if method == "naive" and need > min(20e9, mem_available() - 3e9):
                rows.append([t, method, "-", f"skipped: needs ~{need / 1e9:.0f} GB", "", "", "", ""])
                continue
            cmd = [sys.executable, __file__, "--case", f"{method},{t},{args.hidden},{c},{args.reps},{args.vocab}"]
            env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(2**20))
            p = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
            if p.returncode != 0:
                rows.append(
                    [t, method, c or "-", f"failed rc={p.returncode}: {p.stderr.strip()[-120:]}", "", "", "", ""]
                )
                continue
            r = json.loads(p.stdout.strip().splitlines()[-1])
            results[(t, method, c)] = r
            rows.append(
                [
                    t,
                    method,
                    c or "-",
                    f"{r['peak_fwd_extra'] / 2**20:,.0f}",
                    f"{r['peak_extra'] / 2**20:,.0f}",
                    f"{r['base'] / 2**20:,.0f}",
                    fmt(r["fwd_s"] * 1e3),
                    fmt(r["fwd_bwd_s"] * 1e3),
                ]
            )
    # memory ratios against naive at the same T
    ratios = []
    for (t, method, c), r in results.items():
        nv = results.get((t, "naive", 0))
        if method != "naive" and nv:
            ratios.append(
                [
                    t,
                    f"{method} {c}",
                    f"{r['peak_extra'] / nv['peak_extra']:.3f}",
                    f"{nv['fwd_bwd_s'] / r['fwd_bwd_s']:.2f}x",
                ]
            )
    header = [
        "tokens T",
        "method",
        "chunk",
        "peak extra MiB (fwd, no grad)",
        "peak extra MiB (fwd+bwd)",
        "RSS of inputs MiB",
        "fwd ms",
        "fwd+bwd ms",
    ]
    print_table(f"log-probs + entropy head, V={args.vocab}, H={args.hidden}, float32", header, rows)
    rheader = ["tokens T", "method, chunk", "peak extra chunked / naive (fwd+bwd)", "naive time / chunked time"]
    print_table("chunked versus naive", rheader, ratios)
    if not args.quick:
        body = (
            f"V = {args.vocab}, H = {args.hidden}, float32; {args.reps} timed repetition(s) per case after a warm-up "
            f"(none at 16K tokens), "
            f"fresh process per case.\n\n{md_table(header, rows)}\n\n{md_table(rheader, ratios)}"
        )
        section = "logprobs" if args.methods == ["chunked", "naive"] else "logprobs_" + "_".join(args.methods)
        record(section, ".venv/bin/python benchmarks/bench_logprobs.py " + " ".join(sys.argv[1:]), info, body)


if __name__ == "__main__":
    main()
