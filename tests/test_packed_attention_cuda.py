"""The packed attention's CUDA branch on a CPU (issue 67): PyTorch's varlen flash kernel is CUDA-only, so these tests
take the branch by replacing its device and dtype checks (`dapo.modeling._on_cuda`, `FLASH_DTYPES`) and the kernel
with stand-ins that copy each supported torch release's `varlen_attn` signature exactly (read in each release's
torch/nn/attention/varlen.py: 2.10 for vLLM 0.17-0.19, 2.11 for 0.20-0.26, 2.13 for 0.27-0.32, 2.14 for 0.33; 2.9.1,
vLLM 0.16's, has no varlen module) and compute what the kernel computes in float64, checking what the kernel would
refuse. The branch must equal the exact path (SDPA per sequence) forward and backward. What no CPU can show: the
CUDA kernels' own numerics, which `scripts/gpu_check.py`'s packing part measures on a GPU."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from dapo import modeling
from dapo.modeling import ATTENTION_CALLS, PackedRow, VarlenCall, _per_sequence, packed_attention, varlen_call

F64 = torch.float64


def _flash(query, key, value, cu_q, cu_k, max_q, max_k, causal, scale, gqa):
    """What the flash kernel computes, in float64: each sequence's queries [T_q, H_q, D] against its keys
    [T_k, H_kv, D], causal aligned to the bottom right (query t of n sees key s of m where s <= t + m - n, as
    FlashAttention 2 does), softmax scaled by `scale` (None: 1/sqrt(D)); grouped heads only with `gqa`, query head h
    reading KV head h // (H_q / H_kv). Refuses what the kernel cannot take."""
    for t in (query, key, value):
        assert t.dim() == 3 and t.stride(-1) == 1, "the kernel takes [total_tokens, heads, head_dim], last dim dense"
    for cu, total, longest in ((cu_q, query.shape[0], max_q), (cu_k, key.shape[0], max_k)):
        assert cu.dtype == torch.int32 and cu.device == query.device and int(cu[-1]) == total
        assert isinstance(longest, int) and longest == int((cu[1:] - cu[:-1]).max())
    heads_q, heads_kv = query.shape[1], key.shape[1]
    if heads_q != heads_kv:
        if not gqa:
            raise ValueError(f"Expect query and key/value to have the same number of heads, got {heads_q}, {heads_kv}")
        key, value = (t.repeat_interleave(heads_q // heads_kv, dim=1) for t in (key, value))
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    outs = []
    for a, b, c, d in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), cu_k[:-1].tolist(), cu_k[1:].tolist(), strict=True):
        q, k, v = query[a:b].transpose(0, 1), key[c:d].transpose(0, 1), value[c:d].transpose(0, 1)
        scores = q @ k.transpose(1, 2) * scale
        n, m = b - a, d - c
        if causal:
            seen = torch.arange(m)[None, :] <= torch.arange(n)[:, None] + (m - n)
            scores = scores.masked_fill(~seen, float("-inf"))
        outs.append((scores.softmax(-1) @ v).transpose(0, 1))
    return torch.cat(outs)


def varlen_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    return _flash(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, None, gqa=False)


def varlen_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                window_size=(-1, -1)):  # fmt: skip
    causal = window_size == (-1, 0)  # torch compares the tuple: a list [-1, 0] would not be causal
    assert causal or window_size == (-1, -1), window_size
    return _flash(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, causal, scale, gqa=False)


def varlen_2_13(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):  # fmt: skip
    causal = window_size == (-1, 0)
    assert causal or window_size == (-1, -1), window_size
    assert seqused_k is None and block_table is None, "inference-only: no backward"
    return _flash(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, causal, scale, gqa=enable_gqa)


KERNELS = {"2.10": varlen_2_10, "2.11": varlen_2_11, "2.13": varlen_2_13, "2.14": varlen_2_13}  # 2.14 = 2.13's


@pytest.fixture
def cuda_branch(monkeypatch):
    """Take the CUDA branch on a CPU in float64 with the given kernel; returns a setter."""
    monkeypatch.setattr(modeling, "_on_cuda", lambda t: True)
    monkeypatch.setattr(modeling, "FLASH_DTYPES", (F64,))

    def use(kernel):
        monkeypatch.setattr(modeling, "varlen_kernel", lambda: kernel)

    return use


def _qkv(heads_q: int, heads_kv: int, length: int, seed: int = 0, d: int = 8) -> list[torch.Tensor]:
    """Query [1, H_q, L, D], key and value [1, H_kv, L, D] as transformers hands them over (from [1, L, H, D] views,
    so not contiguous), leaves that take gradients."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, length, h, d, generator=g, dtype=F64).transpose(1, 2).requires_grad_()
            for h in (heads_q, heads_kv, heads_kv)]  # fmt: skip


ROWS = {
    "sequences": PackedRow((0, 5, 6, 13, 16)),
    # `prompts`: a prompt of 4, two responses behind it, a sequence alone, a prompt of 2 and one response
    "prompts": PackedRow((0, 4, 9, 12, 15, 17, 20), ((0, 0), (0, 4), (0, 4), (0, 0), (0, 0), (15, 17))),
}


def _run(fn, qkv, grad_out):
    out = fn(*qkv)
    return out.detach(), torch.autograd.grad(out, qkv, grad_out)


@pytest.mark.parametrize("version", list(KERNELS))
@pytest.mark.parametrize("layout", list(ROWS))
@pytest.mark.parametrize("heads", [(4, 2), (4, 4)], ids=["gqa", "mha"])
@pytest.mark.parametrize("scaling", [8**-0.5, 0.3], ids=["default-scale", "other-scale"])
def test_the_cuda_branch_equals_the_exact_path_under_every_torch_signature(
    cuda_branch, monkeypatch, version, layout, heads, scaling
):
    """Forward and backward through the varlen branch (torch 2.10: no `scale`, `is_causal`; 2.11: `window_size`;
    2.13 and 2.14: `enable_gqa`) equal SDPA per sequence to float64 rounding; under `prompts` each response's keys
    are its prompt's and its own, so no mask is built and SDPA is never called."""
    cuda_branch(KERNELS[version])
    row = ROWS[layout]
    qkv = _qkv(*heads, row.bounds[-1])
    grad_out = torch.randn(1, row.bounds[-1], heads[0], 8, generator=torch.Generator().manual_seed(9), dtype=F64)
    exact, exact_grads = _run(lambda q, k, v: _per_sequence(q, k, v, scaling, row).transpose(1, 2), qkv, grad_out)

    def no_sdpa(*args, **kwargs):
        raise AssertionError("the CUDA branch called SDPA")

    monkeypatch.setattr(F, "scaled_dot_product_attention", no_sdpa)
    before = ATTENTION_CALLS["varlen"]
    out, grads = _run(lambda q, k, v: packed_attention(None, q, k, v, None, scaling=scaling, packed_row=row)[0],
                      qkv, grad_out)  # fmt: skip
    assert ATTENTION_CALLS["varlen"] == before + 1
    assert (out - exact).abs().max() <= 1e-12
    for g, e in zip(grads, exact_grads, strict=True):
        assert (g - e).abs().max() <= 1e-12


def test_each_release_is_called_with_only_what_it_takes():
    """Qwen2.5's 12 query heads over 2 KV heads of 128, its scaling 1/sqrt(128): 2.10 takes no scale (the kernel's
    own is that one: the query is left alone) and no grouped heads; 2.11 a scale; 2.13 and 2.14 grouped heads."""
    params = {v: frozenset(inspect.signature(k).parameters) for v, k in KERNELS.items()}
    s = 128**-0.5
    assert varlen_call(params["2.10"], 128, s, 12, 2) == VarlenCall({"is_causal": True}, repeat_kv=6)
    assert varlen_call(params["2.10"], 128, 0.05, 12, 12) == VarlenCall(
        {"is_causal": True}, query_scale=0.05 * 128**0.5
    )
    assert varlen_call(params["2.11"], 128, s, 12, 2) == VarlenCall({"window_size": (-1, 0), "scale": s}, repeat_kv=6)
    for v in ("2.13", "2.14"):
        assert varlen_call(params[v], 128, s, 12, 2) == VarlenCall(
            {"window_size": (-1, 0), "scale": s, "enable_gqa": True}
        )


def test_the_stand_ins_have_the_installed_torchs_signature():
    """The 2.13 stand-in takes exactly the parameters of the torch installed here (2.13.0), in order and kind."""
    real = pytest.importorskip("torch.nn.attention.varlen").varlen_attn
    if not torch.__version__.startswith("2.13"):
        pytest.skip(f"torch {torch.__version__}: the stand-ins are checked against 2.13")
    kinds = [(p.name, p.kind) for p in inspect.signature(real).parameters.values()]
    assert kinds == [(p.name, p.kind) for p in inspect.signature(varlen_2_13).parameters.values()]


@pytest.mark.parametrize("version", ["2.10", "2.13"])
def test_the_cuda_branch_runs_rows_given_without_a_packed_row(cuda_branch, version):
    """Called without `packed_row` (a batch of whole sequences, off the learner's path) the branch reads no other
    kwarg, and returns (output [B, L, H, D], None) as transformers unpacks it."""
    cuda_branch(KERNELS[version])
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(3, h, 7, 8, generator=g, dtype=F64) for h in (4, 2, 2))
    out, weights = packed_attention(None, q, k, v, None, scaling=8**-0.5)
    alone = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
    assert weights is None and out.shape == (3, 7, 4, 8)
    assert (out - alone).abs().max() <= 1e-12


def test_float32_on_a_gpu_never_sends_sdpa_a_mask_with_grouped_heads(monkeypatch):
    """On a GPU outside the flash kernel's dtypes (a float32 model) each response of a `prompts` row goes to SDPA
    with its mask; CUDA's SDPA takes grouped heads only in kernels that refuse a mask, so with grouped heads and a
    mask it falls to the math kernel and builds H_q x n x (p + n) scores. The stand-in SDPA refuses that case."""
    monkeypatch.setattr(modeling, "_on_cuda", lambda t: True)  # FLASH_DTYPES as they are: float64 is not among them
    sdpa = F.scaled_dot_product_attention
    masked = []

    def cuda_sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None:
            masked.append(attn_mask.shape)
            assert q.shape[1] == k.shape[1] and not enable_gqa, "the math kernel: a mask with grouped heads"
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    row = ROWS["prompts"]
    q, k, v = _qkv(4, 2, row.bounds[-1])
    exact = _per_sequence(q, k, v, None, row).transpose(1, 2)
    monkeypatch.setattr(F, "scaled_dot_product_attention", cuda_sdpa)
    out, _ = packed_attention(None, q, k, v, None, packed_row=row)
    assert masked == [(5, 9), (3, 7), (3, 5)]  # the three responses, each behind its prompt
    assert (out - exact).abs().max() <= 1e-12


@pytest.mark.parametrize("version", ["2.10", "2.13"])
def test_a_qwen2_through_the_cuda_branch_equals_it_run_sequence_by_sequence(cuda_branch, tmp_path, version):
    """Through a real Qwen2 (grouped heads) in float64: the packed row's hidden states through the CUDA branch are
    each sequence's run alone under transformers' own SDPA attention, as the model hands the branch its kwargs."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from dapo.modeling import ATTENTION_PACKED, load_causal_lm

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    Qwen2ForCausalLM(cfg).save_pretrained(tmp_path / "m")
    plain = load_causal_lm(str(tmp_path / "m"), F64)
    packed = load_causal_lm(str(tmp_path / "m"), F64, attention=ATTENTION_PACKED)
    cuda_branch(KERNELS[version])
    lengths = (6, 3, 9)
    ids = torch.randint(1, 50, (1, sum(lengths)), generator=torch.Generator().manual_seed(1))
    bounds = (0, 6, 9, 18)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    before = ATTENTION_CALLS["varlen"]
    with torch.no_grad():
        h = packed.model(input_ids=ids, position_ids=positions, packed_row=PackedRow(bounds)).last_hidden_state[0]
        alone = torch.cat([plain.model(input_ids=ids[:, a:b]).last_hidden_state[0]
                           for a, b in zip(bounds, bounds[1:], strict=False)])  # fmt: skip
    assert ATTENTION_CALLS["varlen"] == before + cfg.num_hidden_layers
    assert (h - alone).abs().max() <= 1e-10
