// Packed documents on the CPU (issue 34): what block-diagonal attention costs, and what packing
// buys in training throughput.
//
// 1. Attention alone, forward + backward, at the shapes of the model below and the documents of
//    the real packed windows with the most documents (their positions): plain causal attention
//    (wrong for packed documents: the floor), scaled_dot_product_attention with the block-diagonal
//    mask as a boolean and as an additive float mask (models::Documents' masked path), each
//    document apart (a loop of causal calls: less arithmetic, more calls), and models::Documents
//    itself.
// 2. Training, forward + backward of the model (a llama, --preset), over the same conversations
//    packed into windows (data.packing: documents) and one conversation per padded window (what
//    the windows hold without packing; causal attention, the padding after the document), at the
//    same micro-batch: windows, seconds, and the conversation tokens and target tokens per
//    second.
//
//   build/bench/packed_bench --path data/chat-shards --vocab 2048 --context 512 --batch 8
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/shape.h"
#include "data/token_shards.h"
#include "models/capabilities.h"
#include "models/documents.h"
#include "models/llama/llama.h"
#include "models/llama/llama_options.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Median seconds of `reps` runs of `fn` after one warm-up.
double time_it(const std::function<void()>& fn, int reps) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A document of a window: [row, start, length].
using Span = std::array<int64_t, 3>;

// Each document of each row of `positions` [n, T] (a document starts where its position is 0).
std::vector<Span> documents_of(const at::Tensor& positions) {
  std::vector<Span> docs;
  for (int64_t r = 0; r < positions.size(0); ++r) {
    const at::Tensor p = positions[r].contiguous();
    const int64_t* v = p.data_ptr<int64_t>();
    for (int64_t i = 0; i < positions.size(1); ++i) {
      if (v[i] == 0) docs.push_back({r, i, 0});
      ++docs.back()[2];
    }
  }
  return docs;
}

struct Shape {
  int64_t heads, kv_heads, head_dim;
};

void attention_costs(const at::Tensor& positions, const Shape& s, int reps) {
  const int64_t n = positions.size(0), t = positions.size(1);
  at::manual_seed(0);
  const auto leaf = [&](int64_t heads) {
    return at::randn({n, heads, t, s.head_dim}).requires_grad_(true);
  };
  const at::Tensor q = leaf(s.heads), k = leaf(s.kv_heads), v = leaf(s.kv_heads);
  const bool gqa = s.kv_heads != s.heads;
  const at::Tensor mask = models::Documents::mask_of(positions);
  const at::Tensor additive =
      at::zeros(mask.sizes())
          .masked_fill_(mask.logical_not(), -std::numeric_limits<float>::infinity());
  const models::Documents documents(positions, c10::Device(c10::kCPU));
  const std::vector<Span> docs = documents_of(positions);
  const auto fwd_bwd = [&](const std::function<at::Tensor()>& f) {
    return time_it([&] { f().sum().backward(); }, reps);
  };
  const auto sdpa = [&](std::optional<at::Tensor> m, bool causal) {
    return at::scaled_dot_product_attention(q, k, v, m, 0.0, causal, std::nullopt, gqa);
  };
  const double causal = fwd_bwd([&] { return sdpa(std::nullopt, true); });
  struct Row {
    const char* name;
    double s;
  };
  const std::vector<Row> rows = {
      {"causal (not block-diagonal: the floor)", causal},
      {"boolean block-diagonal mask", fwd_bwd([&] { return sdpa(mask, false); })},
      {"additive float mask", fwd_bwd([&] { return sdpa(additive, false); })},
      {"each document apart (causal per document)", fwd_bwd([&] {
         std::vector<at::Tensor> parts;
         for (const auto& [r, start, length] : docs) {
           const auto cut = [&](const at::Tensor& z) {
             return z.narrow(0, r, 1).narrow(2, start, length);
           };
           parts.push_back(at::scaled_dot_product_attention(cut(q), cut(k), cut(v), std::nullopt,
                                                            0.0, true, std::nullopt, gqa)
                               .sum());
         }
         return at::stack(parts);
       })},
      {"models::Documents::attend (the model's path)",
       fwd_bwd([&] { return documents.attend(q, k, v, 0.0); })},
  };
  fmt::print("attention, forward + backward: {} windows of {} positions, {} documents, {} heads "
             "over {} kv heads of {}; {} threads, median of {}\n",
             n, t, docs.size(), s.heads, s.kv_heads, s.head_dim, at::get_num_threads(), reps);
  for (const Row& r : rows) {
    fmt::print("  {:<46} {:8.2f} ms  {:5.2f}x causal\n", r.name, r.s * 1e3, r.s / causal);
  }
}

// One document per row, padded after it (input 0, no target): the windows without packing. A
// packed window's padding (a last "document" of input 0 without targets) is left out.
data::Batch padded_rows(const data::Batch& packed) {
  std::vector<Span> docs;
  for (const Span& d : documents_of(packed.positions)) {
    const auto& [row, start, length] = d;
    const bool padding =
        start > 0 &&
        packed.inputs[row].narrow(0, start, length).eq(data::kPadInput).all().item<bool>() &&
        packed.targets[row].narrow(0, start, length).eq(core::kIgnoreTarget).all().item<bool>();
    if (!padding) docs.push_back(d);
  }
  const int64_t t = packed.inputs.size(1);
  const auto m = static_cast<int64_t>(docs.size());
  data::Batch b{at::zeros({m, t}, at::kLong), at::full({m, t}, core::kIgnoreTarget), {}};
  for (int64_t d = 0; d < m; ++d) {
    const auto [r, start, length] = docs[static_cast<size_t>(d)];
    b.inputs[d].narrow(0, 0, length).copy_(packed.inputs[r].narrow(0, start, length));
    b.targets[d].narrow(0, 0, length).copy_(packed.targets[r].narrow(0, start, length));
  }
  return b;
}

struct Throughput {
  int64_t windows = 0, tokens = 0, targets = 0;
  double seconds = 0;
};

// `tokens`: the conversations' tokens the windows hold.
Throughput train_over(models::Llama& model, const data::Batch& all, int64_t batch, bool packed,
                      int64_t tokens) {
  Throughput out;
  const int64_t n = all.inputs.size(0);
  out.windows = n;
  out.tokens = tokens;
  out.targets = all.targets.ne(core::kIgnoreTarget).sum().item<int64_t>();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; i += batch) {
    const int64_t m = std::min(batch, n - i);
    const at::Tensor in = all.inputs.narrow(0, i, m), tg = all.targets.narrow(0, i, m);
    const at::Tensor loss =
        packed ? model.loss_packed(in, tg, all.positions.narrow(0, i, m)) : model.loss(in, tg);
    loss.backward();
  }
  out.seconds = seconds_since(t0);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"packed documents: attention cost and training throughput on the CPU"};
  std::string path;
  int64_t vocab = 2048, context = 512, batch = 8, threads = 0;
  int reps = 5;
  std::string preset = "llama-tiny";
  app.add_option("--path", path, "token shards with .mask and .docs (tokenize_text.py --chat)")
      ->required();
  app.add_option("--vocab", vocab, "data.vocab_size");
  app.add_option("--context", context, "data.context");
  app.add_option("--batch", batch, "windows per forward + backward");
  app.add_option("--preset", preset, "the llama preset");
  app.add_option("--threads", threads, "at::set_num_threads (0: LibTorch's default)");
  app.add_option("--reps", reps, "attention: timed runs per variant");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) at::set_num_threads(static_cast<int>(threads));

  const data::ShardFiles files = data::find_shards(path, "");
  const data::TokenShardDataset packed(files.train, context, vocab, {}, data::Packing::kDocuments);
  fmt::print("{}\n", data::packing_line(*packed.packing()));
  const data::Batch windows = packed.get(at::arange(packed.size(), at::kLong));

  models::LlamaOptions o = models::llama_preset(preset);
  o.vocab_size = vocab;
  o.context = context;
  at::manual_seed(0);
  models::Llama model(o);
  const auto& r = model.options();
  // The windows with the most documents (the first ones hold the longest pieces, often one each,
  // where the block-diagonal mask is the causal one).
  const at::Tensor most =
      std::get<1>(windows.positions.eq(0).sum(1).topk(std::min(batch, packed.size())));
  attention_costs(windows.positions.index_select(0, std::get<0>(most.sort())),
                  {r.heads, r.kv_heads, r.head_dim}, reps);

  const data::Batch padded = padded_rows(windows);
  const int64_t tokens = packed.packing()->tokens;
  const Throughput p = train_over(model, windows, batch, true, tokens);
  const Throughput u = train_over(model, padded, batch, false, tokens);
  fmt::print("training ({} {} wide, {} blocks), forward + backward of every window, micro-batch "
             "{}:\n",
             preset, r.d_model, r.num_layers, batch);
  for (const auto& [name, t] : {std::pair{"packed (documents)", p}, std::pair{"padded", u}}) {
    fmt::print("  {:<20} {:5} windows {:7.2f} s  {:8.0f} tokens/s  {:8.0f} targets/s\n", name,
               t.windows, t.seconds, static_cast<double>(t.tokens) / t.seconds,
               static_cast<double>(t.targets) / t.seconds);
  }
  fmt::print(
      "  packed / padded: {:.2f}x the tokens per second\n",
      (static_cast<double>(p.tokens) / p.seconds) / (static_cast<double>(u.tokens) / u.seconds));
  return 0;
}
