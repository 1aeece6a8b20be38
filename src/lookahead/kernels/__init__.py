"""Compiled kernels for linear layers, and their PyTorch references."""
