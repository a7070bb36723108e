// data.mixture: the order sources are drawn in (ddp/mixture_order.h), the dataset that joins them
// (data/mixture.h) and the config's checks. The order at 1, 2 and 3 ranks and across a resume at
// another world size: tests/mpi/mixture_test.cpp and e2e mixture_* (tests/e2e/e2e.sh).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "common/error_of.h"
#include "common/temp_dir.h"
#include "config/config.h"
#include "data/errors.h"
#include "data/mixture.h"
#include "data/registry.h"
#include "ddp/mixture_order.h"
#include "ddp/rank_sampler.h"

namespace TRAINER_UNITY_ID {

using ddp::MixtureOrder;

TEST(MixtureOrder, KeyedPermutationIsABijection) {
  for (const int64_t n : {1, 2, 3, 7, 64, 100, 1000, 4097}) {
    for (const uint64_t key : {0ULL, 1ULL, 0xdeadbeefULL}) {
      std::set<int64_t> seen;
      int64_t fixed = 0;
      for (int64_t x = 0; x < n; ++x) {
        const int64_t y = ddp::keyed_permutation(x, n, key);
        ASSERT_GE(y, 0);
        ASSERT_LT(y, n);
        seen.insert(y);
        fixed += y == x;
      }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << n << " key " << key;
      if (n >= 64) {
        EXPECT_LT(fixed, n / 8) << "hardly shuffled: n " << n;
      }
    }
  }
}

// The realised share of each source over the first `n` positions.
std::vector<double> shares(const MixtureOrder& order, int64_t n, size_t sources) {
  std::vector<double> count(sources, 0);
  for (int64_t p = 0; p < n; ++p) count[order.at(p).first] += 1;
  for (double& c : count) c /= double(n);
  return count;
}

TEST(MixtureOrder, RealisedMixIsWithinHalfAPercentOfTheWeights) {
  const MixtureOrder order({0.6, 0.3, 0.1}, {500, 80, 7}, 42);
  EXPECT_DOUBLE_EQ(order.weights()[0], 0.6 / 1.0);
  for (const int64_t n : {200, 1000, 4096, 70000, 300000}) {
    const auto s = shares(order, n, 3);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_NEAR(s[k], order.weights()[k], 0.005) << "source " << k << " over " << n;
    }
  }
  // Weights need not sum to 1; every window of 64 samples is within one sample per source.
  const MixtureOrder unnormalised({2.0, 1.0, 1.0}, {10, 10, 10}, 1);
  for (int64_t start = 0; start < 1000; start += 64) {
    std::vector<int64_t> count(3, 0);
    for (int64_t p = start; p < start + 64; ++p) ++count[unnormalised.at(p).first];
    EXPECT_NEAR(count[0], 32, 2);
    EXPECT_NEAR(count[1], 16, 2);
  }
}

TEST(MixtureOrder, EachPassIsANewPermutationAndTheFirstWrapIsWhereItSays) {
  const int64_t n = 37;
  const MixtureOrder order({0.5, 0.5}, {n, 1000}, 7);
  std::vector<std::vector<int64_t>> passes(3);
  int64_t wrap = -1;
  for (int64_t p = 0; passes[2].size() < static_cast<size_t>(n); ++p) {
    const auto [k, w] = order.at(p);
    if (k != 0) continue;
    for (auto& pass : passes) {
      if (pass.size() < static_cast<size_t>(n)) {
        if (&pass == &passes[1] && pass.empty()) wrap = p;
        pass.push_back(w);
        break;
      }
    }
  }
  EXPECT_EQ(order.first_wrap(0), wrap);
  for (const auto& pass : passes) {
    EXPECT_EQ(std::set<int64_t>(pass.begin(), pass.end()).size(), static_cast<size_t>(n));
  }
  EXPECT_NE(passes[0], passes[1]);
  EXPECT_NE(passes[1], passes[2]);
  // A function of the seed: another seed, another order; the same seed, the same.
  const MixtureOrder again({0.5, 0.5}, {n, 1000}, 7), other({0.5, 0.5}, {n, 1000}, 8);
  int64_t differ = 0;
  for (int64_t p = 0; p < 200; ++p) {
    EXPECT_EQ(again.at(p), order.at(p));
    differ += other.at(p) != order.at(p);
  }
  EXPECT_GT(differ, 50);
}

TEST(MixtureOrder, TheSamplerTakesAStepsPositionsInOrder) {
  const std::vector<ddp::MixtureSlice> slices = {{0, 100, 0.75}, {100, 40, 0.25}};
  ddp::RankSampler whole(slices, 16, 5), part(slices, 16, 5);
  const MixtureOrder order({0.75, 0.25}, {100, 40}, 5);
  for (int64_t step = 0; step < 30; ++step) {
    const at::Tensor all = whole.indices(step, 0, 16).clone();
    for (int64_t i = 0; i < 16; ++i) {
      const auto [k, w] = order.at(step * 16 + i);
      EXPECT_EQ(all[i].item<int64_t>(), slices[k].first + w);
    }
    // A rank's slice is its part of the step, whatever the split.
    EXPECT_TRUE(at::equal(part.indices(step, 5, 7), all.narrow(0, 5, 7)));
  }
  EXPECT_EQ(whole.first_wrap_step(1), order.first_wrap(1) / 16);
}

// A flat uint16 shard of `n` ids (value i * 7 % 50 + base), or llm.c's uint32 one with `wide`.
void write_shard(const std::string& path, int64_t n, int base, bool wide = false) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  if (wide) {
    int32_t header[256] = {20240801, 7, static_cast<int32_t>(n)};
    std::fwrite(header, 4, 256, f);
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t id = static_cast<uint32_t>(i * 7 % 50 + base);
    if (wide) {
      std::fwrite(&id, 4, 1, f);
    } else {
      const auto narrow = static_cast<uint16_t>(id);
      std::fwrite(&narrow, 2, 1, f);
    }
  }
  std::fclose(f);
}

struct Sources {
  test::TempDir dir;
  std::string a, b;
  explicit Sources(bool wide_b = false) : a(dir.path() + "/web"), b(dir.path() + "/code") {
    std::filesystem::create_directories(a);
    std::filesystem::create_directories(b);
    write_shard(a + "/train_000.bin", 801, 0);
    write_shard(a + "/val_000.bin", 161, 0);
    write_shard(b + "/train_000.bin", 321, 50, wide_b);
    write_shard(b + "/val_000.bin", 81, 50, wide_b);
  }
  data::DataOptions options(double wa = 3, double wb = 1) const {
    data::DataOptions o;
    o.dataset = "tokens";
    o.context = 16;
    o.vocab_size = 100;
    o.packing = data::Packing::kAuto;
    o.mixture = {{a, wa, "web"}, {b, wb, "code"}};
    return o;
  }
};

TEST(MixtureDataset, JoinsTheSourcesAndBlendsTheirValidation) {
  const Sources s;
  const data::MixtureDataset mix(s.options());
  const auto sources = mix.sources();
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[0].size, 50);  // (801 - 1) / 16
  EXPECT_EQ(sources[1].size, 20);
  EXPECT_EQ(sources[1].first, 50);
  EXPECT_DOUBLE_EQ(sources[0].weight, 0.75);
  EXPECT_EQ(mix.size(), 70);
  // Index 50 is code's first window: ids from 50 up.
  const data::Batch b = mix.get(at::tensor({0, 50, 3}, at::kLong));
  EXPECT_LT(b.inputs[0].max().item<int64_t>(), 50);
  EXPECT_GE(b.inputs[1].min().item<int64_t>(), 50);
  // The validation blend: 10 + 5 windows, three of web's to one of code's while both last.
  const auto val = mix.validation();
  ASSERT_NE(val, nullptr);
  EXPECT_EQ(val->size(), 15);
  const data::Batch v = val->get(at::arange(8, at::kLong));
  int64_t code = 0;
  for (int64_t i = 0; i < 8; ++i) code += v.inputs[i].min().item<int64_t>() >= 50;
  EXPECT_EQ(code, 2);
  EXPECT_EQ(sources[1].validation->size(), 5);
}

TEST(MixtureDataset, SourcesOfDifferentVocabulariesAreAnError) {
  const Sources s(/*wide_b=*/true);
  const std::string e =
      test::error_of<data::DataError>([&] { data::MixtureDataset m(s.options()); });
  EXPECT_NE(e.find("data.mixture[1] ('code')"), std::string::npos) << e;
  EXPECT_NE(e.find("32-bit"), std::string::npos) << e;
}

std::string config_error(const std::string& data_yaml) {
  return test::error_of<config::ConfigError>([&] {
    config::parse_config(
        "model: {name: gpt}\ntrain: {global_batch_size: 8}\ndata: " + data_yaml + "\n", "mix.yaml");
  });
}

TEST(MixtureConfig, BadSourcesExitNamingTheKey) {
  const Sources s;
  const std::string ok = fmt::format("{{path: {}, weight: 1}}", s.a);
  const auto bad = [&](const std::string& mixture) {
    return config_error("{dataset: tokens, mixture: [" + ok + ", " + mixture + "]}");
  };
  for (const auto& [mixture, says] : std::vector<std::pair<std::string, std::string>>{
           {fmt::format("{{path: {}, weight: 0}}", s.b), "[1].weight: 0 must be above 0"},
           {fmt::format("{{path: {}, weight: -2}}", s.b), "[1].weight: -2 must be above 0"},
           {fmt::format("{{path: {}}}", s.b), "[1].weight: missing"},
           {"{weight: 1}", "[1].path: missing"},
           {fmt::format("{{path: {}, weight: 1, name: web}}", s.b), "[1].name: 'web'"},
           {fmt::format("{{path: {}/nowhere, weight: 1}}", s.b), "no such directory"},
           {fmt::format("{{path: {}, weight: 1, colour: red}}", s.b), "unknown key 'colour'"}}) {
    const std::string e = bad(mixture);
    EXPECT_NE(e.find("data.mixture"), std::string::npos) << e;
    EXPECT_NE(e.find(says), std::string::npos) << says << " in: " << e;
    EXPECT_NE(e.find("mix.yaml:"), std::string::npos) << e;
  }
  const std::string not_tokens = config_error("{dataset: synthetic, mixture: [" + ok + "]}");
  EXPECT_NE(not_tokens.find("data.dataset: tokens"), std::string::npos) << not_tokens;
  const std::string with_path =
      config_error("{dataset: tokens, path: " + s.a + ", mixture: [" + ok + "]}");
  EXPECT_EQ(config_error("{dataset: tokens, path: '', mixture: [" + ok + "]}"), "(no error)");
  EXPECT_NE(with_path.find("data.path: not with data.mixture"), std::string::npos) << with_path;
  // The default name is the folder's; --print-config writes the sources back.
  const auto c = config::parse_config(
      "model: {name: gpt}\ntrain: {global_batch_size: 8}\ndata: {dataset: tokens, mixture: [" + ok +
          "]}\n",
      "m.yaml");
  ASSERT_EQ(c.data.mixture.size(), 1u);
  EXPECT_EQ(c.data.mixture[0].name, "web");
  EXPECT_NE(config::config_to_yaml(c).find("name: \"web\""), std::string::npos);
}

}  // namespace TRAINER_UNITY_ID
