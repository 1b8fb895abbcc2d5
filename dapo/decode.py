"""How long a vLLM replica takes to generate a batch: the one decode model behind the dry run's cost and the stop
latency of docs/distributed.md. Synchronous RL waits for the longest response of every batch, so a batch is a sum
over decode steps, not its tokens over a throughput (docs/cost.md, "How long a generation batch takes")."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dapo.shapes import ModelShape

EULER_GAMMA = 0.5772156649
TAIL_CHUNK = 32  # decode steps summed at once in the drain (the running count changes slowly within a chunk)


def kv_bytes_per_token_per_gpu(shape: ModelShape, dtype_bytes: int, tensor_parallel: int) -> int:
    """KV cache bytes one token takes on one GPU (vLLM replicates KV heads when tensor parallel exceeds them)."""
    return shape.layers * max(1, shape.kv_heads // tensor_parallel) * shape.d_head * 2 * dtype_bytes


@dataclass(frozen=True)
class LengthModel:
    """Response lengths: exponential with mean `scale`, cut at `cap`. `LengthModel.of(mean, cap)` finds the scale
    whose capped mean is `mean`."""

    scale: float  # the exponential's mean before the cap (inf: every response runs to the cap)
    cap: int

    @classmethod
    def of(cls, mean: float, cap: int) -> LengthModel:
        if not 0 < mean:
            raise ValueError(f"mean response length must be > 0, got {mean}")
        if mean >= 0.999 * cap:
            return cls(math.inf, cap)
        lo, hi = mean, 1e3 * cap  # capped mean scale * (1 - exp(-cap / scale)) rises with scale from ~0 to cap
        for _ in range(200):
            mid = math.sqrt(lo * hi)
            if mid * -math.expm1(-cap / mid) < mean:
                lo = mid
            else:
                hi = mid
        return cls(hi, cap)

    @property
    def mean(self) -> float:
        return self.cap if math.isinf(self.scale) else self.scale * -math.expm1(-self.cap / self.scale)

    @property
    def truncated(self) -> float:
        """Share of responses that hit the cap."""
        return 1.0 if math.isinf(self.scale) else math.exp(-self.cap / self.scale)

    def survival(self, s: float) -> float:
        """P(length > s)."""
        if s >= self.cap:
            return 0.0
        return 1.0 if math.isinf(self.scale) else math.exp(-s / self.scale)

    def expected_longest(self, n: float) -> float:
        """Expected longest of n responses: scale x H_n for an exponential (H_n, the n-th harmonic number), cut at
        the cap."""
        if math.isinf(self.scale):
            return float(self.cap)
        n = max(1.0, n)
        harmonic = math.log(n) + EULER_GAMMA + 1 / (2 * n)
        return min(float(self.cap), self.scale * harmonic)


@dataclass(frozen=True)
class Replica:
    """One vLLM replica: `tensor_parallel` GPUs sharing one model, with its KV cache and batching limits."""

    shape: ModelShape
    dtype_bytes: int
    tensor_parallel: int
    hbm_tb_s: float  # per GPU
    bf16_tflops: float  # per GPU, dense peak
    efficiency: float  # share of the bandwidth and of the peak a decode step reaches
    step_overhead_s: float  # per decode step: scheduling, sampling, tensor-parallel all-reduces
    kv_tokens: int  # tokens the replica's KV cache holds
    max_seqs: int  # vLLM's max_num_seqs


def decode_step_s(r: Replica, running: float, context: float) -> float:
    """Seconds of one decode step with `running` sequences at context `context`: the slower of reading the weight
    shard and their KV cache and computing their tokens, over `efficiency`, plus the fixed per-step cost."""
    s, tp = r.shape, r.tensor_parallel
    weight_bytes = s.params * r.dtype_bytes / tp
    kv_bytes = running * context * kv_bytes_per_token_per_gpu(s, r.dtype_bytes, tp)
    memory = (weight_bytes + kv_bytes) / (r.hbm_tb_s * 1e12)
    flops = running * (2 * s.matmul_params + 4 * s.layers * s.q_dim * context) / tp
    compute = flops / (r.bf16_tflops * 1e12)
    return max(memory, compute) / r.efficiency + r.step_overhead_s


@dataclass(frozen=True)
class BatchTime:
    prefill_s: float
    queue_s: float  # sequences waiting for a slot: the replica runs full
    drain_s: float  # the last wave, until its longest response ends
    concurrency: float  # sequences at once: all n, unless vLLM's max_num_seqs or the KV cache holds fewer
    longest: float  # expected longest response of the last wave (tokens)
    tokens: float  # response tokens generated
    carried_s: float = 0.0  # carry-over: the responses still running at the stop, finished next step at full rate
    stop: float | None = None  # carry-over: the decode step of the last wave where the batch stops (None: its longest)
    carried_tokens: float = 0.0  # carry-over: tokens those responses still had to generate

    @property
    def seconds(self) -> float:
        return self.prefill_s + self.queue_s + self.drain_s + self.carried_s


def batch_seconds(r: Replica, n: float, prompt: float, lengths: LengthModel) -> BatchTime:
    """A generation batch of `n` sequences (prompt length `prompt`) on one replica: the prefill, a queue phase while
    more wait than the KV cache holds, and the last wave, draining step by step until its longest response ends."""
    s, tp = r.shape, r.tensor_parallel
    n = max(1.0, n)
    m = lengths.mean
    prefill = n * prompt * 2 * s.matmul_params / tp / (r.bf16_tflops * 1e12 * r.efficiency)
    c = max(1.0, min(n, float(r.max_seqs), r.kv_tokens / max(1.0, prompt + m)))  # the KV cache at the mean context
    queue = (n - c) * m * decode_step_s(r, c, prompt + m) / c if n > c else 0.0
    longest = lengths.expected_longest(c)
    return BatchTime(prefill, queue, _drain(r, c, prompt, lengths, longest), c, longest, n * m)


def _drain(r: Replica, c: float, prompt: float, lengths: LengthModel, until: float) -> float:
    """Seconds of a last wave of `c` sequences from its start to decode step `until`, each step as long as the
    sequences still running make it."""
    drain, step = 0.0, 0.0
    while step < until:
        width = min(TAIL_CHUNK, until - step)
        mid = step + width / 2
        drain += width * decode_step_s(r, max(1.0, c * lengths.survival(mid)), prompt + mid)
        step += width
    return drain


def group_stop_step(lengths: LengthModel, group: int, fraction: float) -> float:
    """The decode step by which `fraction` of a wave's groups of `group` responses have all ended (a group ends with its
    longest response): the step t with P(length <= t)^group = fraction; the cap when that is past it."""
    if math.isinf(lengths.scale) or fraction >= 1.0:
        return float(lengths.cap)
    t = -lengths.scale * math.log1p(-(fraction ** (1.0 / group)))
    return min(float(lengths.cap), t)


def carry_batch_seconds(
    r: Replica, n: float, prompt: float, lengths: LengthModel, group: int, stop_fraction: float
) -> BatchTime:
    """A generation batch with carry-over (`rollout.max_staleness` >= 1; docs/cost.md): the same prefill and queue,
    the last wave stopped at the decode step where `stop_fraction` of its groups have ended (`group_stop_step`), and the
    tokens the synchronous drain would decode after it decoded instead in the next step among a full batch, at the
    full wave's rate, after a prefill of the prompt and prefix of each response it continues (the KV of the old
    weights is not reused). In a steady state a step carries in what it carries out: this is the time of one step,
    its tokens the synchronous batch's."""
    full = batch_seconds(r, n, prompt, lengths)
    c, m = full.concurrency, lengths.mean
    stop = min(full.longest, group_stop_step(lengths, group, stop_fraction))
    # the tokens the synchronous drain decodes after `stop`: c x the survival's integral from there to its longest
    if math.isinf(lengths.scale):
        left = full.longest - stop
    else:
        left = lengths.scale * (math.exp(-stop / lengths.scale) - math.exp(-full.longest / lengths.scale))
    carried = c * left
    # the responses still running at `stop` continue from prompt + prefix: their KV is computed again (a prefill)
    running = c * lengths.survival(stop)
    flops = running * (prompt + stop) * 2 * r.shape.matmul_params / r.tensor_parallel
    reprefill = flops / (r.bf16_tflops * 1e12 * r.efficiency)
    carried_s = carried * decode_step_s(r, c, prompt + m) / c + reprefill
    drain = _drain(r, c, prompt, lengths, stop)
    return BatchTime(full.prefill_s, full.queue_s, drain, c, full.longest, n * m, carried_s, stop, carried)
