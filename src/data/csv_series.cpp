#include "data/csv_series.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>

#include "data/errors.h"
#include "data/readers.h"

namespace data {
namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(" \t\r");
  return s.substr(a, b - a + 1);
}

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = line.find(',', start);
    out.push_back(trim(line.substr(start, comma - start)));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

bool parse_number(const std::string& s, double* v) {
  if (s.empty()) return false;
  const char* first = s.data() + (s[0] == '+' ? 1 : 0);
  auto [end, ec] = std::from_chars(first, s.data() + s.size(), *v);
  return ec == std::errc() && end == s.data() + s.size() && std::isfinite(*v);
}

int64_t column_of(const std::vector<std::string>& header, const std::string& name,
                  const std::string& path, const char* key) {
  const auto it = std::find(header.begin(), header.end(), name);
  if (it == header.end()) {
    throw DataError(fmt::format("{}: no column '{}' ({}); the header has: {}", path, name, key,
                                fmt::join(header, ", ")));
  }
  return it - header.begin();
}

// A CSV file's cells: the header, and each non-empty data row with its line number.
struct CsvText {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::vector<int64_t> line_of;
};

CsvText read_csv_text(const std::string& path, const std::vector<std::string>& targets) {
  std::ifstream in(path);
  if (!in)
    throw DataError(fmt::format("{}: cannot open the CSV file: {}", path, std::strerror(errno)));
  std::string line;
  if (!std::getline(in, line) || trim(line).empty()) {
    throw DataError(
        fmt::format("{}: empty: a CSV time series needs a header row and data rows", path));
  }
  CsvText text;
  text.header = split(line);
  if (targets.empty()) {
    throw DataError(
        fmt::format("data.targets: name the column(s) of {} to predict; the header has: {}", path,
                    fmt::join(text.header, ", ")));
  }
  for (int64_t number = 2; std::getline(in, line); ++number) {
    if (trim(line).empty()) continue;
    text.rows.push_back(split(line));
    text.line_of.push_back(number);
    if (text.rows.back().size() != text.header.size()) {
      throw DataError(fmt::format("{}:{}: {} values, the header names {} columns", path, number,
                                  text.rows.back().size(), text.header.size()));
    }
  }
  if (text.rows.empty()) throw DataError(fmt::format("{}: a header row and no data rows", path));
  return text;
}

// The header index of each column used (the features, default every numeric column of the first
// row, then the targets not among them); fills s.feature_index, s.target_index and s.columns.
std::vector<int64_t> choose_columns(const CsvText& text, const std::vector<std::string>& features,
                                    const std::vector<std::string>& targets,
                                    const std::string& path, CsvSeries& s) {
  const std::vector<std::string>& header = text.header;
  std::vector<int64_t> used;
  if (features.empty()) {
    double v = 0;
    for (size_t c = 0; c < header.size(); ++c) {
      if (parse_number(text.rows[0][c], &v)) used.push_back(static_cast<int64_t>(c));
    }
  } else {
    for (const auto& f : features) used.push_back(column_of(header, f, path, "data.features"));
  }
  for (size_t j = 0; j < used.size(); ++j) s.feature_index.push_back(static_cast<int64_t>(j));
  for (const auto& t : targets) {
    const int64_t c = column_of(header, t, path, "data.targets");
    const auto it = std::find(used.begin(), used.end(), c);
    if (it == used.end()) {
      used.push_back(c);
      s.target_index.push_back(static_cast<int64_t>(used.size()) - 1);
    } else {
      s.target_index.push_back(it - used.begin());
    }
  }
  for (int64_t c : used) s.columns.push_back(header[static_cast<size_t>(c)]);
  return used;
}

}  // namespace

CsvSeries read_csv_series(const std::string& path, const std::vector<std::string>& features,
                          const std::vector<std::string>& targets, double val_fraction) {
  const CsvText text = read_csv_text(path, targets);
  const auto& rows = text.rows;
  const auto& line_of = text.line_of;
  CsvSeries s;
  const std::vector<int64_t> used = choose_columns(text, features, targets, path, s);

  const auto n = static_cast<int64_t>(rows.size());
  const auto m = static_cast<int64_t>(used.size());
  at::Tensor values = at::empty({n, m}, at::kDouble);
  double* out = values.data_ptr<double>();
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < m; ++j) {
      const std::string& cell = rows[static_cast<size_t>(r)][static_cast<size_t>(used[j])];
      if (!parse_number(cell, &out[r * m + j])) {
        throw DataError(fmt::format("{}:{}: column '{}': '{}' is not a number", path, line_of[r],
                                    s.columns[static_cast<size_t>(j)], cell));
      }
    }
  }
  s.train_rows = n - static_cast<int64_t>(std::llround(val_fraction * static_cast<double>(n)));
  if (s.train_rows < 1) {
    throw DataError(fmt::format("{}: {} rows leave no training rows with data.val_fraction = {}",
                                path, n, val_fraction));
  }
  const at::Tensor train = values.narrow(0, 0, s.train_rows);
  s.mean = train.mean(0);
  s.std = train.std(0, /*unbiased=*/false);
  s.std = at::where(s.std > 1e-12, s.std, at::ones_like(s.std));
  s.values = ((values - s.mean) / s.std).to(at::kFloat).contiguous();
  s.mean = s.mean.to(at::kFloat);
  s.std = s.std.to(at::kFloat);
  return s;
}

CsvSeriesDataset::CsvSeriesDataset(std::shared_ptr<const CsvSeries> series, int64_t begin,
                                   int64_t end, int64_t window, int64_t horizon,
                                   const std::string& path,
                                   std::shared_ptr<const Dataset> validation)
    : series_(std::move(series)), begin_(begin), end_(end), window_(window), horizon_(horizon),
      validation_(std::move(validation)) {
  if (window < 1 || horizon < 1) {
    throw DataError(
        fmt::format("data.window ({}) and data.horizon ({}) must be positive", window, horizon));
  }
  if (size() < 1) {
    throw DataError(fmt::format(
        "{}: the {} split has {} rows, fewer than data.window + data.horizon = {}: the window is "
        "longer than the data",
        path, begin == 0 ? "training" : "validation", end - begin, window + horizon));
  }
}

core::Shape CsvSeriesDataset::shape() const {
  core::Shape s;
  s.window = window_;
  s.horizon = horizon_;
  s.features = static_cast<int64_t>(series_->feature_index.size());
  s.targets = static_cast<int64_t>(series_->target_index.size());
  return s;
}

Batch CsvSeriesDataset::get(const at::Tensor& indices) const {
  const at::Tensor idx = indices.contiguous();
  const int64_t n = idx.numel();
  const int64_t* ids = idx.data_ptr<int64_t>();
  const int64_t m = series_->values.size(1);
  const auto f = static_cast<int64_t>(series_->feature_index.size());
  const auto t = static_cast<int64_t>(series_->target_index.size());
  at::Tensor inputs = at::empty({n, window_, f}, at::kFloat);
  at::Tensor targets = at::empty({n, horizon_, t}, at::kFloat);
  const float* v = series_->values.data_ptr<float>();
  float* x = inputs.data_ptr<float>();
  float* y = targets.data_ptr<float>();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = ids[k];
    if (i < 0 || i >= size()) {
      throw std::out_of_range(fmt::format("series window {} is outside [0, {})", i, size()));
    }
    const int64_t row0 = begin_ + i;
    for (int64_t w = 0; w < window_; ++w) {
      for (int64_t j = 0; j < f; ++j) {
        x[(k * window_ + w) * f + j] = v[(row0 + w) * m + series_->feature_index[j]];
      }
    }
    for (int64_t h = 0; h < horizon_; ++h) {
      for (int64_t j = 0; j < t; ++j) {
        y[(k * horizon_ + h) * t + j] = v[(row0 + window_ + h) * m + series_->target_index[j]];
      }
    }
  }
  return {inputs, targets};
}

std::unique_ptr<Dataset> make_csv_dataset(const DataOptions& o) {
  if (o.path.empty()) throw DataError("data.path: empty; give the CSV file of the time series");
  auto series = std::make_shared<const CsvSeries>(
      read_csv_series(o.path, o.features, o.targets, o.val_fraction));
  const int64_t rows = series->values.size(0);
  std::shared_ptr<const Dataset> validation;
  if (series->train_rows < rows) {
    validation = std::make_shared<CsvSeriesDataset>(series, series->train_rows, rows, o.window,
                                                    o.horizon, o.path);
  }
  return std::make_unique<CsvSeriesDataset>(series, 0, series->train_rows, o.window, o.horizon,
                                            o.path, validation);
}

}  // namespace data
