#include "costmodel/json_input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "costmodel/output_path.h"

namespace oom {

std::string read_input_file(const std::string& path, const std::string& expected) {
  // The type is checked before the file is opened: opening a FIFO blocks until a writer comes,
  // and opening some devices acts on them. O_NONBLOCK and fstat() cover a swap in between.
  auto refuse_unless_regular = [&](const struct stat& st) {
    if (S_ISDIR(st.st_mode)) throw InputError(path, "is a directory, expected " + expected);
    if (!S_ISREG(st.st_mode)) throw InputError(path, fmt::format("is {}, not a regular file: expected {}", file_type_name(st.st_mode), expected));
  };
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) throw InputError(path, "file not found");
    throw InputError(path, fmt::format("cannot be read: {}", std::strerror(errno)));
  }
  refuse_unless_regular(st);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw InputError(path, fmt::format("cannot be read: {}", std::strerror(errno)));
  std::string text;
  try {
    if (::fstat(fd, &st) != 0) throw InputError(path, fmt::format("cannot be read: {}", std::strerror(errno)));
    refuse_unless_regular(st);
    text.reserve(static_cast<std::size_t>(st.st_size));
    char buffer[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw InputError(path, fmt::format("cannot be read: {}", std::strerror(errno)));
      if (n == 0) break;
      text.append(buffer, static_cast<std::size_t>(n));
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return text;
}

nlohmann::json read_json_file(const std::string& path) { return parse_json_text(read_input_file(path, "a JSON file"), path); }

namespace {

// At most `limit` bytes of `s`, those outside printable ASCII as \xNN, so that an error line
// stays one readable line.
std::string printable(const std::string& s, std::size_t limit) {
  std::string out;
  for (const unsigned char c : s.substr(0, limit)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return s.size() > limit ? out + "..." : out;
}

// Builds the document from a SAX parse while following the path to the value being read, in one
// pass: a parse error names the field it stopped in, and a key its object already holds is
// refused (nlohmann's own DOM parse keeps the later value and says nothing). It builds as that
// parse does (one map insertion per key), so the check costs no second pass.
class DocumentBuilder : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit DocumentBuilder(const std::string& origin) : origin_(origin) {}

  nlohmann::json take() { return std::move(root_); }
  // "a.b[2]" of the value where parsing stopped; empty at the document root. A path longer than
  // 120 characters (deep nesting, huge keys) keeps its innermost end.
  std::string path() const {
    std::string p;
    for (std::size_t i = 0; i < frames_.size(); ++i) {
      const Frame& f = frames_[i];
      if (f.container->is_array()) {
        // An innermost list failed on its next element; outer frames point at the open one.
        p += fmt::format("[{}]", f.index + (i + 1 == frames_.size() ? 1 : 0));
      } else if (f.has_key) {
        p += (p.empty() ? "" : ".") + f.key;
      }
    }
    return p.size() > 120 ? "..." + p.substr(p.size() - 117) : p;
  }
  const std::string& token() const { return token_; }
  const std::string& error() const { return error_; }

  bool null() override { return scalar(nullptr); }
  bool boolean(bool b) override { return scalar(b); }
  bool number_integer(number_integer_t n) override { return scalar(n); }
  bool number_unsigned(number_unsigned_t n) override { return scalar(n); }
  bool number_float(number_float_t n, const string_t&) override { return scalar(n); }
  bool string(string_t& s) override { return scalar(std::move(s)); }
  bool binary(binary_t& b) override { return scalar(nlohmann::json::binary(std::move(b))); }
  bool start_object(std::size_t) override {
    frames_.push_back({place(nlohmann::json::object()), {}, false, -1});
    return true;
  }
  bool key(string_t& k) override {
    Frame& f = frames_.back();
    f.key = k;
    f.has_key = true;
    const auto [it, fresh] = f.container->get_ref<nlohmann::json::object_t&>().try_emplace(k);
    if (fresh) {
      slot_ = &it->second;
    } else if (duplicate_depth_ == 0) {
      duplicate_field_ = path();
      duplicate_depth_ = frames_.size();
      slot_ = &duplicate_;
    }
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override {
    frames_.push_back({place(nlohmann::json::array()), {}, false, -1});
    return true;
  }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string& last_token, const nlohmann::json::exception& e) override {
    // Syntax errors (parse_error) and numbers beyond a double such as 1e999 (out_of_range).
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 5: ..."
    token_ = last_token;
    error_ = e.what();
    return false;
  }

 private:
  struct Frame {
    nlohmann::json* container;
    std::string key;  // of an object: the key being read
    bool has_key;
    std::int64_t index;  // of a list: the element being read
  };

  // Puts `value` where the parse is (the root, the next element of a list, the value of the
  // last key) and returns where it went.
  nlohmann::json* place(nlohmann::json&& value) {
    if (frames_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Frame& f = frames_.back();
    if (f.container->is_array()) {
      ++f.index;
      auto& list = f.container->get_ref<nlohmann::json::array_t&>();
      list.push_back(std::move(value));
      return &list.back();
    }
    *slot_ = std::move(value);
    return slot_;
  }
  bool scalar(nlohmann::json&& value) {
    place(std::move(value));
    return whole();
  }
  bool close() {
    frames_.pop_back();
    return whole();
  }
  // A value is whole: the second value of a duplicate key is refused once the parse is back in
  // the object that holds it.
  bool whole() const {
    if (duplicate_depth_ != 0 && frames_.size() == duplicate_depth_) {
      throw InputError(origin_, duplicate_field_, json_value_text(duplicate_), "duplicate key");
    }
    return true;
  }

  const std::string& origin_;
  nlohmann::json root_;
  std::vector<Frame> frames_;
  nlohmann::json* slot_ = nullptr;
  std::size_t duplicate_depth_ = 0;  // frames open when the duplicate key was read; 0: none
  std::string duplicate_field_;
  nlohmann::json duplicate_;
  std::string token_;
  std::string error_;
};

}  // namespace

nlohmann::json parse_json_text(const std::string& text, const std::string& origin) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) throw InputError(origin, "empty, expected JSON");
  DocumentBuilder builder(origin);
  if (nlohmann::json::sax_parse(text, &builder)) return builder.take();
  const std::string& what = builder.error();
  const auto pos = what.find("] ");
  const std::string reason = "malformed JSON: " + printable(pos == std::string::npos ? what : what.substr(pos + 2), 200);
  if (builder.path().empty()) throw InputError(origin, reason);
  throw InputError(origin, builder.path(), builder.token().empty() ? "(end of input)" : printable(builder.token(), 60), reason);
}

namespace {

// Appends the compact dump of `value` to `out` until `out` holds more than `limit` characters;
// every nesting level adds a character, so the recursion stays shallow for any document.
void dump_prefix(const nlohmann::json& value, std::string& out, std::size_t limit) {
  if (out.size() > limit) return;
  if (value.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, item] : value.items()) {
      if (out.size() > limit) return;
      out += first ? "" : ",";
      first = false;
      out += nlohmann::json(key).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + ":";
      dump_prefix(item, out, limit);
    }
    out += '}';
  } else if (value.is_array()) {
    out += '[';
    for (std::size_t i = 0; i < value.size() && out.size() <= limit; ++i) {
      out += i == 0 ? "" : ",";
      dump_prefix(value[i], out, limit);
    }
    out += ']';
  } else {
    out += value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
}

}  // namespace

std::string json_value_text(const nlohmann::json& value) {
  std::string text;
  dump_prefix(value, text, 60);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

JsonReader::JsonReader(const nlohmann::json& json, std::string file, std::string path)
    : json_(json), file_(std::move(file)), path_(std::move(path)) {
  if (!json_.is_object()) {
    throw InputError(file_, path_.empty() ? "document" : path_, json_value_text(json_),
                     "expected a JSON object");
  }
}

std::string JsonReader::field(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

bool JsonReader::has(const std::string& key) const {
  const auto it = json_.find(key);
  return it != json_.end() && !it->is_null();
}

void JsonReader::fail(const std::string& key, const std::string& reason) const {
  const auto it = json_.find(key);
  fail_value(field(key), it == json_.end() ? nlohmann::json() : *it, reason);
}

void JsonReader::fail_value(const std::string& field_path, const nlohmann::json& value,
                            const std::string& reason) const {
  throw InputError(file_, field_path, value.is_null() ? "(missing)" : json_value_text(value), reason);
}

const nlohmann::json& JsonReader::require(const std::string& key) const {
  const auto it = json_.find(key);
  if (it == json_.end() || it->is_null()) fail(key, "required field is missing");
  return *it;
}

JsonReader JsonReader::object(const std::string& key) const {
  const auto& v = require(key);
  if (!v.is_object()) fail(key, "expected an object");
  return JsonReader(v, file_, field(key));
}

const nlohmann::json& JsonReader::array(const std::string& key) const {
  const auto& v = require(key);
  if (!v.is_array()) fail(key, "expected an array");
  return v;
}

std::int64_t JsonReader::to_integer(const std::string& field_path, const nlohmann::json& v,
                                    std::int64_t min, std::int64_t max) const {
  std::int64_t value = 0;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(INT64_MAX)) fail_value(field_path, v, "integer too large");
    value = static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    value = v.get<std::int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) {
      fail_value(field_path, v, "expected an integer");
    }
    value = static_cast<std::int64_t>(d);
  } else {
    fail_value(field_path, v, "expected an integer");
  }
  if (value < min || value > max) {
    fail_value(field_path, v, fmt::format("out of range {}..{}", min, max));
  }
  return value;
}

std::int64_t JsonReader::integer(const std::string& key, std::int64_t min, std::int64_t max) const {
  return to_integer(field(key), require(key), min, max);
}

std::optional<std::int64_t> JsonReader::optional_integer(const std::string& key, std::int64_t min,
                                                         std::int64_t max) const {
  if (!has(key)) return std::nullopt;
  return integer(key, min, max);
}

std::int64_t JsonReader::integer_or(const std::string& key, std::int64_t fallback, std::int64_t min,
                                    std::int64_t max) const {
  return has(key) ? integer(key, min, max) : fallback;
}

double JsonReader::number(const std::string& key, double min, double max) const {
  const auto& v = require(key);
  if (!v.is_number()) fail(key, "expected a number");
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail(key, "expected a finite number");
  if (d < min || d > max) fail(key, fmt::format("out of range {}..{}", min, max));
  return d;
}

std::optional<double> JsonReader::optional_number(const std::string& key, double min, double max) const {
  if (!has(key)) return std::nullopt;
  return number(key, min, max);
}

double JsonReader::number_or(const std::string& key, double fallback, double min, double max) const {
  return has(key) ? number(key, min, max) : fallback;
}

bool JsonReader::boolean(const std::string& key) const {
  const auto& v = require(key);
  if (!v.is_boolean()) fail(key, "expected true or false");
  return v.get<bool>();
}

bool JsonReader::boolean_or(const std::string& key, bool fallback) const {
  return has(key) ? boolean(key) : fallback;
}

std::string JsonReader::string(const std::string& key) const {
  const auto& v = require(key);
  if (!v.is_string()) fail(key, "expected a string");
  return v.get<std::string>();
}

std::string JsonReader::string_or(const std::string& key, const std::string& fallback) const {
  return has(key) ? string(key) : fallback;
}

std::string JsonReader::one_of(const std::string& key, std::initializer_list<const char*> allowed) const {
  const std::string s = string(key);
  std::string names;
  for (const char* a : allowed) {
    if (s == a) return s;
    names += names.empty() ? "" : ", ";
    names += a;
  }
  fail(key, "expected one of " + names);
}

std::vector<std::int64_t> JsonReader::integer_list(const std::string& key, std::int64_t min,
                                                   std::int64_t max) const {
  const auto& v = require(key);
  if (!v.is_array()) fail(key, "expected a list of integers");
  std::vector<std::int64_t> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    out.push_back(to_integer(fmt::format("{}[{}]", field(key), i), v[i], min, max));
  }
  return out;
}

std::vector<std::string> JsonReader::string_list(const std::string& key) const {
  const auto& v = require(key);
  if (!v.is_array()) fail(key, "expected a list of strings");
  std::vector<std::string> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) fail_value(fmt::format("{}[{}]", field(key), i), v[i], "expected a string");
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

void JsonReader::reject_unknown_keys(std::initializer_list<const char*> known) const {
  reject_unknown_keys(std::span<const char* const>(known.begin(), known.size()));
}

void JsonReader::reject_unknown_keys(std::span<const char* const> known) const {
  for (const auto& [key, value] : json_.items()) {
    if (path_.empty() && key == kOomVersionKey) {
      if (!value.is_string()) fail(key, "expected a string (the oom release that wrote the file)");
      continue;
    }
    bool found = false;
    for (const char* k : known) found = found || key == k;
    if (!found) fail_value(field(key), value, "unknown field");
  }
}

}  // namespace oom
