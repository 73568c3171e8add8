"""Token embedding and LM head, separate classes so a tensor-parallel pass can split the vocabulary."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenspeed.runtime.layers.linear import UNQUANTIZED, Unquantized, copy_weight


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)

    def load(self, param_name: str, tensor: torch.Tensor, name: str) -> int:
        return copy_weight(self.weight, tensor, name)


class LMHead(nn.Module):
    """Hidden states of the sampled positions -> float32 logits over the vocabulary."""

    quant: Unquantized = UNQUANTIZED  # how it multiplies (`layers/dense_gemv.py` may hand it another)

    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.quant.logits(self, hidden)

    def load(self, param_name: str, tensor: torch.Tensor, name: str) -> int:
        return copy_weight(self.weight, tensor, name)

    def tie_to(self, embedding: VocabEmbedding) -> None:
        self.weight = embedding.weight
