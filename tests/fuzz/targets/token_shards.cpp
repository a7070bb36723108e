// A token shard (flat uint16, or llm.c's header with uint16 or uint32 tokens) with its .mask and
// .docs sidecars, through TokenShardDataset (data.path of token data): open, then every window
// read (get, target_count), packed or not. The input: a byte of settings (context 1 to 32, the
// packing, the vocabulary), then the shard, the mask and the boundaries, cut at
// fuzz::kSeparator (a missing one: no such file). Typed error: data::DataError.
#include <ATen/ATen.h>

#include "data/errors.h"
#include "data/token_shards.h"
#include "fuzz_target.h"

namespace {

void write_or_remove(const std::string& name, const std::vector<std::string_view>& parts,
                     size_t i) {
  if (i < parts.size()) {
    fuzz::write_file(name, parts[i]);
  } else {
    fuzz::remove_file(name);
  }
}

}  // namespace

TRAINER_FUZZ_TARGET(token_shards) {
  if (size == 0) return 0;
  const int64_t context = 1 + (data[0] & 31);
  const auto packing = static_cast<data::Packing>((data[0] >> 5) % 3);
  const int64_t vocab = (data[0] & 0x80) != 0 ? 50257 : 128256;
  const auto parts = fuzz::split_parts(fuzz::as_text(data + 1, size - 1), 3);
  const std::string shard = fuzz::write_file("token_shards/shard.bin", parts[0]);
  write_or_remove("token_shards/shard.mask", parts, 1);
  write_or_remove("token_shards/shard.docs", parts, 2);
  try {
    const data::TokenShardDataset dataset({shard}, context, vocab, {}, packing);
    const int64_t n = std::min<int64_t>(dataset.size(), 256);
    if (n == 0) return 0;
    const at::Tensor all = at::arange(n, at::kLong);
    const data::Batch batch = dataset.get(all);
    dataset.target_count(all);
    dataset.packing();
    if (batch.inputs.size(0) != n || batch.targets.size(0) != n) abort();
  } catch (const data::DataError&) {
  }
  return 0;
}
