"""Layers against their Hugging Face counterparts: RoPE tables (default, linear, llama3) and RMSNorm."""

from __future__ import annotations

import pytest
import torch

from tokenspeed.runtime.layers.norm import RMSNorm
from tokenspeed.runtime.layers.rotary import RotaryEmbedding, compute_inv_freq, rope_parameters


@pytest.mark.parametrize(
    "params",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ],
    ids=lambda p: p["rope_type"],
)
def test_inv_freq_matches_transformers(params):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        head_dim=128, hidden_size=4096, num_attention_heads=32, max_position_embeddings=131072
    )
    config.rope_parameters = dict(params)
    if params["rope_type"] == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        ref = LlamaRotaryEmbedding.compute_default_rope_parameters(config, device="cpu")[0]
    else:
        ref = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")[0]
    ours = compute_inv_freq(128, rope_parameters(config))
    torch.testing.assert_close(ours, ref, atol=0, rtol=1e-6)


def test_unknown_rope_type_is_a_clear_error():
    with pytest.raises(ValueError, match="rope type 'yarn' is not supported"):
        RotaryEmbedding(16, 32, {"rope_type": "yarn", "rope_theta": 1e4})


def test_rotary_rotates_by_absolute_position():
    rope = RotaryEmbedding(8, 64, {"rope_type": "default", "rope_theta": 10000.0})
    rope.init_buffers()
    q, k = torch.randn(3, 2, 8), torch.randn(3, 1, 8)
    positions = torch.tensor([0, 5, 63])
    rq, rk = rope(positions, q, k)
    torch.testing.assert_close(rq[0], q[0])  # position 0 is the identity
    # rotation keeps norms, and q.k depends only on the distance between positions
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    a, _ = rope(torch.tensor([7]), q[:1], k[:1])
    _, b = rope(torch.tensor([4]), q[:1], k[:1])
    c, _ = rope(torch.tensor([13]), q[:1], k[:1])
    _, d = rope(torch.tensor([10]), q[:1], k[:1])
    torch.testing.assert_close((a[0, 0] * b[0, 0]).sum(), (c[0, 0] * d[0, 0]).sum(), atol=1e-5, rtol=1e-5)


def test_rmsnorm_with_fused_residual():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    norm, ref = RMSNorm(32, 1e-5), LlamaRMSNorm(32, 1e-5)
    with torch.no_grad():
        w = torch.randn(32)
        norm.weight.copy_(w)
        ref.weight.copy_(w)
    x, residual = torch.randn(5, 32), torch.randn(5, 32)
    torch.testing.assert_close(norm(x), ref(x))
    out, new_residual = norm(x, residual)
    torch.testing.assert_close(new_residual, x + residual)
    torch.testing.assert_close(out, ref(x + residual))
