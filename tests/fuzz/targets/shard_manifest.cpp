// A sharded checkpoint's manifest.json (io/shard_manifest.h) through parse_manifest, which
// read_manifest and resume use, and then each tensor's read plan (pieces_for) as a resume at
// another world size asks for it. Typed error: io::ShardManifestError.
#include "io/shard_manifest.h"
#include "fuzz_target.h"

TRAINER_FUZZ_TARGET(shard_manifest) {
  try {
    const io::ShardManifest m = io::parse_manifest(std::string(fuzz::as_text(data, size)), "fuzz");
    for (const auto& [name, tensor] : m.tensors) {
      const int64_t n = tensor.numel();
      io::pieces_for(m, name, 0, n);
      io::pieces_for(m, name, n / 3, n - n / 3);
    }
    io::manifest_to_json(m);
  } catch (const io::ShardManifestError&) {
  }
  return 0;
}
