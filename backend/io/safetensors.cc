#include "backend/io/safetensors.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "costmodel/atomic_file.h"
#include "costmodel/input_error.h"
#include "costmodel/json_input.h"

namespace oom::backend {
namespace {

std::int64_t element_bytes(const std::string& dtype, at::ScalarType* type) {
  if (dtype == "F32") { *type = at::kFloat; return 4; }
  if (dtype == "BF16") { *type = at::kBFloat16; return 2; }
  if (dtype == "F16") { *type = at::kHalf; return 2; }
  if (dtype == "I64") { *type = at::kLong; return 8; }
  return 0;
}

}  // namespace

std::map<std::string, at::Tensor> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "cannot open the safetensors file");
  std::ostringstream buf;
  buf << in.rdbuf();
  const std::string bytes = buf.str();
  if (bytes.size() < 8) throw InputError(path, "file too short for a safetensors header");
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  if (header_len > bytes.size() - 8) {
    throw InputError(path, "header_length", std::to_string(header_len), "header runs past the end of the file");
  }
  const auto header = parse_json_text(bytes.substr(8, header_len), path);
  if (!header.is_object()) throw InputError(path, "the safetensors header is not a JSON object");
  const std::size_t data_start = 8 + header_len;
  const std::size_t data_len = bytes.size() - data_start;
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const JsonReader r(info, path, name);
    at::ScalarType type{};
    const std::string dtype = r.string("dtype");
    const auto esize = element_bytes(dtype, &type);
    if (esize == 0) r.fail("dtype", "unsupported dtype (expected F32, BF16, F16 or I64)");
    const auto shape = r.integer_list("shape", 0, std::int64_t{1} << 40);
    const auto offsets = r.integer_list("data_offsets", 0, static_cast<std::int64_t>(data_len));
    if (offsets.size() != 2 || offsets[0] > offsets[1]) r.fail("data_offsets", "expected [begin, end] with begin ≤ end");
    std::int64_t numel = 1;
    for (auto d : shape) numel *= d;
    if (offsets[1] - offsets[0] != numel * esize) {
      r.fail("data_offsets", "byte range does not match shape × dtype size (" + std::to_string(numel * esize) + " bytes)");
    }
    auto t = at::empty(shape, at::TensorOptions().dtype(type));
    std::memcpy(t.data_ptr(), bytes.data() + data_start + offsets[0], static_cast<std::size_t>(numel * esize));
    out.emplace(name, t);
  }
  return out;
}

void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    const auto c = t.detach().to(at::kCPU).to(at::kFloat).contiguous();
    const auto begin = data.size();
    data.append(static_cast<const char*>(c.data_ptr()), static_cast<std::size_t>(c.numel()) * 4);
    header[name] = {{"dtype", "F32"}, {"shape", c.sizes().vec()}, {"data_offsets", {begin, data.size()}}};
  }
  const std::string h = header.dump();
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[static_cast<std::size_t>(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  file += h;
  file += data;
  write_file_atomically(path, file);
}

}  // namespace oom::backend
