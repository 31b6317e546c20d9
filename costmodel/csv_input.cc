#include "costmodel/csv_input.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "costmodel/json_input.h"

namespace oom {
namespace {

std::string at_line(const std::string& file, int line) { return fmt::format("{}:{}", file, line); }

// A cell as the message prints it: quoted, at most ~60 characters.
std::string cell_text(const std::string& cell) { return json_value_text(nlohmann::json(cell)); }

bool is_finite_number(const std::string& cell) {
  double v = 0;
  const char* end = cell.data() + cell.size();
  const auto [ptr, ec] = std::from_chars(cell.data(), end, v);
  return ec == std::errc() && ptr == end && std::isfinite(v);
}

}  // namespace

std::vector<CsvRecord> parse_csv(const std::string& text, const std::string& file) {
  std::vector<CsvRecord> records;
  int line = 1;
  std::size_t i = 0;
  while (i < text.size()) {
    CsvRecord record{line, {}};
    while (true) {  // one cell per pass
      std::string cell;
      if (i < text.size() && text[i] == '"') {
        const int opened = line;
        ++i;
        while (true) {
          if (i >= text.size()) throw InputError(at_line(file, opened), "a quoted cell is not closed");
          if (text[i] == '"') {
            if (i + 1 < text.size() && text[i + 1] == '"') {
              cell += '"';
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          if (text[i] == '\n') ++line;
          cell += text[i++];
        }
        if (i < text.size() && text[i] != ',' && text[i] != '\n' && !(text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n')) {
          throw InputError(at_line(file, line), fmt::format("a quoted cell is followed by '{}', not a comma or the line's end", text[i]));
        }
      } else {
        while (i < text.size() && text[i] != ',' && text[i] != '\n' && !(text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n')) {
          cell += text[i++];
        }
      }
      record.cells.push_back(std::move(cell));
      if (i < text.size() && text[i] == ',') {
        ++i;
        continue;
      }
      if (i < text.size() && text[i] == '\r') ++i;
      if (i < text.size()) ++i;  // the '\n'
      ++line;
      break;
    }
    records.push_back(std::move(record));
  }
  return records;
}

void check_csv_table(const std::vector<CsvRecord>& records, const std::string& file, const std::vector<std::string>& required,
                     const std::function<CsvColumn(const std::string& column)>& column_of) {
  if (records.empty()) throw InputError(file, "the CSV is empty");
  const std::vector<std::string>& header = records.front().cells;
  for (const auto& name : required) {
    if (std::find(header.begin(), header.end(), name) == header.end()) {
      throw InputError(at_line(file, records.front().line), fmt::format("the header has no column '{}'", name));
    }
  }
  std::vector<CsvColumn> kinds;
  for (const auto& name : header) kinds.push_back(column_of(name));
  for (std::size_t r = 1; r < records.size(); ++r) {
    const CsvRecord& rec = records[r];
    const std::string where = at_line(file, rec.line);
    if (rec.cells.size() < header.size()) {
      throw InputError(where, fmt::format("the row has {} cells, the header {}: column '{}' is missing", rec.cells.size(),
                                          header.size(), header[rec.cells.size()]));
    }
    if (rec.cells.size() > header.size()) {
      throw InputError(where, fmt::format("the row has {} cells, the header only {}", rec.cells.size(), header.size()));
    }
    for (std::size_t c = 0; c < header.size(); ++c) {
      const std::string& cell = rec.cells[c];
      if (kinds[c] == CsvColumn::kText || (cell.empty() && kinds[c] == CsvColumn::kNumberOrEmpty)) continue;
      if (!is_finite_number(cell)) {
        throw InputError(where, header[c], cell_text(cell),
                         kinds[c] == CsvColumn::kNumberOrEmpty ? "expected a finite number or nothing (an absent value)"
                                                               : "expected a finite number");
      }
    }
  }
}

}  // namespace oom
