#include "data/choice_tasks.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "data/errors.h"

namespace data {
namespace {

constexpr int32_t kMagic = 20240522;  // llm.c's eval files (dev/data/data_common.py)
constexpr int32_t kVersion = 1;
constexpr size_t kHeaderInts = 256;
constexpr uint16_t kStartExample = 65535;

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("eval.tasks: {}: cannot open the file", path));
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The checks both formats share; `where` names the example.
void check_example(const ChoiceExample& e, const std::string& where, int64_t vocab_size,
                   int64_t positions) {
  if (e.endings.size() < 2) {
    throw DataError(
        fmt::format("{}: {} ending(s); a choice needs at least 2", where, e.endings.size()));
  }
  if (e.label < 0 || e.label >= static_cast<int64_t>(e.endings.size())) {
    throw DataError(fmt::format("{}: label {} is out of range for {} endings", where, e.label,
                                e.endings.size()));
  }
  if (e.context.empty()) throw DataError(fmt::format("{}: the context has no tokens", where));
  auto check_ids = [&](const std::vector<int64_t>& ids, const std::string& what) {
    for (const int64_t id : ids) {
      if (id < 0 || id >= vocab_size) {
        throw DataError(fmt::format("{}: {} has id {}, at or above the vocabulary ({})", where,
                                    what, id, vocab_size));
      }
    }
  };
  check_ids(e.context, "the context");
  for (size_t k = 0; k < e.endings.size(); ++k) {
    const auto& ending = e.endings[k];
    const std::string what = fmt::format("ending {}", k);
    if (ending.empty()) throw DataError(fmt::format("{}: {} has no tokens", where, what));
    check_ids(ending, what);
    const auto total = static_cast<int64_t>(e.context.size() + ending.size());
    if (total > positions) {
      throw DataError(fmt::format(
          "{}: the context ({} tokens) and {} ({} tokens) do not fit the model's {} positions",
          where, e.context.size(), what, ending.size(), positions));
    }
  }
}

// llm.c's binary eval file (choice_tasks.h).
std::vector<ChoiceExample> read_llmc(const std::string& path, int64_t vocab_size,
                                     int64_t positions) {
  const std::string bytes = read_whole(path);
  if (bytes.size() < kHeaderInts * 4) {
    throw DataError(fmt::format("eval.tasks: {}: bad header: {} bytes, shorter than llm.c's "
                                "header of 256 int32",
                                path, bytes.size()));
  }
  int32_t header[kHeaderInts];
  std::memcpy(header, bytes.data(), sizeof header);
  if (header[0] != kMagic || header[1] != kVersion || header[2] <= 0) {
    throw DataError(fmt::format("eval.tasks: {}: bad header: magic {}, version {}, {} examples "
                                "(llm.c's eval files have magic {}, version {}, examples > 0)",
                                path, header[0], header[1], header[2], kMagic, kVersion));
  }
  const size_t words = (bytes.size() - sizeof header) / 2;
  std::vector<uint16_t> s(words);
  std::memcpy(s.data(), bytes.data() + sizeof header, words * 2);
  std::vector<ChoiceExample> out;
  size_t p = 0;
  for (int32_t i = 0; i < header[2]; ++i) {
    const std::string where = fmt::format("eval.tasks: {}: example {}", path, i);
    auto next = [&]() -> uint16_t {
      if (p >= words) throw DataError(fmt::format("{}: the file ends inside it", where));
      return s[p++];
    };
    const size_t begin = p;
    if (next() != kStartExample) {
      throw DataError(fmt::format("{} (byte {}): no start-of-example marker 65535", where,
                                  sizeof header + begin * 2));
    }
    const uint16_t size_bytes = next();
    next();  // the example's index in its data set
    ChoiceExample e;
    e.label = next();
    const uint16_t endings = next();
    e.context.resize(next());
    for (auto& id : e.context) id = next();
    e.endings.resize(endings);
    for (auto& ending : e.endings) {
      ending.resize(next());
      for (auto& id : ending) id = next();
    }
    if ((p - begin) * 2 != size_bytes) {
      throw DataError(
          fmt::format("{}: it says {} bytes but holds {}", where, size_bytes, (p - begin) * 2));
    }
    check_example(e, where, vocab_size, positions);
    out.push_back(std::move(e));
  }
  if (p != words) {
    throw DataError(fmt::format("eval.tasks: {}: {} bytes after the {} examples the header counts",
                                path, bytes.size() - sizeof header - p * 2, header[2]));
  }
  return out;
}

// JSON Lines (choice_tasks.h); blank lines are skipped.
std::vector<ChoiceExample> read_jsonl(const std::string& path, const Tokenizer& tokenizer,
                                      int64_t vocab_size, int64_t positions) {
  std::ifstream in(path);
  if (!in) throw DataError(fmt::format("eval.tasks: {}: cannot open the file", path));
  std::vector<ChoiceExample> out;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where =
        fmt::format("eval.tasks: {}:{}: example {}", path, number, out.size());
    ChoiceExample e;
    try {
      const auto j = nlohmann::json::parse(line);
      e.context = tokenizer.encode(j.at("context").get<std::string>());
      for (const auto& ending : j.at("endings")) {
        e.endings.push_back(tokenizer.encode(ending.get<std::string>()));
      }
      e.label = j.at("label").get<int64_t>();
    } catch (const nlohmann::json::exception& err) {
      throw DataError(fmt::format("{}: not {{\"context\": text, \"endings\": [text, ...], "
                                  "\"label\": integer}}: {}",
                                  where, err.what()));
    }
    check_example(e, where, vocab_size, positions);
    out.push_back(std::move(e));
  }
  if (out.empty()) throw DataError(fmt::format("eval.tasks: {}: no examples", path));
  return out;
}

}  // namespace

std::string choice_task_name(const std::string& path) {
  return std::filesystem::path(path).stem().string();
}

ChoiceTask read_choice_task(const std::string& path, const Tokenizer* tokenizer, int64_t vocab_size,
                            int64_t positions) {
  ChoiceTask task{choice_task_name(path), path, {}};
  if (std::filesystem::path(path).extension() == ".bin") {
    task.examples = read_llmc(path, vocab_size, positions);
  } else if (tokenizer == nullptr) {
    throw DataError(fmt::format("eval.tasks: {}: a JSON Lines task needs the run's tokenizer "
                                "(data.tokenizer)",
                                path));
  } else {
    task.examples = read_jsonl(path, *tokenizer, vocab_size, positions);
  }
  return task;
}

}  // namespace data
