// JsonReader: type and range checks with errors naming file, field path and value.
#include "costmodel/json_input.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "costmodel/input_error.h"

namespace oom {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(JsonInput, NestedFieldPathsAndValuesAppearInErrors) {
  const nlohmann::json j = nlohmann::json::parse(R"({"split": {"n": "four"}, "xs": [1, 2, -3]})");
  const JsonReader r(j, "p.json");
  EXPECT_EQ(error_of([&] { r.object("split").integer("n", 0, 10); }),
            "p.json: field 'split.n': value \"four\": expected an integer");
  EXPECT_EQ(error_of([&] { r.integer_list("xs", 0, 10); }), "p.json: field 'xs[2]': value -3: out of range 0..10");
  EXPECT_EQ(error_of([&] { r.integer("missing", 0, 1); }), "p.json: field 'missing': value (missing): required field is missing");
}

TEST(JsonInput, NonFiniteAndHugeNumbersAreRejected) {
  // 1e999 overflows a double: the parser refuses it as malformed JSON, naming the origin.
  EXPECT_EQ(error_of([] { parse_json_text(R"({"big": 1e999})", "x.json"); }),
            "x.json: field 'big': value 1e999: malformed JSON: number overflow parsing '1e999'");
  const nlohmann::json j = nlohmann::json::parse(R"({"huge": 123456789012345678901234567890, "f": 2.5, "u": 18446744073709551615})");
  const JsonReader r(j, "x.json");
  EXPECT_EQ(error_of([&] { r.integer("huge", 0, 1LL << 40); }), "x.json: field 'huge': value 1.2345678901234568e+29: expected an integer");
  EXPECT_EQ(error_of([&] { r.integer("u", 0, 1LL << 40); }), "x.json: field 'u': value 18446744073709551615: integer too large");
  EXPECT_EQ(error_of([&] { r.integer("f", 0, 10); }), "x.json: field 'f': value 2.5: expected an integer");
}

TEST(JsonInput, OneOfListsTheAllowedValues) {
  const nlohmann::json j = {{"path", "tp"}};
  EXPECT_EQ(error_of([&] { JsonReader(j, "p.json").one_of("path", {"ep", "local"}); }),
            "p.json: field 'path': value \"tp\": expected one of ep, local");
}

TEST(JsonInput, FileProblemsNameTheFile) {
  const auto dir = std::filesystem::temp_directory_path() / "oom_json_input_test";
  std::filesystem::create_directories(dir);
  EXPECT_EQ(error_of([&] { read_json_file((dir / "nope.json").string()); }), (dir / "nope.json").string() + ": file not found");
  EXPECT_EQ(error_of([&] { read_json_file(dir.string()); }), dir.string() + ": is a directory, expected a JSON file");
  std::ofstream((dir / "empty.json").string()).close();
  EXPECT_EQ(error_of([&] { read_json_file((dir / "empty.json").string()); }), (dir / "empty.json").string() + ": empty, expected JSON");
  std::ofstream((dir / "trunc.json").string()) << "{\"a\": [1, 2";
  EXPECT_NE(error_of([&] { read_json_file((dir / "trunc.json").string()); }).find("malformed JSON: parse error"), std::string::npos);
  std::ofstream((dir / "latin1.json").string()) << "{\"a\": \"caf\xe9\"}";
  EXPECT_NE(error_of([&] { read_json_file((dir / "latin1.json").string()); }).find("malformed JSON"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(JsonInput, RootMustBeAnObject) {
  EXPECT_EQ(error_of([] { JsonReader(nlohmann::json::array(), "a.json"); }), "a.json: field 'document': value []: expected a JSON object");
}

// A key an object already holds is refused, naming its path and its second value, at any depth
// and whatever that value is (nlohmann's parse alone keeps the last and says nothing).
TEST(JsonInput, DuplicateKeysAreRefusedNamingTheirPath) {
  EXPECT_EQ(error_of([] { parse_json_text(R"({"gpu": {"hbm_gib": 80, "count": 8, "hbm_gib": 141}})", "hw.json"); }),
            "hw.json: field 'gpu.hbm_gib': value 141: duplicate key");
  EXPECT_EQ(error_of([] { parse_json_text(R"({"numa": [{"cores": 8}, {"cores": 8, "cores": {"n": [1, 2]}}]})", "hw.json"); }),
            "hw.json: field 'numa[1].cores': value {\"n\":[1,2]}: duplicate key");
  EXPECT_EQ(error_of([] { parse_json_text(R"({"a": [1, [2, 3]], "b": 1, "a": []})", "x.json"); }),
            "x.json: field 'a': value []: duplicate key");
  // The same key in two objects, or twice as a value, is no duplicate.
  EXPECT_EQ(parse_json_text(R"({"a": {"k": 1}, "b": {"k": "k"}, "k": ["k", "k"]})", "x.json")["b"]["k"], "k");
}

// kOomVersionKey: a string at the document root of any format, an unknown field elsewhere.
TEST(JsonInput, OomVersionIsKnownAtTheRootOnly) {
  const nlohmann::json j = nlohmann::json::parse(R"({"a": 1, "oom_version": "1.2.0", "s": {"oom_version": "1.2.0"}})");
  EXPECT_NO_THROW(JsonReader(j, "x.json").reject_unknown_keys({"a", "s"}));
  EXPECT_EQ(error_of([&] { JsonReader(j, "x.json").object("s").reject_unknown_keys({"a"}); }),
            "x.json: field 's.oom_version': value \"1.2.0\": unknown field");
  const nlohmann::json number = {{"oom_version", 1.2}};
  EXPECT_EQ(error_of([&] { JsonReader(number, "x.json").reject_unknown_keys({"a"}); }),
            "x.json: field 'oom_version': value 1.2: expected a string (the oom release that wrote the file)");
}

// A FIFO (or a link to one) given as an input is refused at once, without opening it: opening a
// FIFO for reading blocks until a writer comes.
TEST(JsonInput, AFifoIsRefusedWithoutBlocking) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "oom-input-fifo-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::filesystem::path dir = tmpl;
  ASSERT_EQ(::mkfifo((dir / "config.json").c_str(), 0644), 0);
  std::filesystem::create_symlink("config.json", dir / "link.json");
  for (const auto& p : {dir / "config.json", dir / "link.json"}) {
    EXPECT_EQ(error_of([&] { read_json_file(p.string()); }), p.string() + ": is a FIFO, not a regular file: expected a JSON file");
  }
  EXPECT_EQ(error_of([&] { read_input_file("/dev/null", "a trace"); }), "/dev/null: is a character device, not a regular file: expected a trace");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace oom
