// The key names of a trainer checkpoint's tensors, which more than one layer reads: the
// checkpoint writer and reader (checkpoint/single_file.h, which describes the whole format) and
// model.init_from, which takes a checkpoint's parameters (models/gpt/hf_gpt2.h).
#pragma once

#include <string_view>

namespace io {

// "param.<name>": a parameter of the model, by its name in named_parameters().
inline constexpr std::string_view kParamKeyPrefix = "param.";

}  // namespace io
