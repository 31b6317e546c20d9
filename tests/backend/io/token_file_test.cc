// backend/io/token_file.h: llm.c's token-file layout read and written, every header field checked
// with one error naming the file, the field and the value, bounds-checked reads.
#include "backend/io/token_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "costmodel/input_error.h"

namespace oom::io {
namespace {

namespace fs = std::filesystem;

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("oom_io_" + name + "_" + std::to_string(::getpid()));
}

std::string header(std::int32_t magic, std::int32_t version, std::int32_t count) {
  std::string h(kTokenFileHeaderBytes, '\0');
  const std::int32_t fields[3] = {magic, version, count};
  std::memcpy(h.data(), fields, sizeof(fields));  // the test machine is little-endian, like the format
  return h;
}

std::string error_of(const std::string& bytes) {
  try {
    TokenFile::from_bytes(bytes, "t.bin");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(TokenFile, WrittenFilesReadBackInBothVersions) {
  const std::vector<std::uint32_t> small = {0, 1, 65535, 42, 7};
  const std::vector<std::uint32_t> large = {0, 151643, 70000, 3};
  const auto p1 = temp_path("v1"), p2 = temp_path("v2");
  write_token_file(p1.string(), small, 1);
  write_token_file(p2.string(), large, 2);
  EXPECT_EQ(fs::file_size(p1), 1024u + 2 * small.size());
  EXPECT_EQ(fs::file_size(p2), 1024u + 4 * large.size());
  EXPECT_TRUE(looks_like_token_file(p1.string()));
  const TokenFile a(p1.string());
  ASSERT_EQ(a.size(), 5);
  EXPECT_EQ(a.version(), 1);
  for (std::size_t i = 0; i < small.size(); ++i) EXPECT_EQ(a[static_cast<std::int64_t>(i)], small[i]);
  EXPECT_EQ(a.max_token(), 65535u);
  EXPECT_EQ(a.max_token_position(), 2);
  TokenFile b(p2.string());
  EXPECT_EQ(b.version(), 2);
  std::vector<std::int64_t> out(3, -1);
  b.copy(1, 3, out.data());
  EXPECT_EQ(out, (std::vector<std::int64_t>{151643, 70000, 3}));
  EXPECT_EQ(b.max_token(), 151643u);
  // A moved file still reads its mapping.
  TokenFile moved = std::move(b);
  EXPECT_EQ(moved[1], 151643u);
  fs::remove(p1);
  fs::remove(p2);
}

TEST(TokenFile, ReadsPastEitherEndThrowAndLeaveTheOutputAlone) {
  const auto f = TokenFile::from_bytes(header(kTokenFileMagic, 1, 2) + std::string("\x05\x00\x06\x00", 4), "t.bin");
  std::int64_t out[3] = {-1, -1, -1};
  EXPECT_THROW(f.copy(1, 2, out), std::out_of_range);
  EXPECT_THROW(f.copy(-1, 1, out), std::out_of_range);
  EXPECT_THROW(f.copy(0, -1, out), std::out_of_range);
  EXPECT_EQ(out[0], -1);
  f.copy(0, 2, out);
  EXPECT_EQ(out[0], 5);
  EXPECT_EQ(out[1], 6);
  f.copy(2, 0, out);  // an empty range at the end is fine
}

TEST(TokenFile, BadHeadersAreOneLineNamingTheFieldAndValue) {
  EXPECT_NE(error_of("short").find("header"), std::string::npos);
  const auto magic = error_of(header(20240521, 1, 0));
  EXPECT_NE(magic.find("t.bin"), std::string::npos) << magic;
  EXPECT_NE(magic.find("'magic'"), std::string::npos) << magic;
  EXPECT_NE(magic.find("20240521"), std::string::npos) << magic;
  const auto version = error_of(header(kTokenFileMagic, 3, 0));
  EXPECT_NE(version.find("'version'"), std::string::npos) << version;
  EXPECT_NE(version.find("value 3"), std::string::npos) << version;
  const auto negative = error_of(header(kTokenFileMagic, 1, -4));
  EXPECT_NE(negative.find("'token count'"), std::string::npos) << negative;
  EXPECT_NE(negative.find("-4"), std::string::npos) << negative;
  // One token too few, one byte too many: the size must be exact.
  const auto truncated = error_of(header(kTokenFileMagic, 2, 2) + std::string(4, '\0'));
  EXPECT_NE(truncated.find("'token count'"), std::string::npos) << truncated;
  EXPECT_NE(error_of(header(kTokenFileMagic, 1, 1) + std::string(3, '\0')), "");
  EXPECT_EQ(error_of(header(kTokenFileMagic, 1, 0)), "");
  EXPECT_THROW(TokenFile("/nonexistent/tokens.bin"), InputError);
}

TEST(TokenFile, VersionOneRefusesIdsAboveSixteenBitsAndWritesNothing) {
  const auto p = temp_path("refuse");
  const std::vector<std::uint32_t> tokens = {1, 65536};
  try {
    write_token_file(p.string(), tokens, 1);
    FAIL() << "wrote 65536 as uint16";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tokens[1]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("65536"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(p));
  EXPECT_THROW(write_token_file(p.string(), tokens, 3), InputError);
  EXPECT_FALSE(looks_like_token_file("/nonexistent/tokens.bin"));
}

}  // namespace
}  // namespace oom::io
