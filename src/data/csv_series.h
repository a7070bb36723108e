// CsvSeriesDataset: windows of a time series read from a CSV file with a header row.
//
// File rules: the first line names the columns (comma-separated; spaces around a name or value
// are ignored); every later non-empty line is one time step with a value for every column. The
// used columns (features and targets) must hold numbers; other columns (a timestamp, say) are
// never parsed. `features` empty means every column whose first value is a number (the targets'
// past values included). Problems are DataErrors naming the file, and the line and column for a
// bad value.
//
// Split and normalisation: the first rows - round(val_fraction * rows) rows train, the rest
// validate. Each used column is normalised with the mean and standard deviation of its training
// rows (a constant column: std 1), in both splits. Windows never cross the split: sample i of a
// split reads rows [i, i + window) of the features as inputs [window, features] and rows
// [i + window, i + window + horizon) of the targets as targets [horizon, targets], float32.
// Immutable after construction; get() may run on several threads.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace data {

struct CsvSeries {
  std::vector<std::string> columns;    // the used columns: features first, then targets
  std::vector<int64_t> feature_index;  // into `columns`
  std::vector<int64_t> target_index;   // into `columns`
  at::Tensor values;                   // float [rows, columns.size()], normalised
  at::Tensor mean;                     // per used column, over the training rows
  at::Tensor std;
  int64_t train_rows = 0;
};

// Reads and normalises `path` (data.features, data.targets, data.val_fraction). Throws DataError.
CsvSeries read_csv_series(const std::string& path, const std::vector<std::string>& features,
                          const std::vector<std::string>& targets, double val_fraction);

class CsvSeriesDataset final : public Dataset {
 public:
  // Rows [begin, end) of `series`. Throws DataError naming `path` when they hold no window.
  CsvSeriesDataset(std::shared_ptr<const CsvSeries> series, int64_t begin, int64_t end,
                   int64_t window, int64_t horizon, const std::string& path,
                   std::shared_ptr<const Dataset> validation = nullptr);
  int64_t size() const override { return end_ - begin_ - window_ - horizon_ + 1; }
  core::Shape shape() const override;
  Batch get(const at::Tensor& indices) const override;
  std::shared_ptr<const Dataset> validation() const override { return validation_; }
  const CsvSeries& series() const { return *series_; }

 private:
  std::shared_ptr<const CsvSeries> series_;
  int64_t begin_, end_, window_, horizon_;
  std::shared_ptr<const Dataset> validation_;
};

}  // namespace data
