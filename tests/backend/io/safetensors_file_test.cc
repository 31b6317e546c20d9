// backend/io/safetensors_file.h: header checks, mapped reads, dtype conversions, the writer, and
// agreement with Hugging Face's own safetensors package (the project's virtual environment).
#include "backend/io/safetensors_file.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/backend/io/io_test_support.h"

namespace oom::io {
namespace {

using testing::expect_input_error;
using testing::read_all;
using testing::ScratchDir;
using testing::write_all;

constexpr DType kAllDTypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64,
                                DType::I32, DType::I16, DType::I8,  DType::U8,   DType::BOOL};

// A safetensors file from header text and `data_len` zero bytes of data.
std::string raw_file(const std::string& header, std::size_t data_len) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(data_len, '\0');
}

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 17 + 7) & 0xff);
  return v;
}

TEST(DType, NamesRoundTripAndSizes) {
  for (const DType d : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::BOOL), 1u);
  EXPECT_FALSE(parse_dtype("F8_E4M3").has_value());
  EXPECT_FALSE(parse_dtype("f32").has_value());
}

TEST(SafetensorsFile, EveryDtypeRoundTripsThroughTheWriterAndTheMapping) {
  ScratchDir dir;
  std::vector<TensorToWrite> tensors;
  std::vector<std::vector<std::byte>> payloads;
  for (const DType d : kAllDTypes) payloads.push_back(pattern(3 * 5 * dtype_size(d), static_cast<unsigned>(d)));
  for (std::size_t i = 0; i < std::size(kAllDTypes); ++i) {
    TensorToWrite t{std::string("t.") + dtype_name(kAllDTypes[i]), kAllDTypes[i], {3, 5}, {}, nullptr};
    if (i % 2 == 0) {
      t.data = payloads[i].data();  // straight from the caller's memory
    } else {
      const auto* src = &payloads[i];
      t.fill = [src](std::byte* dst) { std::memcpy(dst, src->data(), src->size()); };
    }
    tensors.push_back(std::move(t));
  }
  const float scalar = 2.5f;
  tensors.push_back({"scalar", DType::F32, {}, {}, &scalar});
  tensors.push_back({"empty", DType::BF16, {0, 7}, {}, nullptr});
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"note", "a \"quoted\" value"}};
  const std::string path = dir.file("all.safetensors");
  write_safetensors(path, tensors, meta);

  const SafetensorsFile f(path, SafetensorsFile::Access::Sequential);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (std::size_t i = 0; i < std::size(kAllDTypes); ++i) {
    const TensorInfo* t = f.find(tensors[i].name);
    ASSERT_NE(t, nullptr) << tensors[i].name;
    EXPECT_EQ(t->dtype, kAllDTypes[i]);
    EXPECT_EQ(t->shape, (std::vector<std::int64_t>{3, 5}));
    EXPECT_EQ(t->numel(), 15);
    const auto bytes = f.bytes(*t);
    ASSERT_EQ(bytes.size(), payloads[i].size());
    EXPECT_EQ(std::memcmp(bytes.data(), payloads[i].data(), bytes.size()), 0) << t->name;
  }
  const TensorInfo* s = f.find("scalar");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->numel(), 1);
  float back = 0;
  convert_to_f32(f.bytes(*s), DType::F32, &back, 1);
  EXPECT_EQ(back, 2.5f);
  const TensorInfo* e = f.find("empty");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->numel(), 0);
  EXPECT_TRUE(f.bytes(*e).empty());
  EXPECT_EQ(f.find("absent"), nullptr);

  // The data section starts 8-byte aligned (the header is padded with spaces).
  const std::string file = read_all(path);
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(file[8], '{');
}

TEST(SafetensorsFile, MovesKeepTheMapping) {
  ScratchDir dir;
  const float v[3] = {1, 2, 3};
  write_safetensors(dir.file("a.safetensors"), {{"v", DType::F32, {3}, {}, v}}, {});
  SafetensorsFile a(dir.file("a.safetensors"));
  const auto bytes = a.bytes(*a.find("v"));
  SafetensorsFile b(std::move(a));
  EXPECT_EQ(b.bytes(*b.find("v")).data(), bytes.data());
  SafetensorsFile c(dir.file("a.safetensors"));
  c = std::move(b);
  float out[3];
  convert_to_f32(c.bytes(*c.find("v")), DType::F32, out, 3);
  EXPECT_EQ(out[2], 3.0f);
  c.release(0, c.file_size());  // pages dropped, contents still readable
  convert_to_f32(c.bytes(*c.find("v")), DType::F32, out, 3);
  EXPECT_EQ(out[1], 2.0f);
}

TEST(SafetensorsFile, MissingEmptyAndFolderPathsAreInputErrorsNamingTheFile) {
  ScratchDir dir;
  expect_input_error([&] { SafetensorsFile f(dir.file("none.safetensors")); }, {dir.file("none.safetensors"), "no such file"});
  expect_input_error([&] { SafetensorsFile f(dir.path().string()); }, {dir.path().string(), "folder"});
  write_all(dir.file("empty.safetensors"), "");
  expect_input_error([&] { SafetensorsFile f(dir.file("empty.safetensors")); }, {dir.file("empty.safetensors"), "empty"});
  write_all(dir.file("short.safetensors"), "abc");
  expect_input_error([&] { SafetensorsFile f(dir.file("short.safetensors")); }, {"short.safetensors", "'header length'"});
}

struct BadHeader {
  const char* what;
  std::string file;
  std::vector<std::string> parts;  // each must appear in the message
};

TEST(ParseSafetensorsHeader, MalformedHeadersAreOneLineErrorsNamingFileFieldAndValue) {
  const std::string ok_entry = R"("w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  std::string huge(8, '\0');
  huge[3] = 0x20;  // N = 512 MiB
  std::vector<BadHeader> cases = {
      {"length past the file", raw_file("{}", 0).replace(0, 1, "\x40"), {"'header length'", "value 64"}},
      {"length over 100 MiB", huge, {"'header length'", "100 MiB"}},
      {"not an object", raw_file(R"([1,2])", 0), {"'header'", "start with '{'"}},
      {"not JSON", raw_file(R"({"w": )", 0), {"'w'", "malformed JSON"}},
      {"number beyond a double", raw_file(R"({"w": 1e9999})", 0), {"'w'", "1e9999", "malformed JSON"}},
      {"tensor named twice", raw_file("{" + ok_entry + ", " + ok_entry + "}", 8), {"'w'", "duplicate key"}},
      {"entry not an object", raw_file(R"({"w": 3})", 0), {"'w'", "value 3"}},
      {"unknown dtype", raw_file(R"({"w": {"dtype": "F8", "shape": [2], "data_offsets": [0, 2]}})", 2),
       {"'w.dtype'", "\"F8\""}},
      {"missing dtype", raw_file(R"({"w": {"shape": [2], "data_offsets": [0, 8]}})", 8), {"'w.dtype'", "(missing)"}},
      {"negative dimension", raw_file(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8),
       {"'w.shape[0]'", "-2"}},
      {"fractional dimension", raw_file(R"({"w": {"dtype": "F32", "shape": [2, 1.5], "data_offsets": [0, 8]}})", 8),
       {"'w.shape[1]'", "1.5"}},
      {"one offset", raw_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8]}})", 8),
       {"'w.data_offsets'", "[8]"}},
      {"begin after end", raw_file(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})", 8),
       {"'w.data_offsets'", "[8,0]", "begin is after end"}},
      {"end past the data", raw_file(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8),
       {"'w.data_offsets'", "[0,16]", "past the data section"}},
      {"size not shape", raw_file(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8),
       {"'w.data_offsets'", "[0,8]", "needs 12"}},
      {"shape overflows", raw_file(R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 8], "data_offsets": [0, 8]}})", 8),
       {"'w.data_offsets'", "more than 2^64"}},
      {"overlap", raw_file("{" + ok_entry + R"(, "v": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12),
       {"'v.data_offsets'", "[4, 12]", "overlaps tensor 'w'"}},
      {"hole", raw_file("{" + ok_entry + R"(, "v": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}})", 16),
       {"'v.data_offsets'", "[12, 16]", "bytes 8..12"}},
      {"data not covered", raw_file("{" + ok_entry + "}", 12), {"'data_offsets'", "cover 8 bytes of the 12-byte"}},
      {"metadata not strings", raw_file(R"({"__metadata__": {"step": 3}})", 0), {"'__metadata__.step'", "value 3"}},
      {"metadata not an object", raw_file(R"({"__metadata__": "x"})", 0), {"'__metadata__'", "\"x\""}},
  };
  for (const BadHeader& c : cases) {
    SCOPED_TRACE(c.what);
    try {
      (void)parse_safetensors_header(c.file, c.what == std::string("length over 100 MiB") ? (1ull << 30) : c.file.size(),
                                     "bad.safetensors");
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("bad.safetensors: ", 0), 0u) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      for (const auto& p : c.parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    }
  }
}

TEST(ParseSafetensorsHeader, AcceptsEmptyTensorsPaddingAndAnEmptyHeader) {
  const std::string file = raw_file(
      R"({"z": {"dtype": "I8", "shape": [0, 3], "data_offsets": [0, 0]}, "w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}   )",
      4);
  const auto h = parse_safetensors_header(file, file.size(), "x");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "z");  // data order, empty ranges first
  EXPECT_EQ(h.tensors[1].begin, h.data_start);
  EXPECT_EQ(h.tensors[1].end, file.size());
  const std::string empty = raw_file("{}", 0);
  EXPECT_TRUE(parse_safetensors_header(empty, empty.size(), "x").tensors.empty());
}

TEST(Convert, EveryBf16PatternSurvivesF32AndBack) {
  for (std::uint32_t u = 0; u < 65536; ++u) {
    const auto b = static_cast<std::uint16_t>(u);
    float f = 0;
    convert_to_f32(std::as_bytes(std::span(&b, 1)), DType::BF16, &f, 1);
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    ASSERT_EQ(bits, u << 16);  // exact: a shift
    std::uint16_t back = 0;
    convert_from_f32(&f, 1, DType::BF16, reinterpret_cast<std::byte*>(&back));
    if (std::isnan(f)) {
      ASSERT_TRUE((back & 0x7f80) == 0x7f80 && (back & 0x7f) != 0) << u;
    } else {
      ASSERT_EQ(back, b) << u;
    }
  }
}

TEST(Convert, EveryF16PatternSurvivesF32AndBackAndDecodesToItsValue) {
  for (std::uint32_t u = 0; u < 65536; ++u) {
    const auto h = static_cast<std::uint16_t>(u);
    float f = 0;
    convert_to_f32(std::as_bytes(std::span(&h, 1)), DType::F16, &f, 1);
    const int exp = (u >> 10) & 0x1f, mant = u & 0x3ff;
    const double sign = (u & 0x8000) ? -1 : 1;
    if (exp == 31) {
      ASSERT_TRUE(mant ? std::isnan(f) : std::isinf(f)) << u;
    } else {
      const double expect = exp == 0 ? sign * mant * std::ldexp(1.0, -24) : sign * (1024 + mant) * std::ldexp(1.0, exp - 25);
      ASSERT_EQ(static_cast<double>(f), expect) << u;
    }
    std::uint16_t back = 0;
    convert_from_f32(&f, 1, DType::F16, reinterpret_cast<std::byte*>(&back));
    if (std::isnan(f)) {
      ASSERT_TRUE((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0) << u;
    } else {
      ASSERT_EQ(back, h) << u;
    }
  }
}

std::uint16_t to_half(float f) {
  std::uint16_t h;
  convert_from_f32(&f, 1, DType::F16, reinterpret_cast<std::byte*>(&h));
  return h;
}
std::uint16_t to_bf16(float f) {
  std::uint16_t h;
  convert_from_f32(&f, 1, DType::BF16, reinterpret_cast<std::byte*>(&h));
  return h;
}
double half_value(std::uint16_t h) {
  float f;
  convert_to_f32(std::as_bytes(std::span(&h, 1)), DType::F16, &f, 1);
  return f;
}

TEST(Convert, RoundingToNearestEvenAtTiesOverflowAndSubnormals) {
  EXPECT_EQ(to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, even above
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x7f7fffffu)), 0x7f80);  // FLT_MAX rounds to infinity
  EXPECT_TRUE(std::isnan(std::bit_cast<float>(static_cast<std::uint32_t>(to_bf16(std::bit_cast<float>(0x7f800001u))) << 16)));
  EXPECT_EQ(to_half(1.0f), 0x3c00);
  EXPECT_EQ(to_half(65504.0f), 0x7bff);
  EXPECT_EQ(to_half(65519.99f), 0x7bff);
  EXPECT_EQ(to_half(65520.0f), 0x7c00);  // tie with an odd neighbour: up, to infinity
  EXPECT_EQ(to_half(-1e9f), 0xfc00);
  EXPECT_EQ(to_half(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(to_half(std::ldexp(1.0f, -25)), 0x0000);      // tie, even (zero)
  EXPECT_EQ(to_half(3 * std::ldexp(1.0f, -25)), 0x0002);  // tie, even (two units)
  EXPECT_EQ(to_half(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400);  // rounds up to the smallest normal
  EXPECT_EQ(to_half(-0.0f), 0x8000);
  // Random floats: the result is a nearest half, and an even one at a tie.
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0x477fefffu);
  for (int i = 0; i < 200000; ++i) {
    const float f = std::bit_cast<float>(bits(rng));
    const std::uint16_t h = to_half(f);
    const double d = std::abs(f - half_value(h));
    const double up = std::abs(f - half_value(static_cast<std::uint16_t>(h + 1)));
    ASSERT_LE(d, up) << f;
    if (h > 0) {
      const double down = std::abs(f - half_value(static_cast<std::uint16_t>(h - 1)));
      ASSERT_LE(d, down) << f;
      if (d == down || d == up) ASSERT_EQ(h & 1, 0) << f;
    }
  }
}

// Large conversions take the streaming-store paths: every alignment of source and destination
// gives the element-by-element result.
TEST(Convert, LargeBf16AndF32ConversionsMatchElementwiseAtEveryAlignment) {
  const std::int64_t n = (std::int64_t{1} << 18) + 37;
  std::vector<std::uint16_t> bf16(n + 8);
  std::vector<float> f32(n + 8);
  for (std::int64_t i = 0; i < n + 8; ++i) {
    bf16[i] = static_cast<std::uint16_t>(i * 2654435761u >> 7);
    f32[i] = static_cast<float>(i) * 0.37f - 1000.0f;
  }
  std::vector<float> out(n + 8);
  for (int src_shift : {0, 1}) {
    for (int dst_shift : {0, 1, 3}) {
      SCOPED_TRACE(::testing::Message() << "src +" << src_shift << " dst +" << dst_shift);
      convert_to_f32(std::as_bytes(std::span(bf16.data() + src_shift, n)), DType::BF16, out.data() + dst_shift, n);
      for (std::int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(out[dst_shift + i]), static_cast<std::uint32_t>(bf16[src_shift + i]) << 16) << i;
      }
      // Source one byte off 4-byte alignment, as in a file whose header length is not padded.
      std::vector<std::byte> raw(4 * n + 1);
      std::memcpy(raw.data() + src_shift, f32.data(), 4 * n);
      convert_to_f32(std::span(raw).subspan(src_shift, 4 * n), DType::F32, out.data() + dst_shift, n);
      ASSERT_EQ(std::memcmp(out.data() + dst_shift, f32.data(), 4 * n), 0);
    }
  }
}

TEST(Convert, F64RoundsAndOtherDtypesAreRefused) {
  const double d[3] = {1.0 / 3.0, -2.0, 1e300};
  float f[3];
  convert_to_f32(std::as_bytes(std::span(d)), DType::F64, f, 3);
  EXPECT_EQ(f[0], 1.0f / 3.0f);
  EXPECT_EQ(f[1], -2.0f);
  EXPECT_TRUE(std::isinf(f[2]));
  EXPECT_THROW(convert_to_f32(std::as_bytes(std::span(d)), DType::I32, f, 3), std::invalid_argument);
  EXPECT_THROW(convert_to_f32(std::as_bytes(std::span(d)), DType::F64, f, 4), std::invalid_argument);
  EXPECT_THROW(convert_from_f32(f, 3, DType::I8, reinterpret_cast<std::byte*>(f)), std::invalid_argument);
}

TEST(WriteSafetensors, AFailingFillLeavesTheOldFileAndNoTemporary) {
  ScratchDir dir;
  const std::string path = dir.file("m.safetensors");
  const float one = 1;
  write_safetensors(path, {{"a", DType::F32, {1}, {}, &one}}, {});
  const std::string before = read_all(path);
  std::vector<TensorToWrite> bad = {{"a", DType::F32, {1}, {}, &one},
                                    {"b", DType::F32, {4}, [](std::byte*) { throw std::runtime_error("source gone"); }, nullptr}};
  EXPECT_THROW(write_safetensors(path, bad, {}), std::runtime_error);
  EXPECT_THROW(write_safetensors(path, {{"a", DType::F32, {1}, {}, &one}, {"a", DType::F32, {1}, {}, &one}}, {}),
               std::invalid_argument);
  EXPECT_THROW(write_safetensors(path, {{"c", DType::F32, {2}, {}, nullptr}}, {}), std::invalid_argument);
  EXPECT_EQ(read_all(path), before);
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1);
}

// The fuzz seeds were written by safetensors.torch.save_file: each is a valid file.
TEST(SafetensorsFile, OpensTheFuzzSeedsWrittenBySaveFile) {
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(OOM_SOURCE_DIR) + "/tests/fuzz/seeds/safetensors_header")) {
    const SafetensorsFile f(e.path().string());
    EXPECT_FALSE(f.tensors().empty()) << e.path();
    ++files;
  }
  EXPECT_GE(files, 4);
  const SafetensorsFile m(std::string(OOM_SOURCE_DIR) + "/tests/fuzz/seeds/safetensors_header/f16-f64-metadata.safetensors");
  EXPECT_EQ(m.metadata().at("step"), "12");
  float h[3];
  convert_to_f32(m.bytes(*m.find("h")), DType::F16, h, 3);
  EXPECT_EQ(h[0], 0.5f);
  EXPECT_TRUE(std::signbit(h[1]));
}

// ---- agreement with the safetensors package --------------------------------------------------

std::string venv_python() { return std::string(OOM_SOURCE_DIR) + "/.venv/bin/python"; }

// True when the venv's python imports safetensors and torch; under CI=true their absence fails.
bool python_ready() {
  const std::string py = venv_python();
  const bool ci = std::getenv("CI") != nullptr && std::string(std::getenv("CI")) == "true";
  const bool ok = std::filesystem::exists(py) &&
                  std::system((py + " -c 'import safetensors.torch, torch' >/dev/null 2>&1").c_str()) == 0;
  if (!ok && ci) ADD_FAILURE() << py << " with safetensors and torch is required under CI=true (scripts/install-deps.sh)";
  return ok;
}

std::string run_python(const std::string& script, const std::string& arg_a, const std::string& arg_b) {
  ScratchDir dir;
  write_all(dir.file("x.py"), script);
  const std::string cmd = venv_python() + " " + dir.file("x.py") + " " + arg_a + " " + arg_b + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  EXPECT_EQ(status, 0) << out;
  return out;
}

TEST(SafetensorsPython, ReadsWhatSaveFileWritesAndSaveFileReadsOurs) {
  if (!python_ready()) GTEST_SKIP() << venv_python() << " with safetensors and torch not found";
  ScratchDir dir;
  // Ours → python: values of every dtype, and FP32 values python rounds to BF16/F16 for us to check.
  std::vector<float> f32(4099);
  std::mt19937 rng(3);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0xffffffffu);
  for (std::size_t i = 0; i < f32.size(); ++i) {
    f32[i] = std::bit_cast<float>(bits(rng));
    if (std::isnan(f32[i])) f32[i] = 1.5f;
  }
  f32[0] = std::bit_cast<float>(0x3f808000u);
  f32[1] = 65520.0f;
  f32[2] = 3 * std::ldexp(1.0f, -25);
  const std::int64_t i64[3] = {-5, 0, 1ll << 40};
  const std::uint8_t flags[3] = {1, 0, 1};
  std::vector<std::uint16_t> bf16(f32.size());
  convert_from_f32(f32.data(), static_cast<std::int64_t>(f32.size()), DType::BF16, reinterpret_cast<std::byte*>(bf16.data()));
  write_safetensors(dir.file("ours.safetensors"),
                    {{"f32", DType::F32, {static_cast<std::int64_t>(f32.size())}, {}, f32.data()},
                     {"bf16", DType::BF16, {static_cast<std::int64_t>(f32.size())}, {}, bf16.data()},
                     {"i64", DType::I64, {3}, {}, i64},
                     {"flags", DType::BOOL, {3}, {}, flags}},
                    {{"format", "pt"}});
  const std::string script = R"(
import sys, torch
from safetensors.torch import load_file, save_file
from safetensors import safe_open
t = load_file(sys.argv[1])
with safe_open(sys.argv[1], "pt") as f:
    assert f.metadata() == {"format": "pt"}, f.metadata()
assert torch.equal(t["bf16"].float(), t["f32"].to(torch.bfloat16).float()), "bf16 rounding differs"
assert t["i64"].tolist() == [-5, 0, 1 << 40]
assert t["flags"].dtype == torch.bool and t["flags"].tolist() == [True, False, True]
x = t["f32"]
save_file({"to_bf16": x.to(torch.bfloat16), "to_f16": x.to(torch.float16), "f64": x.double()[:7],
           "grid": torch.arange(12, dtype=torch.int32).reshape(3, 4), "i8": torch.tensor([-128, 127], dtype=torch.int8),
           "u8": torch.tensor([0, 255], dtype=torch.uint8), "i16": torch.tensor([-3], dtype=torch.int16)},
          sys.argv[2], metadata={"from": "python"})
print("ok")
)";
  EXPECT_NE(run_python(script, dir.file("ours.safetensors"), dir.file("theirs.safetensors")).find("ok"), std::string::npos);

  const SafetensorsFile theirs(dir.file("theirs.safetensors"));
  EXPECT_EQ(theirs.metadata().at("from"), "python");
  const std::int64_t n = static_cast<std::int64_t>(f32.size());
  for (const auto& [name, dtype] : {std::pair{"to_bf16", DType::BF16}, std::pair{"to_f16", DType::F16}}) {
    const TensorInfo* t = theirs.find(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, dtype);
    EXPECT_EQ(t->shape, std::vector<std::int64_t>{n});
    std::vector<std::uint16_t> mine(f32.size());
    convert_from_f32(f32.data(), n, dtype, reinterpret_cast<std::byte*>(mine.data()));
    const auto b = theirs.bytes(*t);
    std::vector<std::uint16_t> py(f32.size());
    std::memcpy(py.data(), b.data(), b.size());
    int differ = 0;
    for (std::size_t i = 0; i < py.size(); ++i) differ += py[i] != mine[i];
    EXPECT_EQ(differ, 0) << name << ": torch's rounding and ours differ";
  }
  const TensorInfo* f64 = theirs.find("f64");
  ASSERT_NE(f64, nullptr);
  float back[7];
  convert_to_f32(theirs.bytes(*f64), DType::F64, back, 7);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(std::bit_cast<std::uint32_t>(back[i]), std::bit_cast<std::uint32_t>(f32[i]));
  const TensorInfo* grid = theirs.find("grid");
  ASSERT_NE(grid, nullptr);
  EXPECT_EQ(grid->dtype, DType::I32);
  EXPECT_EQ(grid->shape, (std::vector<std::int64_t>{3, 4}));
  std::int32_t g[12];
  std::memcpy(g, theirs.bytes(*grid).data(), sizeof g);
  EXPECT_EQ(g[11], 11);
  EXPECT_EQ(theirs.find("i8")->dtype, DType::I8);
  EXPECT_EQ(theirs.find("u8")->dtype, DType::U8);
  EXPECT_EQ(theirs.find("i16")->dtype, DType::I16);
}

}  // namespace
}  // namespace oom::io
