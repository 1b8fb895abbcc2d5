"""Rollouts with transformers `generate`: the fallback engine, and the faster one for very small models on a CPU
(vLLM's per-step scheduling dominates at ~1M parameters: BENCHMARKS.md, rollouts).

Simplifications: no paged KV cache or continuous batching (prompts are generated in fixed chunks, left-padded);
`sleep`/`wake_up` move the model off and back onto the GPU (the weights are kept, like vLLM's sleep level 1).
`generate` keeps each step's processed scores ([sequences, V] per step) to read the sampled tokens' log-probs, so
chunks shrink to fit `score_budget_bytes`: fine for small vocabularies (the tiny world); use vLLM for real models.
The log-prob of each sampled token is taken under the *sampling* distribution (after temperature and top-p), as
vLLM's are (`logprobs_mode="processed_logprobs"`): the behaviour policy's log-prob, which the trainer compares with
the learner's and the rollout correction reweights by.

`generate_partial` (carry-over, `rollout.max_staleness`) runs its own decode loop over a KV cache built for the call
(never kept between calls, so a continued response is always computed under the weights synced last): it samples
as `generate` does (temperature, then top-p as transformers' warpers, from torch's generator) and asks the caller's
poll after every decode step whether to stop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from dapo.rollout.base import Continuation, Poll, RolloutEngine, dtype_name, per_prompt_counts
from dapo.rollout.replicas import call_seed, seed_global_generators
from dapo.rollout.sync_check import SyncCheck, digest
from dapo.types import Sample

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFEngine(RolloutEngine):
    """transformers `generate` behind the `RolloutEngine` interface.

    Args:
        model_path: a local Hugging Face model directory (with its tokenizer).
        dtype: "float32" / "bfloat16" / "auto".
        max_model_len: prompt + response cap; `max_tokens` is lowered to fit it.
        seed: seeds torch's generator once; a `generate` call without seeds continues the stream.
        batch_invariant: sample one response per call, each under its own seed (`rollout.batch_invariant`): the
            samples then do not depend on how a batch was split among replicas, at the cost of batching.
        max_batch_sequences: sequences decoded at once (prompts are chunked so P_chunk * n <= this).
        score_budget_bytes: memory for the per-step scores kept during one chunk (at least one prompt's n).
        config_overrides: config.json values set before the model is built (`model.config_overrides`).
    """

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "auto",
        max_model_len: int,
        seed: int = 0,
        max_batch_sequences: int = 512,
        score_budget_bytes: int = 2 << 30,
        config_overrides: Mapping[str, Any] | None = None,
        batch_invariant: bool = False,
    ) -> None:
        from transformers import AutoTokenizer

        from dapo.modeling import load_causal_lm

        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = load_causal_lm(model_path, _DTYPES[dtype_name(dtype)], config_overrides)
        self.model.to(self.device).eval()
        self.max_model_len = max_model_len
        self.max_batch_sequences = max_batch_sequences
        self.score_budget_bytes = score_budget_bytes
        self.generator_seed = seed
        self.batch_invariant = batch_invariant
        torch.manual_seed(seed)
        eos = self.tokenizer.eos_token_id
        gen_eos = self.model.generation_config.eos_token_id
        ids = {eos} if eos is not None else set()
        ids |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        if not ids:
            raise ValueError(f"{model_path}: the tokenizer has no EOS token; responses could never stop")
        self.eos_ids = sorted(ids)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_ids[0]
        # a checkpoint's generation_config.json may carry sampling defaults (instruct models: top_k=20,
        # repetition_penalty=1.05) that transformers merges into ours; sample exactly as asked instead
        from transformers import GenerationConfig

        self.model.generation_config = GenerationConfig(eos_token_id=self.eos_ids, pad_token_id=self.pad_id)
        first: dict[int, str] = {}  # a tied head holds the embedding's tensor, which the learner streams once
        self.sync_check = SyncCheck(
            {n: [first.setdefault(id(p), n)] for n, p in self.model.named_parameters(remove_duplicate=False)},
            self.model.dtype,
        )

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int | Sequence[int],
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seeds: Sequence[Sequence[int]] | None = None,
    ) -> list[list[Sample]]:
        counts = per_prompt_counts(n, len(prompt_ids), seeds)
        if seeds is not None and self.batch_invariant:
            # one response per call, under its own seed: each sample is a function of its seed alone
            out = []
            for p, group_seeds in zip(prompt_ids, seeds, strict=True):
                group = []
                for s in group_seeds:
                    torch.manual_seed(s)
                    group.append(self._generate_chunk([p], 1, max_tokens, temperature, top_p)[0][0])
                out.append(group)
            return out
        if seeds is not None:
            # transformers samples a batch from torch's global generator (CUDA ones included): seeded once per call
            seed_global_generators(call_seed(seeds))
        if len(set(counts)) > 1:  # transformers returns as many sequences for every prompt: one row per sample
            rows = [p for p, k in zip(prompt_ids, counts, strict=True) for _ in range(k)]
            flat = iter(self.generate(rows, 1, max_tokens, temperature, top_p))
            return [[next(flat)[0] for _ in range(k)] for k in counts]
        n = counts[0] if counts else 1
        # sequences per chunk: at most max_batch_sequences, and the kept scores within the byte budget
        seqs = min(self.max_batch_sequences, self.score_budget_bytes // (4 * self.model.config.vocab_size * max_tokens))
        per_chunk = max(1, seqs // n)
        out: list[list[Sample]] = []
        for i in range(0, len(prompt_ids), per_chunk):
            out.extend(self._generate_chunk(prompt_ids[i : i + per_chunk], n, max_tokens, temperature, top_p))
        return out

    def _generate_chunk(
        self, prompts: list[list[int]], n: int, max_tokens: int, temperature: float, top_p: float
    ) -> list[list[Sample]]:
        from transformers import GenerationConfig

        longest = max(len(p) for p in prompts)
        cap = min(max_tokens, self.max_model_len - longest)
        if cap <= 0:
            raise ValueError(f"a prompt of {longest} tokens leaves no room under max_model_len={self.max_model_len}")
        ids = torch.full((len(prompts), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(prompts):  # left padding: every row's last prompt token sits at the same column
            ids[r, longest - len(p) :] = torch.tensor(p)
            mask[r, longest - len(p) :] = 1
        cfg = GenerationConfig(
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=0,  # top_k=0: no default top-50 cut
            max_new_tokens=cap,
            num_return_sequences=n,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
        res = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device), generation_config=cfg
        )
        gen = res.sequences[:, longest:].cpu()  # [P*n, T]
        # scores are the processed logits (after temperature / top-p) that the tokens were sampled from
        logp = (
            torch.stack(
                [
                    torch.log_softmax(s.float(), dim=-1).gather(1, gen[:, t : t + 1].to(s.device)).squeeze(1)
                    for t, s in enumerate(res.scores)
                ],
                dim=1,
            ).cpu()
            if res.scores
            else gen.float()
        )
        is_eos = torch.isin(gen, torch.tensor(self.eos_ids))
        groups: list[list[Sample]] = []
        for r in range(len(prompts)):
            group = []
            for j in range(n):
                row = r * n + j  # generate repeats each prompt n times in place
                hits = is_eos[row].nonzero()
                end = int(hits[0]) + 1 if len(hits) else gen.shape[1]
                resp = gen[row, :end].tolist()
                group.append(
                    Sample(
                        response_ids=resp,
                        logprobs=logp[row, :end].tolist(),
                        finish_reason="stop" if len(hits) else "length",
                        text=self.tokenizer.decode(resp, skip_special_tokens=True),
                    )
                )
            groups.append(group)
        return groups

    @torch.no_grad()
    def generate_partial(
        self, requests: Sequence[Continuation], temperature: float, top_p: float, poll: Poll
    ) -> list[Sample]:
        out: list[Sample | None] = [None] * len(requests)
        if requests:
            seed_global_generators(call_seed([[r.seed for r in requests]]))
        per_chunk = self.max_batch_sequences  # log-probs are taken as it goes: no scores kept
        stopped = False
        for i in range(0, len(requests), per_chunk):
            chunk = list(requests[i : i + per_chunk])
            if not stopped:
                stopped = self._decode_partial(chunk, i, temperature, top_p, poll, out)
            for k, r in enumerate(chunk):  # aborted: what each has so far
                if out[i + k] is None:
                    out[i + k] = r.whole(self.tokenizer, [], [], "abort")
        while not stopped:  # nothing left here: the others' (a collective poll) may still be decoding
            stopped = poll([])
        return out  # type: ignore[return-value]

    def _decode_partial(
        self,
        chunk: list[Continuation],
        offset: int,
        temperature: float,
        top_p: float,
        poll: Poll,
        out: list[Sample | None],
    ) -> bool:
        """Decode `chunk` (left-padded, one KV cache) until every row ends or `poll` stops it; rows that end go into
        `out` at `offset + row`, the others' tokens are kept in `out` as "abort" on a stop. True when stopped."""
        rows = [r.prompt_ids + r.prefix_ids for r in chunk]
        longest = max(len(x) for x in rows)
        caps = [min(r.max_tokens, self.max_model_len - len(x)) for r, x in zip(chunk, rows, strict=True)]
        if min(caps) <= 0:
            raise ValueError(f"a prompt + prefix of {longest} tokens leaves no room under max_model_len")
        ids = torch.full((len(rows), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, x in enumerate(rows):
            ids[b, longest - len(x) :] = torch.tensor(x)
            mask[b, longest - len(x) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        res = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            use_cache=True,
        )
        tokens: list[list[int]] = [[] for _ in rows]
        logps: list[list[float]] = [[] for _ in rows]
        done = [False] * len(rows)
        eos = set(self.eos_ids)
        last = positions[:, -1]
        while True:
            scores = _processed(res.logits[:, -1].float(), temperature, top_p)  # [B, V], as transformers' warpers
            nxt = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
            lp = torch.log_softmax(scores, dim=-1).gather(1, nxt[:, None]).squeeze(1).cpu()
            finished = []
            for b, (tok, logp) in enumerate(zip(nxt.cpu().tolist(), lp.tolist(), strict=True)):
                if done[b]:
                    continue
                tokens[b].append(tok)
                logps[b].append(logp)
                if tok in eos or len(tokens[b]) >= caps[b]:
                    done[b] = True
                    out[offset + b] = chunk[b].whole(
                        self.tokenizer, tokens[b], logps[b], "stop" if tok in eos else "length"
                    )
                    finished.append((offset + b, out[offset + b]))
            if poll(finished):  # type: ignore[arg-type]
                for b in range(len(rows)):
                    if not done[b]:
                        out[offset + b] = chunk[b].whole(self.tokenizer, tokens[b], logps[b], "abort")
                return True
            if all(done):
                return False
            mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype)], dim=1)
            last = last + 1
            res = self.model(
                input_ids=nxt[:, None].to(self.device),
                attention_mask=mask.to(self.device),
                position_ids=last[:, None].to(self.device),
                past_key_values=res.past_key_values,
                use_cache=True,
            )

    def sync_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        self.wake_up()
        # copy_ in place: a tied lm_head shares its storage with the embedding and follows it.
        # state_dict (unlike named_parameters) lists a tied head under its own name too.
        params = self.model.state_dict(keep_vars=True)
        unknown = []
        with torch.no_grad():
            for name, t in self.sync_check.watch(named_tensors):
                dst = params.get(name)
                if dst is None:
                    unknown.append(name)
                    continue
                dst.copy_(t.to(dst.device, dst.dtype))
        if unknown:
            raise KeyError(f"sync_weights: names the engine's model does not have: {unknown[:5]}")
        own = dict(self.model.named_parameters(remove_duplicate=False))  # what the forward reads
        self.sync_check.verify({n: digest(own[n], self.sync_check.dtype) for n in self.sync_check.sample})

    @torch.no_grad()
    def score(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        out = []
        for p, r in zip(prompt_ids, response_ids, strict=True):
            seq = torch.tensor([p + r], device=self.device)
            logits = self.model(input_ids=seq).logits[0, len(p) - 1 : -1].float()  # [len(r), V]
            lp = torch.log_softmax(logits, -1).gather(1, seq[0, len(p) :, None]).squeeze(1)
            out.append(lp.cpu().tolist())
        return out

    def sleep(self) -> None:
        if self.device.type == "cuda":
            self.model.to("cpu")
            torch.cuda.empty_cache()

    def wake_up(self) -> None:
        if self.device.type == "cuda":
            self.model.to(self.device)

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _processed(logits: Tensor, temperature: float, top_p: float) -> Tensor:
    """[B, V] logits as transformers' sampling warpers leave them: divided by the temperature (when not 1), then the
    tokens outside the top-p nucleus at -inf (when top_p < 1; the most likely token always stays)."""
    scores = logits / temperature if temperature != 1.0 else logits
    if top_p >= 1.0:
        return scores
    sorted_scores, order = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= (1 - top_p)
    drop[..., -1:] = False
    return scores.masked_fill(drop.scatter(1, order, drop), -float("inf"))
