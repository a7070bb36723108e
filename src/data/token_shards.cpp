#include "data/token_shards.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <tuple>

#include <dirent.h>
#include <sys/stat.h>

#include "core/shape.h"
#include "data/errors.h"
#include "data/mapped_file.h"
#include "data/readers.h"
#include "data/token_shard.h"

namespace data {
namespace {

// The .bin files of `dir`, sorted by name. `key` names the config key for the message.
std::vector<std::string> bin_files(const std::string& dir, const char* key) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    throw DataError(
        fmt::format("{}: cannot open the directory {}: {}", key, dir, std::strerror(errno)));
  }
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".bin") == 0) out.push_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TokenShardDataset::TokenShardDataset(const std::vector<std::string>& files, int64_t context,
                                     int64_t vocab_size,
                                     const std::vector<std::string>& validation_files,
                                     Packing packing, const std::string& preference)
    : files_(files), context_(context), vocab_size_(vocab_size) {
  if (files.empty()) throw DataError("data.path: no token shards (.bin files) to read");
  if (context < 1) throw DataError(fmt::format("data.context must be positive, got {}", context));
  if (vocab_size < 1)
    throw DataError(fmt::format("data.vocab_size must be positive, got {}", vocab_size));
  open_shards(files);
  check_pairs(preference);
  if (pairs_) {
    window_pairs();
  } else if (resolve_packing(packing); packing_ == Packing::kDocuments) {
    window_documents();
  } else {
    window_unpacked();
  }
  stats_.packing = packing_;
  stats_.windows = windows_;
  stats_.context = context_;
  stats_.targets = 0;
  for (const int32_t t : window_targets_) stats_.targets += t;
  if (window_targets_.empty()) stats_.targets = windows_ * context_;
  if (!validation_files.empty()) {
    validation_ = std::make_shared<TokenShardDataset>(
        validation_files, context, vocab_size, std::vector<std::string>{}, packing_, preference);
  }
}

TokenShardDataset::~TokenShardDataset() = default;

int64_t TokenShardDataset::token_width() const {
  int64_t width = 0;
  for (const auto& s : shards_) width = std::max(width, s->width);
  return width;
}

void TokenShardDataset::open_shards(const std::vector<std::string>& files) {
  for (const auto& f : files) {
    auto shard = std::make_unique<TokenShard>(f);
    shard->check_ids(vocab_size_);
    tokens_ += shard->count;
    shards_.push_back(std::move(shard));
  }
  // A split's shards all carry a mask (boundaries), or none does: a mask missing beside one shard
  // would silently train on every token of it.
  const TokenShard& first = *shards_.front();
  masks_ = first.mask != nullptr;
  documents_ = first.docs != nullptr;
  pairs_ = first.pairs >= 0;
  for (const auto& s : shards_) {
    for (const auto& [has, first_has, what, ext] :
         {std::tuple{s->mask != nullptr, masks_, "loss mask", ".mask"},
          std::tuple{s->docs != nullptr, documents_, "document boundaries", ".docs"},
          std::tuple{s->pairs >= 0, pairs_, "preference pairs", ".pairs"}}) {
      if (has == first_has) continue;
      const TokenShard& with = has ? *s : first;
      const TokenShard& without = has ? first : *s;
      throw DataError(fmt::format("{}: no {} beside it ({}), but {} has them: every shard of a "
                                  "split has its {} or none has",
                                  without.path, what, sidecar_path(without.path, ext), with.path,
                                  what));
    }
    stats_.documents += s->documents;
  }
}

void TokenShardDataset::resolve_packing(Packing requested) {
  packing_ = requested;
  if (packing_ == Packing::kAuto) packing_ = documents_ ? Packing::kDocuments : Packing::kNone;
  if (packing_ != Packing::kDocuments) return;
  const TokenShard& first = *shards_.front();
  if (!documents_) {
    throw DataError(fmt::format(
        "data.packing: documents, but {} has no document boundaries beside it ({}): "
        "scripts/tokenize_text.py --chat writes them; data.packing: none cuts windows from the "
        "token stream",
        first.path, sidecar_path(first.path, ".docs")));
  }
  if (context_ < 2) {
    throw DataError(fmt::format(
        "data.packing: documents needs data.context >= 2 (a window must hold a target), got {}",
        context_));
  }
}

void TokenShardDataset::window_unpacked() {
  const TokenShard* longest = nullptr;
  for (const auto& shard : shards_) {
    first_window_.push_back(windows_);
    const int64_t windows = (shard->count - 1) / context_;
    windows_ += windows;
    for (int64_t k = 0; masks_ && k < windows; ++k) {
      const int64_t start = k * context_;
      window_targets_.push_back(
          static_cast<int32_t>(shard->targets(start + 1, start + context_ + 1)));
    }
    if (longest == nullptr || shard->count > longest->count) longest = shard.get();
  }
  if (windows_ == 0) {
    throw DataError(fmt::format(
        "{}: {} tokens, fewer than data.context + 1 = {}: a window longer than the data (windows "
        "never cross shards; {} shard(s), this one the longest)",
        longest->path, longest->count, context_ + 1, shards_.size()));
  }
  stats_.tokens = windows_ * context_;
}

void TokenShardDataset::window_documents() {
  std::vector<Piece> documents;
  documents.reserve(static_cast<size_t>(stats_.documents));
  for (size_t s = 0; s < shards_.size(); ++s) {
    const TokenShard& shard = *shards_[s];
    for (int64_t d = 0; d < shard.documents; ++d) {
      const int64_t begin = shard.boundary(d), length = shard.boundary(d + 1) - begin;
      documents.push_back({begin, length, static_cast<int64_t>(s)});
      if (length > context_) ++stats_.split_documents;
    }
  }
  std::vector<Piece> pieces = split_documents(documents, context_);
  stats_.pieces = static_cast<int64_t>(pieces.size()) -
                  (static_cast<int64_t>(documents.size()) - stats_.split_documents);
  packed_ = pack_best_fit(pieces, context_);
  windows_ = packed_.windows();
  window_targets_.assign(static_cast<size_t>(windows_), 0);
  for (int64_t w = 0; w < windows_; ++w) {
    int64_t targets = 0;
    for (int64_t p = packed_.first[w]; p < packed_.first[w + 1]; ++p) {
      const Piece& piece = packed_.pieces[static_cast<size_t>(p)];
      // A piece's first token is nobody's target; its last position's target is ignored.
      targets += shards_[static_cast<size_t>(piece.shard)]->targets(piece.begin + 1,
                                                                    piece.begin + piece.length);
      stats_.tokens += piece.length;
    }
    window_targets_[static_cast<size_t>(w)] = static_cast<int32_t>(targets);
  }
}

void TokenShardDataset::check_pairs(const std::string& preference) const {
  const TokenShard& first = *shards_.front();
  if (!preference.empty() && !pairs_) {
    throw DataError(fmt::format(
        "{}: train.objective: {} trains on preference pairs, but there is no {} beside this "
        "shard: tokenize the pairs with scripts/tokenize_text.py --preference (or set "
        "train.objective: lm)",
        first.path, preference, sidecar_path(first.path, ".pairs")));
  }
  if (preference.empty() && pairs_) {
    throw DataError(fmt::format(
        "{}: these shards hold preference pairs ({}), which train.objective: lm would train on as "
        "chat data, rejected answers included: set train.objective: dpo or simpo",
        first.path, sidecar_path(first.path, ".pairs")));
  }
}

void TokenShardDataset::window_pairs() {
  // Each sequence fills one row of `context` positions (its first L - 1 tokens the inputs), so a
  // sequence may hold context + 1 tokens at most.
  for (size_t s = 0; s < shards_.size(); ++s) {
    const TokenShard& shard = *shards_[s];
    for (int64_t d = 0; d < shard.documents; ++d) {
      const int64_t begin = shard.boundary(d), length = shard.boundary(d + 1) - begin;
      if (length > context_ + 1) {
        throw DataError(fmt::format(
            "{}: pair {}'s {} sequence holds {} tokens, more than data.context + 1 = {}: "
            "tokenize with --max-tokens {} or raise data.context",
            shard.path, d / 2, d % 2 == 0 ? "chosen" : "rejected", length, context_ + 1,
            context_ + 1));
      }
      sequences_.push_back({begin, length, static_cast<int64_t>(s)});
      stats_.tokens += length;
    }
  }
  windows_ = static_cast<int64_t>(sequences_.size()) / 2;
  if (windows_ == 0) {
    throw DataError(fmt::format("{}: no preference pairs in the split", shards_.front()->path));
  }
}

void TokenShardDataset::fill_sequence(const Piece& piece, int64_t* inputs, int64_t* targets) const {
  const TokenShard& shard = *shards_[static_cast<size_t>(piece.shard)];
  int64_t j = 0;
  for (; j + 1 < piece.length; ++j) {
    const int64_t t = piece.begin + j;
    inputs[j] = shard.token(t);
    targets[j] = shard.target(t + 1) ? shard.token(t + 1) : core::kIgnoreTarget;
  }
  for (; j < context_; ++j) {  // padding after the sequence: never a target, attended by none
    inputs[j] = kPadInput;
    targets[j] = core::kIgnoreTarget;
  }
}

Batch TokenShardDataset::get_pairs(const at::Tensor& idx) const {
  const int64_t n = idx.numel();
  const int64_t* ids = idx.data_ptr<int64_t>();
  Batch b{at::empty({n, 2, context_}, at::kLong), at::empty({n, 2, context_}, at::kLong), {}};
  b.pairs = idx.clone();
  for (int64_t k = 0; k < n; ++k) {
    check_index(ids[k]);
    for (int64_t side = 0; side < 2; ++side) {
      const int64_t row = (2 * k + side) * context_;
      fill_sequence(sequences_[static_cast<size_t>(2 * ids[k] + side)],
                    b.inputs.data_ptr<int64_t>() + row, b.targets.data_ptr<int64_t>() + row);
    }
  }
  return b;
}

core::Shape TokenShardDataset::shape() const {
  core::Shape s;
  s.vocab_size = vocab_size_;
  s.context = context_;
  return s;
}

void TokenShardDataset::check_index(int64_t i) const {
  if (i < 0 || i >= windows_) {
    throw std::out_of_range(fmt::format("token window {} is outside [0, {})", i, windows_));
  }
}

void TokenShardDataset::fill_unpacked(int64_t i, int64_t* inputs, int64_t* targets) const {
  // The last shard whose first window is <= i (empty shards share their successor's start).
  const auto it = std::upper_bound(first_window_.begin(), first_window_.end(), i) - 1;
  const TokenShard& shard = *shards_[static_cast<size_t>(it - first_window_.begin())];
  const int64_t start = (i - *it) * context_;
  for (int64_t j = 0; j < context_; ++j) {
    inputs[j] = shard.token(start + j);  // checked at open
    targets[j] = shard.target(start + j + 1) ? shard.token(start + j + 1) : core::kIgnoreTarget;
  }
}

void TokenShardDataset::fill_packed(int64_t i, int64_t* inputs, int64_t* targets,
                                    int64_t* positions) const {
  int64_t at = 0;
  for (int64_t p = packed_.first[i]; p < packed_.first[i + 1]; ++p) {
    const Piece& piece = packed_.pieces[static_cast<size_t>(p)];
    const TokenShard& shard = *shards_[static_cast<size_t>(piece.shard)];
    for (int64_t j = 0; j < piece.length; ++j, ++at) {
      const int64_t t = piece.begin + j;
      inputs[at] = shard.token(t);
      positions[at] = j;
      targets[at] =
          j + 1 < piece.length && shard.target(t + 1) ? shard.token(t + 1) : core::kIgnoreTarget;
    }
  }
  for (int64_t j = 0; at < context_; ++j, ++at) {  // padding: one more document, never a target
    inputs[at] = kPadInput;
    positions[at] = j;
    targets[at] = core::kIgnoreTarget;
  }
}

Batch TokenShardDataset::get(const at::Tensor& indices) const {
  const at::Tensor idx = indices.to(at::kLong).contiguous();
  if (pairs_) return get_pairs(idx);
  const int64_t n = idx.numel();
  const int64_t* ids = idx.data_ptr<int64_t>();
  Batch b{at::empty({n, context_}, at::kLong), at::empty({n, context_}, at::kLong), {}};
  const bool packed = packing_ == Packing::kDocuments;
  if (packed) b.positions = at::empty({n, context_}, at::kLong);
  for (int64_t k = 0; k < n; ++k) {
    check_index(ids[k]);
    int64_t* inputs = b.inputs.data_ptr<int64_t>() + k * context_;
    int64_t* targets = b.targets.data_ptr<int64_t>() + k * context_;
    if (packed) {
      fill_packed(ids[k], inputs, targets, b.positions.data_ptr<int64_t>() + k * context_);
    } else {
      fill_unpacked(ids[k], inputs, targets);
    }
  }
  return b;
}

int64_t TokenShardDataset::target_count(const at::Tensor& indices) const {
  const at::Tensor idx = indices.to(at::kLong).contiguous();
  const int64_t* ids = idx.data_ptr<int64_t>();
  if (pairs_) {  // a preference objective's loss is a mean over the pairs
    for (int64_t k = 0; k < idx.numel(); ++k) check_index(ids[k]);
    return idx.numel();
  }
  if (window_targets_.empty()) {
    for (int64_t k = 0; k < idx.numel(); ++k) check_index(ids[k]);
    return idx.numel() * context_;
  }
  int64_t total = 0;
  for (int64_t k = 0; k < idx.numel(); ++k) {
    check_index(ids[k]);
    total += window_targets_[static_cast<size_t>(ids[k])];
  }
  return total;
}

std::optional<PackingStats> TokenShardDataset::packing() const {
  if ((!masks_ && !documents_) || pairs_) return std::nullopt;
  return stats_;
}

ShardFiles find_shards(const std::string& path, const std::string& val_path) {
  if (path.empty())
    throw DataError("data.path: empty; give a .bin token shard or a directory of them");
  if (struct stat st{}; ::stat(path.c_str(), &st) != 0) {
    throw DataError(fmt::format("data.path: {}: {} (a .bin token shard or a directory of them)",
                                path, std::strerror(errno)));
  }
  ShardFiles out;
  if (is_directory(path)) {
    for (const auto& name : bin_files(path, "data.path")) {
      (name.find("val") != std::string::npos ? out.validation : out.train)
          .push_back(path + "/" + name);
    }
    if (out.train.empty()) {
      throw DataError(
          fmt::format("data.path: {} holds no training shards (.bin files without 'val' "
                      "in the name)",
                      path));
    }
  } else {
    out.train.push_back(path);
  }
  if (!val_path.empty()) {
    out.validation.clear();
    if (is_directory(val_path)) {
      for (const auto& name : bin_files(val_path, "data.val_path")) {
        out.validation.push_back(val_path + "/" + name);
      }
      if (out.validation.empty()) {
        throw DataError(fmt::format("data.val_path: {} holds no .bin token shards", val_path));
      }
    } else {
      out.validation.push_back(val_path);
    }
  }
  return out;
}

std::unique_ptr<Dataset> make_token_dataset(const DataOptions& o) {
  const ShardFiles files = find_shards(o.path, o.val_path);
  return std::make_unique<TokenShardDataset>(files.train, o.context, o.vocab_size, files.validation,
                                             o.packing, o.preference);
}

}  // namespace data
