// What the kernels take from PyTorch: tensors, the empty factories, parallel_for, and
// pybind11 with its tensor casters; included instead of <torch/extension.h>.
//
// Why: <torch/extension.h> brings in the whole C++ front end (autograd, nn, optim, data), and
// a first quantized load compiles three kernels. On an Intel Xeon (family 6, model 167, 2
// cores, g++ -O3; 2026-12-07) its headers alone took 27 s to compile, these 7 s; the
// kernels' compiles went from 42.8 / 30.1 / 29.9 s to 28.8 / 14.0 / 12.8 s (quant_linear,
// row_ops, invariant_attention).
#pragma once
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>
