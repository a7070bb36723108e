// The data section's keys (data::DataOptions), each declared once with its default.

#include "config/key_builders.h"
#include "data/dataset.h"
#include "data/registry.h"

namespace config::schema {
namespace {

// One source of data.mixture: {path, weight, name}, name defaulting to the folder's last
// component.
data::MixtureSource mixture_source(const YAML::Node& n, size_t i) {
  if (!n.IsMap()) {
    throw ValueError(
        fmt::format("[{}]: expected a map {{path, weight, name}}, got {}", i, kind_of(n)));
  }
  data::MixtureSource s;
  bool weighted = false;
  for (const auto& entry : n) {
    const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : "";
    const YAML::Node& v = entry.second;
    if ((key == "path" || key == "name") && (!v.IsScalar() || v.Scalar().empty())) {
      throw ValueError(
          fmt::format("[{}].{}: expected a non-empty string, got {}", i, key, kind_of(v)));
    }
    if (key == "path") {
      s.path = v.Scalar();
    } else if (key == "name") {
      s.name = v.Scalar();
    } else if (key == "weight") {
      try {
        s.weight = parse_real(v);
      } catch (const ValueError& e) {
        throw ValueError(fmt::format("[{}].weight: {}", i, e.what()));
      }
      if (!(s.weight > 0)) {
        throw ValueError(fmt::format("[{}].weight: {} must be above 0 (a source with no weight "
                                     "is never drawn: leave it out)",
                                     i, s.weight));
      }
      weighted = true;
    } else {
      throw ValueError(fmt::format("[{}]: unknown key '{}' (expected path, weight, name)", i, key));
    }
  }
  if (s.path.empty()) throw ValueError(fmt::format("[{}].path: missing", i));
  if (!weighted) throw ValueError(fmt::format("[{}].weight: missing", i));
  if (s.name.empty()) {
    std::string path = s.path;
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    s.name = path.substr(path.find_last_of('/') + 1);
  }
  return s;
}

KeyDef mixture_key() {
  return {"data.mixture",
          "list",
          "[]",
          "[{path, weight, name}, ...]",
          "tokens: several sources drawn by weight instead of data.path, each a folder of .bin "
          "shards (its *val* files its validation split), with a weight above 0 and a name "
          "(default: the folder's); evaluated apart and together",
          false,
          [](Config& c, const YAML::Node& n) {
            if (!n.IsSequence()) {
              throw ValueError(
                  fmt::format("expected a list of {{path, weight, name}}, got {}", kind_of(n)));
            }
            std::vector<data::MixtureSource> sources;
            for (size_t i = 0; i < n.size(); ++i) {
              sources.push_back(mixture_source(n[i], i));
              for (size_t j = 0; j < i; ++j) {
                if (sources[j].name == sources[i].name) {
                  throw ValueError(fmt::format("[{}].name: '{}' is also [{}]'s (names must differ)",
                                               i, sources[i].name, j));
                }
              }
            }
            c.data.mixture = std::move(sources);
          },
          [](const Config& c) {
            std::vector<std::string> items;
            for (const auto& s : c.data.mixture) {
              items.push_back(fmt::format("{{path: \"{}\", weight: {}, name: \"{}\"}}", s.path,
                                          s.weight, s.name));
            }
            return fmt::format("[{}]", fmt::join(items, ", "));
          }};
}

// Which data, and how token data is read.
std::vector<KeyDef> source_keys() {
  return {
      choice("data.dataset", FIELD(data.dataset), "synthetic", data::dataset_names(),
             "dataset to train on"),
      text("data.path", FIELD(data.path), "",
           "movielens: directory with ratings.dat and movies.dat; tokens: a .bin shard or a "
           "directory of them (training: files without 'val' in the name); csv: a .csv file; "
           "images: a directory of .png files"),
      text("data.val_path", FIELD(data.val_path), "",
           "tokens: validation shard(s) (empty: the files in data.path with 'val' in the name); "
           "images: a directory of validation .png files (empty: data.val_fraction of data.path)"),
      mixture_key(),
      integer("data.context", FIELD(data.context), "256", 1, 1 << 20,
              "tokens: positions per sample (each reads context + 1 tokens)"),
      integer("data.vocab_size", FIELD(data.vocab_size), "50257", 1, 1 << 30,
              "tokens: token ids must be below this (50257: GPT-2 BPE; 256: bytes)"),
      enum_choice("data.packing", FIELD(data.packing), "auto", data::kPackingNames,
                  "tokens: documents fills each data.context window with whole documents "
                  "(positions restart at each, attention never crosses one; a longer document is "
                  "split), packed best-fit; none cuts windows from the token stream; auto: "
                  "documents when the shards carry document boundaries (scripts/tokenize_text.py "
                  "--chat writes them), none otherwise"),
      text("data.tokenizer", FIELD(data.tokenizer), "auto",
           "tokens: the encoding of the ids, for --generate and train.sample_every: auto, bytes, "
           "gpt2 or the path of a BPE tokenizer.json, byte-level or SentencePiece-style (auto: the "
           "tokenizer.json beside model.init_from's weights, else bytes when data.vocab_size <= "
           "256, gpt2 when it is 50257)")};
}

}  // namespace

std::vector<KeyDef> data_keys() {
  std::vector<KeyDef> keys = source_keys();
  std::vector<KeyDef> rest = {
      text_list("data.features", FIELD(data.features), "[]",
                "csv: input columns by header name (empty: every column whose first value is a "
                "number, the targets' past values included)"),
      text_list("data.targets", FIELD(data.targets), "[]", "csv: predicted columns by header name"),
      integer("data.window", FIELD(data.window), "48", 1, 1 << 20,
              "csv: time steps the model reads"),
      integer("data.horizon", FIELD(data.horizon), "1", 1, 1 << 20,
              "csv: time steps the model predicts"),
      real("data.val_fraction", FIELD(data.val_fraction), "0.1", 0.0, 1.0, false, false,
           "csv: the last fraction of rows held out for validation (normalisation uses the "
           "rest); images: of files, when data.val_path is empty"),
      integer("data.patch_size", FIELD(data.patch_size), "64", 4, 1 << 16,
              "images: side of the clean target crop, in pixels (a multiple of data.scale)"),
      integer("data.scale", FIELD(data.scale), "1", 1, 4,
              "images: 1 denoises; 2 or 4 super-resolves (inputs downscaled by it)"),
      real("data.noise_std", FIELD(data.noise_std), "0.1", 0.0, 1.0, false, false,
           "images: std of Gaussian noise added to inputs (pixel values in [0, 1])"),
      integer("data.crops_per_image", FIELD(data.crops_per_image), "16", 1, 1 << 20,
              "images: random crops per image per epoch"),
      integer("data.workers", FIELD(data.workers), "2", 0, 256,
              "loader threads reading ahead (0: read in the training thread)"),
      integer("data.prefetch", FIELD(data.prefetch), "2", 1, 1024,
              "steps read ahead of the one training"),
      integer("data.inject_read_delay_ms", FIELD(data.inject_read_delay_ms), "0", 0, 600000,
              "test hook: every read of a step's samples sleeps this long (a slow file system)"),
      integer("data.text_len", FIELD(data.text_len), "64", 1, 1 << 16,
              "movielens: bytes of item text (title | genres) per item"),
      integer("data.negatives", FIELD(data.negatives), "8", 1, 1000,
              "movielens: samples per training interaction per epoch, each with its own random "
              "negative item"),
      integer("data.num_samples", FIELD(data.num_samples), "16384", 1, 1LL << 40,
              "samples in the synthetic dataset"),
      integer("data.input_dim", FIELD(data.input_dim), "32", 1, 1 << 20,
              "features per synthetic sample"),
      integer("data.num_classes", FIELD(data.num_classes), "10", 2, 1 << 20,
              "classes of the synthetic task"),
      integer("data.teacher_hidden", FIELD(data.teacher_hidden), "64", 1, 1 << 20,
              "width of the random teacher that labels synthetic data"),
      real("data.label_noise", FIELD(data.label_noise), "0.0", 0.0, 1.0, false, false,
           "fraction of synthetic labels replaced at random"),
      seed("data.seed", FIELD(data.seed), "1234",
           "seed of the synthetic data, MovieLens negatives, image crops and noise")};
  keys.insert(keys.end(), rest.begin(), rest.end());
  return keys;
}

}  // namespace config::schema
