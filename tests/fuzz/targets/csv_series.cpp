// A CSV time series through make_csv_dataset (data.name: csv): the header, the cells, the
// normalisation, then every window of both splits read. The first byte picks the settings
// (data.window 1 to 4, data.horizon 1 or 2, data.features every numeric column or two named ones);
// data.targets is "load", as in data/timeseries-sample. Typed error: data::DataError.
#include <ATen/ATen.h>

#include "data/errors.h"
#include "data/readers.h"
#include "fuzz_target.h"

TRAINER_FUZZ_TARGET(csv_series) {
  if (size == 0) return 0;
  data::DataOptions options;
  options.path = fuzz::write_file("csv_series/series.csv", fuzz::as_text(data + 1, size - 1));
  options.window = 1 + (data[0] & 3);
  options.horizon = 1 + ((data[0] >> 2) & 1);
  if ((data[0] & 8) != 0) options.features = {"temperature", "humidity"};
  options.targets = {"load"};
  options.val_fraction = (data[0] & 16) != 0 ? 0.25 : 0.0;
  try {
    const auto dataset = data::make_csv_dataset(options);
    const data::Dataset* splits[] = {dataset.get(), dataset->validation().get()};
    for (const data::Dataset* split : splits) {
      if (split == nullptr || split->size() == 0) continue;
      split->get(at::arange(std::min<int64_t>(split->size(), 64), at::kLong));
    }
  } catch (const data::DataError&) {
  }
  return 0;
}
