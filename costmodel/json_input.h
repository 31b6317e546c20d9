// Reading JSON input with errors that name the file, the field and the value.
//
// read_json_file() loads one JSON document; JsonReader walks an object and checks each field's
// type and range, throwing InputError ("FILE: field 'a.b[2]': value X: reason") on the first
// problem. Field paths are dotted from the document root. Readers are cheap views: they hold a
// reference to the document, which must outlive them. Not thread-safe to share while mutating
// the document; reading from several threads is fine.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace oom {

// The optional field at the root of a document that names the oom release that wrote it. Every
// format the project defines accepts it there (a string; reject_unknown_keys() lets it through)
// and reads nothing from it.
inline constexpr const char* kOomVersionKey = "oom_version";

// Reads a whole input file. Throws InputError when it is missing, a directory (the message says
// `expected`, e.g. "a JSON file"), anything else that is not a regular file after its links are
// followed (a FIFO, a device, a socket: refused before it is opened, so a FIFO never blocks), or
// unreadable. Every input file of the simulator side is read through here.
std::string read_input_file(const std::string& path, const std::string& expected);

// Loads and parses one JSON document. Throws InputError when the file is missing, is a
// directory, is empty, or is not valid JSON (the parser's byte position is named).
nlohmann::json read_json_file(const std::string& path);

// Parses JSON text that came from `origin` (a file name, or "line N of FILE"). A key that an
// object already holds is refused ("duplicate key", naming its path and second value) instead
// of the later value silently replacing the earlier. Every input file goes through here.
nlohmann::json parse_json_text(const std::string& text, const std::string& origin);

// A short printable form of a JSON value for error messages (at most ~60 characters).
std::string json_value_text(const nlohmann::json& value);

class JsonReader {
 public:
  // `json` must be an object, else InputError naming `path` (or "document" at the root).
  JsonReader(const nlohmann::json& json, std::string file, std::string path = "");

  const nlohmann::json& raw() const { return json_; }
  const std::string& file() const { return file_; }
  // The dotted path of `key` inside this object, e.g. "split.gdn_chunk_tokens".
  std::string field(const std::string& key) const;

  // Present and not null.
  bool has(const std::string& key) const;

  JsonReader object(const std::string& key) const;
  // The array under `key` (present, not null, an array), else InputError.
  const nlohmann::json& array(const std::string& key) const;
  std::int64_t integer(const std::string& key, std::int64_t min, std::int64_t max) const;
  std::optional<std::int64_t> optional_integer(const std::string& key, std::int64_t min,
                                               std::int64_t max) const;
  std::int64_t integer_or(const std::string& key, std::int64_t fallback, std::int64_t min,
                          std::int64_t max) const;
  double number(const std::string& key, double min, double max) const;
  std::optional<double> optional_number(const std::string& key, double min, double max) const;
  double number_or(const std::string& key, double fallback, double min, double max) const;
  bool boolean(const std::string& key) const;
  bool boolean_or(const std::string& key, bool fallback) const;
  std::string string(const std::string& key) const;
  std::string string_or(const std::string& key, const std::string& fallback) const;
  // A string that must be one of `allowed`.
  std::string one_of(const std::string& key, std::initializer_list<const char*> allowed) const;
  std::vector<std::int64_t> integer_list(const std::string& key, std::int64_t min,
                                         std::int64_t max) const;
  std::vector<std::string> string_list(const std::string& key) const;

  // Rejects keys of this object that are not in `known` (catches misspelled plan fields). At the
  // document root (an empty path) kOomVersionKey is known too, and must be a string.
  void reject_unknown_keys(std::initializer_list<const char*> known) const;
  void reject_unknown_keys(std::span<const char* const> known) const;

  // Throws InputError for `key` of this object with its current value.
  [[noreturn]] void fail(const std::string& key, const std::string& reason) const;
  [[noreturn]] void fail_value(const std::string& field_path, const nlohmann::json& value,
                               const std::string& reason) const;

 private:
  const nlohmann::json& require(const std::string& key) const;
  std::int64_t to_integer(const std::string& field_path, const nlohmann::json& v, std::int64_t min,
                          std::int64_t max) const;

  const nlohmann::json& json_;
  std::string file_;
  std::string path_;
};

}  // namespace oom
