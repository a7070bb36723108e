#include "checkpoint/checkpoint.h"

#include <fmt/format.h>

#include <cerrno>
#include <charconv>

#include "io/checkpoint_keys.h"

namespace checkpoint {

bool out_of_space(int error_number) { return error_number == ENOSPC || error_number == EDQUOT; }

namespace {

template <class T>
T parse_number(const std::string& path, const std::map<std::string, std::string>& meta,
               const char* key) {
  const auto it = meta.find(key);
  if (it == meta.end())
    throw CheckpointError(fmt::format("{}: no '{}' in its metadata", path, key));
  T v{};
  const auto& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) {
    throw CheckpointError(fmt::format("{}: metadata '{}' = '{}' is not a number", path, key, s));
  }
  return v;
}

}  // namespace

std::string exp_avg_key(const std::string& param) { return "adamw.exp_avg." + param; }
std::string exp_avg_sq_key(const std::string& param) { return "adamw.exp_avg_sq." + param; }
std::string muon_momentum_key(const std::string& param) { return "muon.momentum." + param; }
std::string first_moment_key(const std::string& param, bool muon) {
  return muon ? muon_momentum_key(param) : exp_avg_key(param);
}
std::string second_moment_key(const std::string& param, bool muon) {
  return muon ? std::string() : exp_avg_sq_key(param);
}
std::string param_key(const std::string& name) { return std::string(io::kParamKeyPrefix) + name; }

int64_t metadata_number(const std::string& path, const std::map<std::string, std::string>& meta,
                        const char* key) {
  return parse_number<int64_t>(path, meta, key);
}

uint64_t metadata_unsigned(const std::string& path, const std::map<std::string, std::string>& meta,
                           const char* key) {
  return parse_number<uint64_t>(path, meta, key);
}

}  // namespace checkpoint
