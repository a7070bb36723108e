#include "models/lm/causal_lm.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <utility>

#include "core/shape.h"  // kIgnoreTarget
#include "models/lm/linear_cross_entropy.h"
#include "models/lm/lm_shape.h"

namespace models {

int64_t padded_vocab(int64_t vocab) {
  constexpr int64_t kMultiple = 64;
  return (vocab + kMultiple - 1) / kMultiple * kMultiple;
}

CausalLm::CausalLm(CausalLmDims dims)
    : dims_(std::move(dims)), own_chunk_rows_(dims_.loss_chunk_rows) {}

CausalLm::~CausalLm() = default;

void CausalLm::require(bool ok, const std::string& what) const {
  if (!ok) throw std::invalid_argument(dims_.family + ": " + what);
}

void CausalLm::require_tokens(const at::Tensor& tokens) const {
  require(tokens.dim() == 2 && tokens.scalar_type() == at::kLong,
          fmt::format("tokens must be int64 [n, T], got {} {}", c10::toString(tokens.scalar_type()),
                      tokens.sizes()));
}

void CausalLm::require_targets(const at::Tensor& tokens, const at::Tensor& targets) const {
  require(targets.sizes() == tokens.sizes() && targets.scalar_type() == at::kLong,
          fmt::format("targets must be int64 {} like the tokens, got {} {}", tokens.sizes(),
                      c10::toString(targets.scalar_type()), targets.sizes()));
}

Documents CausalLm::documents_of(const at::Tensor& tokens, const at::Tensor& positions) const {
  require_tokens(tokens);
  require(positions.sizes() == tokens.sizes() && positions.scalar_type() == at::kLong,
          fmt::format("positions must be int64 {} like the tokens, got {} {}", tokens.sizes(),
                      c10::toString(positions.scalar_type()), positions.sizes()));
  return Documents(positions, tokens.device());
}

at::Tensor CausalLm::trunk(const at::Tensor& tokens, const Documents* documents) {
  require_tokens(tokens);
  const int64_t t = tokens.size(1);
  require(
      t >= 1 && t <= dims_.context,
      fmt::format("samples of {} tokens; 1 to model.context = {} are allowed", t, dims_.context));
  const double p = is_training() ? dims_.dropout : 0.0;
  // Units (ddp.shard: parameters): the embeddings' unit 0 around the embeddings, block i as unit
  // 1 + i, then the output unit from the final norm to the output layer (the caller leaves it).
  if (gate_ != nullptr) gate_->enter(0);
  at::Tensor x = embed(
      tokens, documents != nullptr ? documents->positions() : at::arange(t, tokens.options()));
  if (dims_.embedding_dropout) x = at::dropout(x, p, p > 0);
  if (gate_ != nullptr) x = gate_->leave(0, x);
  x = run_blocks(blocks_, x, p, dims_.checkpoint_activations, nullptr, gate_, 1, documents);
  if (gate_ != nullptr) gate_->enter(output_unit());
  return final_norm(x);
}

at::Tensor CausalLm::forward(const at::Tensor& tokens) {
  return leave_output(at::linear(trunk(tokens), output_weight()));
}

at::Tensor CausalLm::forward_packed(const at::Tensor& tokens, const at::Tensor& positions) {
  const Documents documents = documents_of(tokens, positions);
  return leave_output(at::linear(trunk(tokens, &documents), output_weight()));
}

at::Tensor CausalLm::forward_cached(const at::Tensor& tokens, KvCache& cache) {
  require_tokens(tokens);
  const int64_t past = cache.length(), t = tokens.size(1);
  require(t >= 1 && past + t <= dims_.context,
          fmt::format("{} cached + {} new positions; model.context = {} are allowed", past, t,
                      dims_.context));
  // The positions continue where the cache ends. Units as in trunk() (ddp.shard: parameters).
  if (gate_ != nullptr) gate_->enter(0);
  at::Tensor x = embed(tokens, at::arange(past, past + t, tokens.options()));
  if (gate_ != nullptr) x = gate_->leave(0, x);
  x = run_blocks_cached(blocks_, x, cache, gate_, 1);
  if (gate_ != nullptr) gate_->enter(output_unit());
  return leave_output(at::linear(final_norm(x), output_weight()));
}

at::Tensor CausalLm::loss_of_trunk(const at::Tensor& h, const at::Tensor& targets) {
  // The output layer and the loss in chunks of positions (Note [Chunked output layer]): the
  // [positions, vocab] logits are never whole. The padded rows and the ignored targets are
  // masked out there.
  return leave_output(linear_cross_entropy(h.reshape({-1, dims_.d_model}), output_weight(),
                                           targets.reshape({-1}), dims_.vocab_size,
                                           dims_.loss_chunk_rows));
}

at::Tensor CausalLm::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  require_targets(tokens, targets);
  return loss_of_trunk(trunk(tokens), targets);
}

at::Tensor CausalLm::loss_packed(const at::Tensor& tokens, const at::Tensor& targets,
                                 const at::Tensor& positions) {
  require_targets(tokens, targets);
  const Documents documents = documents_of(tokens, positions);
  return loss_of_trunk(trunk(tokens, &documents), targets);
}

at::Tensor CausalLm::sequence_logps(const at::Tensor& tokens, const at::Tensor& targets) {
  require_targets(tokens, targets);
  const at::Tensor logits =
      at::linear(trunk(tokens), output_weight()).narrow(-1, 0, dims_.vocab_size);
  const at::Tensor logp = at::log_softmax(logits.to(at::kFloat), -1);
  const at::Tensor counted = targets.ne(core::kIgnoreTarget);
  const at::Tensor picked =
      logp.gather(-1, at::where(counted, targets, 0).unsqueeze(-1)).squeeze(-1);
  return leave_output(at::where(counted, picked, 0.0F).sum(1));
}

std::vector<std::pair<std::string, at::Tensor>> CausalLm::sums_of(const at::Tensor& loss,
                                                                  const at::Tensor& targets) const {
  // The loss per target times the targets: their sum (exactly the per-sample mean times the
  // samples when every position is a target and T is a power of two, as before masks).
  const at::Tensor count = targets.ne(core::kIgnoreTarget).sum().to(at::kDouble);
  return {{"loss", loss.to(at::kDouble).mul(count)}};
}

std::vector<std::pair<std::string, at::Tensor>> CausalLm::eval_sums(const at::Tensor& tokens,
                                                                    const at::Tensor& targets) {
  return sums_of(loss(tokens, targets), targets);
}

std::vector<std::pair<std::string, at::Tensor>> CausalLm::eval_sums_packed(
    const at::Tensor& tokens, const at::Tensor& targets, const at::Tensor& positions) {
  return sums_of(loss_packed(tokens, targets, positions), targets);
}

int64_t CausalLm::loss_chunk_rows(int64_t rows) const {
  return linear_cross_entropy_chunk_rows(rows, dims_.padded_vocab_size, dims_.loss_chunk_rows);
}

void CausalLm::set_loss_chunk_rows(int64_t rows) {
  dims_.loss_chunk_rows = rows > 0 ? rows : own_chunk_rows_;
}

namespace {

// Whether `name` (as in named_parameters()) belongs to the module `module` or below it.
bool under(const std::string& name, const std::string& module) {
  return name.size() > module.size() && name.compare(0, module.size(), module) == 0 &&
         name[module.size()] == '.';
}

}  // namespace

double CausalLm::flops_per_token(int64_t positions) const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  const at::Tensor output = output_weight();
  for (const auto& item : named_parameters()) {
    for (const std::string& e : dims_.embeddings) {
      if (under(item.key(), e) && !item.value().is_same(output)) n -= item.value().numel();
    }
  }
  const auto layers = static_cast<int64_t>(blocks_.size());
  return 6.0 * static_cast<double>(n) +
         12.0 * static_cast<double>(layers * dims_.attention_width * positions);
}

size_t CausalLm::unit_of(const std::string& name) const {
  for (const std::string& e : dims_.embeddings) {
    if (under(name, e)) return 0;
  }
  if (under(name, dims_.blocks)) {
    const size_t skip = dims_.blocks.size() + 1;  // "h."
    return 1 + std::stoul(name.substr(skip, name.find('.', skip) - skip));
  }
  return output_unit();  // the final norm, an untied output layer
}

std::vector<std::vector<std::string>> CausalLm::parameter_units() const {
  std::vector<std::vector<std::string>> units(1 + blocks_.size() + (dims_.tied ? 0 : 1));
  for (const auto& item : named_parameters()) units[unit_of(item.key())].push_back(item.key());
  return units;
}

std::vector<std::vector<std::string>> CausalLm::frozen_units() const {
  std::vector<std::vector<std::string>> units;
  if (frozen_.empty()) return units;
  units.resize(1 + blocks_.size() + (dims_.tied ? 0 : 1));
  for (const std::string& name : frozen_) units[unit_of(name)].push_back(name);
  return units;
}

std::vector<HiddenMatrix> CausalLm::hidden_matrices() const {
  ParameterShapes shapes;
  for (const auto& item : named_parameters()) shapes[item.key()] = item.value().sizes().vec();
  std::map<std::string, std::vector<HiddenMatrix>> of;  // by parameter, in the map's order
  for (const HfTensor& t : hf_map(shapes)) {
    if (t.check_only || !under(t.param, dims_.blocks) || shapes.at(t.param).size() != 2) continue;
    const bool prefixed = t.name.starts_with(dims_.hf_prefix);
    of[t.param].push_back(
        {prefixed ? t.name.substr(dims_.hf_prefix.size()) : t.name, t.param, t.row_begin, t.rows});
  }
  std::vector<HiddenMatrix> matrices;
  for (const auto& item : named_parameters()) {
    auto& these = of[item.key()];
    std::sort(these.begin(), these.end(), [](const HiddenMatrix& a, const HiddenMatrix& b) {
      return a.row_begin < b.row_begin;
    });
    matrices.insert(matrices.end(), these.begin(), these.end());
  }
  return matrices;
}

LmShape CausalLm::lm_shape() const {
  const BlockOptions& b = blocks_.front()->options();
  LmShape s;
  s.family = dims_.family;
  s.vocab = dims_.vocab_size;
  s.padded_vocab = dims_.padded_vocab_size;
  s.d_model = dims_.d_model;
  s.layers = static_cast<int64_t>(blocks_.size());
  s.heads = b.heads;
  s.kv_heads = b.kv_heads;
  s.head_dim = b.head_dim;
  s.intermediate = b.mlp_hidden;
  s.positions = dims_.learned_positions ? dims_.context : 0;
  s.swiglu = b.mlp != MlpKind::kGelu;
  s.sandwich_norms = b.sandwich_norms;
  s.attention_bias = b.attn_bias;
  s.qkv_bias = b.qkv_bias;
  s.qk_norm = b.qk_norm;
  s.mlp_bias = b.mlp_bias;
  s.tied = dims_.tied;
  if (!lora_sites_.empty()) {
    s.lora_rank = lora_.rank;
    s.lora_targets = lora_.targets;
  }
  return s;
}

std::vector<size_t> CausalLm::unit_order() const {
  std::vector<size_t> order;
  for (size_t u = 0; u <= blocks_.size(); ++u) order.push_back(u);  // embeddings, blocks
  order.push_back(output_unit());
  return order;
}

}  // namespace models
