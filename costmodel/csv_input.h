// Reading CSV input (the study and ablation CSVs `oom plot` draws) with errors that name the file,
// the line and the column.
//
// The form is the one this project writes (experiments/study.h's study_csv(), ablation_csv()):
// cells separated by commas; a cell in double quotes may hold commas, line breaks and doubled
// quotes; records end with "\n" or "\r\n", the last one optionally not. The first record is the
// header. check_csv_table() checks every record against it: as many cells as the header names, and
// each cell of a numeric column a finite decimal number, or empty where the column allows an
// absent value. Errors are InputError with the file written "FILE:LINE" (the record's first line,
// counted from 1), the field the column's name and the value the cell as written, quoted:
//   error: s.csv:3: field 'gpus': value "four": expected a finite number
// Pure functions; thread-safe.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace oom {

struct CsvRecord {
  int line = 0;  // the line the record starts on, from 1
  std::vector<std::string> cells;
};

// Splits `text` into records. Throws InputError naming `file` and the line of a quoted cell that
// is not closed or is followed by anything but a comma or the record's end.
std::vector<CsvRecord> parse_csv(const std::string& text, const std::string& file);

// What a column holds: text, a finite number, or a finite number or nothing (an absent value,
// e.g. a baseline that ran out of memory).
enum class CsvColumn { kText, kNumber, kNumberOrEmpty };

// Checks the records of parse_csv() (the first is the header, which must name every column of
// `required`) against the header: cell counts, and each cell by the kind `column_of` gives its
// column's name. Throws InputError naming `file`:LINE, the column and the cell; a record with
// cells beyond the header's names no column (there is none) and says how many it has.
void check_csv_table(const std::vector<CsvRecord>& records, const std::string& file, const std::vector<std::string>& required,
                     const std::function<CsvColumn(const std::string& column)>& column_of);

}  // namespace oom
