// CSV time series: the header's columns, normalisation from the training rows only, windows that
// never cross the split, and malformed files named with line and column.
#include "data/csv_series.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <thread>

#include "common/error_of.h"
#include "common/temp_dir.h"
#include "data/errors.h"
#include "data/readers.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

// time, a = row, b = 10 * row (rows 0..n-1).
std::string write_csv(const test::TempDir& dir, int n, const std::string& extra_line = "",
                      int extra_at = -1) {
  const std::string path = dir.path() + "/s.csv";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fprintf(f, "time, a ,b\n");
  for (int i = 0; i < n; ++i) {
    if (i == extra_at) {
      std::fprintf(f, "%s\n", extra_line.c_str());
    } else {
      std::fprintf(f, "2024-01-01T%02d, %d,%d\n", i % 24, i, 10 * i);
    }
  }
  std::fprintf(f, "\n\n");  // trailing empty lines are ignored
  std::fclose(f);
  return path;
}

data::DataOptions options(const std::string& path) {
  data::DataOptions o;
  o.path = path;
  o.targets = {"b"};
  o.window = 3;
  o.horizon = 2;
  o.val_fraction = 0.2;
  return o;
}

std::string error_of(const std::function<void()>& fn) {
  return test::error_of<data::DataError>(fn);
}

TEST(CsvSeries, WindowsAndNormalisationFromTheTrainingRows) {
  test::TempDir dir;
  auto ds = data::make_csv_dataset(options(write_csv(dir, 20 + 5)));
  // 25 rows: 20 train, 5 validate. Features: every numeric column (a, b); target b.
  const auto shape = ds->shape();
  EXPECT_EQ(shape.features, 2);
  EXPECT_EQ(shape.targets, 1);
  EXPECT_EQ(shape.window, 3);
  EXPECT_EQ(shape.horizon, 2);
  EXPECT_EQ(ds->size(), 20 - 3 - 2 + 1);
  // Training rows 0..19: mean 9.5, population std sqrt((20^2 - 1) / 12); not the validation rows.
  const double mean = 9.5, std = std::sqrt((20.0 * 20.0 - 1.0) / 12.0);
  const auto b = ds->get(at::tensor({2}, at::kLong));
  EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{1, 3, 2}));
  EXPECT_EQ(b.targets.sizes(), (std::vector<int64_t>{1, 2, 1}));
  EXPECT_NEAR(b.inputs[0][0][0].item<double>(), (2 - mean) / std, 1e-5);  // a at row 2
  EXPECT_NEAR(b.inputs[0][2][1].item<double>(), (4 - mean) / std,
              1e-5);  // b (scaled by 10 both ways)
  EXPECT_NEAR(b.targets[0][1][0].item<double>(), (6 - mean) / std, 1e-5);  // b at row 6
  // Validation: rows 20..24 hold one window of 3 + 2, normalised with the training statistics.
  const auto val = ds->validation();
  ASSERT_NE(val, nullptr);
  EXPECT_EQ(val->size(), 1);
  EXPECT_NEAR(val->get(at::tensor({0}, at::kLong)).targets[0][1][0].item<double>(),
              (24 - mean) / std, 1e-5);
}

TEST(CsvSeries, NamedFeaturesAndAValidationWindow) {
  test::TempDir dir;
  auto o = options(write_csv(dir, 40));
  o.features = {"a"};
  auto ds = data::make_csv_dataset(o);
  EXPECT_EQ(ds->shape().features, 1);
  const auto val = ds->validation();
  ASSERT_NE(val, nullptr);
  EXPECT_EQ(val->size(), 8 - 5 + 1);
  // The first validation window starts at row 32, normalised with rows 0..31's statistics.
  const double mean = 15.5, std = std::sqrt((32.0 * 32.0 - 1.0) / 12.0);
  EXPECT_NEAR(val->get(at::tensor({0}, at::kLong)).inputs[0][0][0].item<double>(),
              (32 - mean) / std, 1e-5);
  EXPECT_NEAR(val->get(at::tensor({0}, at::kLong)).targets[0][0][0].item<double>(),
              (35 - mean) / std, 1e-5);
}

TEST(CsvSeries, ConcurrentReadsEqualSequentialOnes) {
  test::TempDir dir;
  auto ds = data::make_csv_dataset(options(write_csv(dir, 300)));
  const at::Tensor idx = at::randperm(ds->size(), at::kLong);
  const auto expected = ds->get(idx);
  std::vector<std::thread> threads;
  std::vector<data::Batch> got(4);
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { got[t] = ds->get(idx); });
  for (auto& t : threads) t.join();
  for (const auto& g : got) {
    EXPECT_TRUE(at::equal(g.inputs, expected.inputs));
    EXPECT_TRUE(at::equal(g.targets, expected.targets));
  }
}

TEST(CsvSeries, MalformedFilesAreNamed) {
  test::TempDir dir;
  const std::string path = write_csv(dir, 30, "2024, 7x, 70", 12);
  auto o = options(path);
  EXPECT_THAT(
      error_of([&] { data::make_csv_dataset(o); }),
      HasSubstr(path + ":14: column 'a': '7x' is not a number"));  // line 14: header + 12 rows + 1
  test::TempDir dir2;
  o = options(write_csv(dir2, 30));
  o.features = {"a", "c"};
  EXPECT_THAT(error_of([&] { data::make_csv_dataset(o); }),
              HasSubstr("s.csv: no column 'c' (data.features); the header has: time, a, b"));
  o.features = {};
  o.targets = {};
  EXPECT_THAT(error_of([&] { data::make_csv_dataset(o); }), HasSubstr("data.targets"));
  o = options(write_csv(dir2, 6));
  o.val_fraction = 0;
  o.window = 8;
  EXPECT_THAT(
      error_of([&] { data::make_csv_dataset(o); }),
      HasSubstr(
          "s.csv: the training split has 6 rows, fewer than data.window + data.horizon = 10"));
  o = options(write_csv(dir2, 20));  // 4 validation rows: no window of 5
  EXPECT_THAT(
      error_of([&] { data::make_csv_dataset(o); }),
      HasSubstr(
          "s.csv: the validation split has 4 rows, fewer than data.window + data.horizon = 5"));
  const std::string ragged = write_csv(dir2, 30, "2024, 5", 3);
  EXPECT_THAT(error_of([&] { data::make_csv_dataset(options(ragged)); }),
              HasSubstr(ragged + ":5: 2 values, the header names 3 columns"));
  EXPECT_THAT(error_of([&] { data::make_csv_dataset(options(dir2.path() + "/none.csv")); }),
              HasSubstr("none.csv: cannot open"));
}

}  // namespace TRAINER_UNITY_ID
