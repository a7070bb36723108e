#include "ddp/gather.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

namespace ddp {

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& text) {
  constexpr int64_t kSlot = 1024;
  const auto bytes = at::TensorOptions().dtype(at::kByte);
  at::Tensor mine = at::zeros({kSlot}, bytes);
  std::memcpy(mine.data_ptr(), text.data(), std::min<size_t>(text.size(), kSlot - 1));
  at::Tensor all = at::zeros({kSlot * comm.size()}, bytes);
  comm.all_gather(all, mine, "string gather");
  std::vector<std::string> out;
  const auto* base = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < comm.size(); ++r) out.emplace_back(base + r * kSlot);
  return out;
}

}  // namespace ddp
