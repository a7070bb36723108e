// The file readers, one per format, built from the data section. Each validates on open (sizes,
// headers, columns) and throws data::DataError naming the file and line or byte offset.
//   tokens  token_shards.h   flat uint16 .bin shards (nanoGPT; llm.c's 256-int32 header too);
//                            mixture.h: several such sources by weight (data.mixture)
//   csv     csv_series.h     a CSV time series with a header row
//   images  image_folder.h   a folder of PNG files, random crops degraded on the fly
#pragma once

#include <memory>

#include "data/dataset.h"

namespace data {

std::unique_ptr<Dataset> make_token_dataset(const DataOptions& options);
// data.mixture: several token sources by weight (data/mixture.h).
std::unique_ptr<Dataset> make_mixture_dataset(const DataOptions& options);
std::unique_ptr<Dataset> make_csv_dataset(const DataOptions& options);
std::unique_ptr<Dataset> make_image_dataset(const DataOptions& options);

}  // namespace data
