#include "ddp/buckets.h"

#include <map>
#include <utility>

namespace ddp {

std::vector<BucketLayout> assign_buckets(const std::vector<ParamMeta>& params,
                                         int64_t first_bucket_bytes, int64_t bucket_bytes) {
  // Per (dtype, device): the open bucket's index in `buckets`, and how many were closed.
  struct Open {
    size_t index;
    int closed = 0;
  };
  std::map<std::pair<int, std::string>, Open> open;
  std::vector<BucketLayout> buckets;
  for (size_t k = params.size(); k-- > 0;) {
    const ParamMeta& p = params[k];
    const auto key = std::make_pair(static_cast<int>(p.dtype), p.device.str());
    const int64_t param_bytes = p.numel * static_cast<int64_t>(c10::elementSize(p.dtype));
    auto it = open.find(key);
    if (it != open.end()) {
      BucketLayout& b = buckets[it->second.index];
      const int64_t cap = it->second.closed == 0 ? first_bucket_bytes : bucket_bytes;
      if (b.bytes() + param_bytes > cap && !b.params.empty()) {
        ++it->second.closed;
        it->second.index = buckets.size();
        buckets.push_back({{}, {}, 0, p.dtype, p.device});
      }
    } else {
      it = open.emplace(key, Open{buckets.size()}).first;
      buckets.push_back({{}, {}, 0, p.dtype, p.device});
    }
    BucketLayout& b = buckets[it->second.index];
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel;
  }
  return buckets;
}

}  // namespace ddp
