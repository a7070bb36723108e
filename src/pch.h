// Precompiled header: the LibTorch and library headers most translation units need. Narrow
// LibTorch headers only (no torch/torch.h): the build must stay quick on 2 cores.
#pragma once

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <memory>
#include <string>
#include <vector>
