// model.safetensors.index.json text → parse_shard_index (backend/io), and on acceptance that every
// shard is a plain file name ending in .safetensors, so joining it to the folder stays inside it.
#include "backend/io/checkpoint_folder.h"
#include "tests/fuzz/fuzz_support.h"

using namespace oom;

OOM_FUZZ_TARGET(shard_index) {
  io::ShardIndex index;
  if (!fuzz::accepts([&] { index = io::parse_shard_index(input, "model.safetensors.index.json"); })) return;
  for (const auto& [tensor, shard] : index.weight_map) {
    OOM_FUZZ_CHECK(!tensor.empty());
    OOM_FUZZ_CHECK(shard.size() > 12 && shard.compare(shard.size() - 12, 12, ".safetensors") == 0);
    OOM_FUZZ_CHECK(shard.front() != '.' && shard.find('/') == std::string::npos && shard.find('\0') == std::string::npos);
  }
}
