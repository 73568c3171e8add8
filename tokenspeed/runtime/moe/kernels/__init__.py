"""Triton kernels of the MoE layers: fused routing, alignment by expert, grouped GEMMs, tuned block sizes."""
