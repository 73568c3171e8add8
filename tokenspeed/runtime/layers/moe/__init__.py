"""Mixture-of-experts layers: top-k router and the torch reference experts."""

from tokenspeed.runtime.layers.moe.experts import TorchExperts
from tokenspeed.runtime.layers.moe.router import TopKRouter
from tokenspeed.runtime.layers.moe.sparse_block import SparseMoeBlock

__all__ = ["SparseMoeBlock", "TopKRouter", "TorchExperts"]
