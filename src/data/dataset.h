// Dataset: samples addressed by index. Datasets know nothing of ranks: the sampler (ddp) decides
// which indices a rank reads.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace data {

struct Batch {
  at::Tensor inputs;   // [n, input_dim]: float32 features, or int64 ids (movielens)
  at::Tensor targets;  // [n] int64 class ids (zeros where the task has none)
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t input_dim() const = 0;
  virtual int64_t num_classes() const = 0;
  // Samples at `indices` (int64, CPU), in that order, on the CPU.
  virtual Batch get(const at::Tensor& indices) const = 0;
};

// The data section of the config (declared with defaults in launcher/config_schema.cpp).
struct DataOptions {
  std::string dataset;
  int64_t num_samples = 0;
  int64_t input_dim = 0;
  int64_t num_classes = 0;
  int64_t teacher_hidden = 0;
  double label_noise = 0.0;
  uint64_t seed = 0;
  std::string path;       // movielens: a directory holding ratings.dat and movies.dat
  int64_t text_len = 64;  // movielens: bytes of each item's text
  int64_t negatives = 8;  // movielens: samples (each with its own negative) per interaction
};

// The dataset names make_dataset knows.
std::vector<std::string> dataset_names();

// Throws std::invalid_argument for an unknown dataset name; each dataset throws its own errors
// for bad files.
std::unique_ptr<Dataset> make_dataset(const DataOptions& options);

}  // namespace data
