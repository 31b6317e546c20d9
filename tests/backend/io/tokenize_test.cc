// scripts/tokenize.py: text tokenized with a tokenizer.json by the `tokenizers` library reads back
// through the C++ TokenFile as the library's own ids, documents (files, or .jsonl lines) separated
// by EOS; uint32 tokens above 65,536 vocabulary entries. Needs the project's Python (.venv with
// tokenizers): skipped without it, except under CI=true where a missing Python or library fails.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/io/token_file.h"

namespace oom::io {
namespace {

namespace fs = std::filesystem;

bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

int sh(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Builds the tokenizer and the expected ids; false (after FAIL under CI) when Python or the
// library is missing.
bool make_tokenizer(const fs::path& dir, int vocab, const std::vector<fs::path>& texts, nlohmann::json* expected) {
  const std::string python = OOM_VENV_PYTHON;
  std::string cmd = python + " " + OOM_SOURCE_DIR "/tests/io/make_tokenizer.py " + dir.string() + " " + std::to_string(vocab);
  for (const auto& t : texts) cmd += " " + t.string();
  const int rc = fs::exists(python) ? sh(cmd) : 3;
  if (rc == 3) {
    if (in_ci()) {
      ADD_FAILURE() << python << " with the tokenizers library is needed (scripts/install-deps.sh)";
    }
    return false;
  }
  EXPECT_EQ(rc, 0) << cmd;
  std::ifstream in(dir / "expected.json");
  *expected = nlohmann::json::parse(in);
  return rc == 0;
}

fs::path write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
  return p;
}

std::vector<std::int64_t> read_all(const fs::path& p) {
  const TokenFile f(p.string());
  std::vector<std::int64_t> out(static_cast<std::size_t>(f.size()));
  f.copy(0, f.size(), out.data());
  return out;
}

TEST(TokenizeScript, TheReaderSeesTheTokenizersIdsWithEosBetweenDocuments) {
  const fs::path dir = fs::temp_directory_path() / ("oom_tokenize_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto a = write_text(dir / "a.txt", "w1 w2 w3\nw4 w5 w99 w7");
  const auto b = write_text(dir / "b.txt", "w8 w9 nope w1");
  nlohmann::json expected;
  if (!make_tokenizer(dir / "tok", 300, {a, b}, &expected)) GTEST_SKIP() << "no Python with tokenizers";
  const std::string script = OOM_VENV_PYTHON " " OOM_SOURCE_DIR "/scripts/tokenize.py --tokenizer " + (dir / "tok").string();
  ASSERT_EQ(sh(script + " --out " + (dir / "t.bin").string() + " " + a.string() + " " + b.string() + " >/dev/null"), 0);
  const std::int64_t eos = expected["eos"];
  std::vector<std::int64_t> want = expected["docs"][0];
  want.push_back(eos);
  for (std::int64_t id : expected["docs"][1]) want.push_back(id);
  const TokenFile f((dir / "t.bin").string());
  EXPECT_EQ(f.version(), 1);
  EXPECT_EQ(read_all(dir / "t.bin"), want);
  EXPECT_EQ(want.size(), 12u);  // 7 + EOS + 4 words, the unknown word included
  // A .jsonl file holds one document per line's "text": the same stream as the two files.
  std::ofstream(dir / "docs.jsonl") << nlohmann::json{{"text", "w1 w2 w3\nw4 w5 w99 w7"}}.dump() << "\n\n"
                                    << nlohmann::json{{"text", "w8 w9 nope w1"}}.dump() << "\n";
  ASSERT_EQ(sh(script + " --out " + (dir / "j.bin").string() + " " + (dir / "docs.jsonl").string() + " >/dev/null"), 0);
  EXPECT_EQ(read_all(dir / "j.bin"), want);
  // --append-eos ends every document with EOS; the tokenizer.json file itself works as --tokenizer.
  ASSERT_EQ(sh(OOM_VENV_PYTHON " " OOM_SOURCE_DIR "/scripts/tokenize.py --tokenizer " + (dir / "tok" / "tokenizer.json").string() +
               " --append-eos --out " + (dir / "e.bin").string() + " " + a.string() + " >/dev/null"), 0);
  std::vector<std::int64_t> want_e = expected["docs"][0];
  want_e.push_back(eos);
  EXPECT_EQ(read_all(dir / "e.bin"), want_e);
  // A missing input is one error and no file.
  EXPECT_NE(sh(script + " --out " + (dir / "x.bin").string() + " " + (dir / "missing.txt").string() + " 2>/dev/null"), 0);
  EXPECT_FALSE(fs::exists(dir / "x.bin"));
  fs::remove_all(dir);
}

TEST(TokenizeScript, VocabulariesAboveSixteenBitsWriteUint32Tokens) {
  const fs::path dir = fs::temp_directory_path() / ("oom_tokenize_big_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto a = write_text(dir / "a.txt", "w70000 w3 w65536 w65535");
  nlohmann::json expected;
  if (!make_tokenizer(dir / "tok", 70010, {a}, &expected)) GTEST_SKIP() << "no Python with tokenizers";
  ASSERT_EQ(sh(OOM_VENV_PYTHON " " OOM_SOURCE_DIR "/scripts/tokenize.py --tokenizer " + (dir / "tok").string() + " --out " +
               (dir / "t.bin").string() + " " + a.string() + " >/dev/null"), 0);
  const TokenFile f((dir / "t.bin").string());
  EXPECT_EQ(f.version(), 2);
  EXPECT_EQ(read_all(dir / "t.bin"), (std::vector<std::int64_t>{70000, 3, 65536, 65535}));
  EXPECT_EQ(f.max_token(), 70000u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace oom::io
