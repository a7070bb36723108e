// Packing efficiency of token shards with document boundaries (scripts/tokenize_text.py --chat),
// and the cost of opening and reading them: for each context, the windows data.packing: documents
// makes and what they hold (data::packing_line), against one document per padded window (what the
// windows would hold without packing), the seconds to open (map, check, pack) and the windows and
// tokens per second get() reads, one thread.
//
//   build/bench/packing_bench --path data/chat-shards --vocab 2048 --contexts 256,1024
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "data/dataset.h"
#include "data/token_shards.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void report(const std::vector<std::string>& files, int64_t vocab, int64_t context,
            data::Packing packing, int64_t batch) {
  const auto t0 = std::chrono::steady_clock::now();
  data::TokenShardDataset ds(files, context, vocab, {}, packing);
  const double open_s = seconds_since(t0);
  const auto stats = ds.packing();
  fmt::print("context {}: {}\n", context,
             stats ? data::packing_line(*stats) : std::string("no mask, no boundaries"));
  if (stats && stats->packing == data::Packing::kDocuments) {
    // One document (piece) per window, padded: the windows without packing.
    const int64_t padded = stats->documents - stats->split_documents + stats->pieces;
    const double positions = static_cast<double>(padded * context);
    fmt::print("  one document per padded window: {} windows: tokens {:.1f}%, targets {:.1f}% "
               "({:.2f}x the windows packing needs)\n",
               padded, 100.0 * static_cast<double>(stats->tokens) / positions,
               100.0 * static_cast<double>(stats->targets) / positions,
               static_cast<double>(padded) / static_cast<double>(stats->windows));
  }
  const auto t1 = std::chrono::steady_clock::now();
  int64_t read = 0;
  for (int64_t pass = 0; read < 200000 && pass < 1000; ++pass) {
    for (int64_t i = 0; i < ds.size(); i += batch) {
      const int64_t n = std::min(batch, ds.size() - i);
      const auto b = ds.get(at::arange(i, i + n, at::kLong));
      read += n;
    }
  }
  const double read_s = seconds_since(t1);
  fmt::print("  open {:.3f} s; get: {:.0f} windows/s, {:.2f} M positions/s ({} windows read)\n",
             open_s, static_cast<double>(read) / read_s,
             static_cast<double>(read * context) / read_s / 1e6, read);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Packing efficiency and read speed of token shards with document boundaries"};
  std::string path;
  int64_t vocab = 0, batch = 16;
  std::vector<int64_t> contexts{256, 1024};
  std::string packing = "auto";
  app.add_option("--path", path, "a directory of shards (its training split)")->required();
  app.add_option("--vocab", vocab, "data.vocab_size")->required();
  app.add_option("--contexts", contexts, "data.context values")->delimiter(',');
  app.add_option("--packing", packing, "auto, documents or none");
  app.add_option("--batch", batch, "windows per get()");
  try {
    bench::parse_or_exit(app, argc, argv);
    const auto files = data::find_shards(path, "").train;
    const auto it = std::find(data::kPackingNames.begin(), data::kPackingNames.end(), packing);
    if (it == data::kPackingNames.end()) throw std::invalid_argument("--packing: " + packing);
    const auto mode = static_cast<data::Packing>(it - data::kPackingNames.begin());
    for (const int64_t context : contexts) report(files, vocab, context, mode, batch);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "packing_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
