// A file written under a temporary name in its destination's folder and renamed into place only
// when complete: the building block of crash-safe output (see costmodel/atomic_file.h) for
// writers that stream large files or replace several files together.
//
// Lifecycle: construct (creates ".NAME.tmp-XXXXXX" beside the destination), write() any number
// of times, finish() (fchmod 0644, fsync, close), then commit() (rename over the destination).
// A TempFile destroyed before commit() removes its temporary file, so an exception leaves
// nothing half-written behind. Not thread-safe; movable, not copyable.
#pragma once

#include <cstddef>
#include <string>

namespace oom::io {

class TempFile {
 public:
  // Throws std::runtime_error naming `destination` when the temporary file cannot be created.
  explicit TempFile(std::string destination);
  ~TempFile();
  TempFile(TempFile&& other) noexcept;
  TempFile& operator=(TempFile&&) = delete;
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write(const void* data, std::size_t bytes);  // throws std::runtime_error on an I/O error
  void finish();                                     // fchmod 0644 + fsync + close
  void commit();                                     // finish() if needed, then rename into place
  const std::string& temp_path() const { return temp_; }
  const std::string& destination() const { return destination_; }
  // Hands the finished temporary file to the caller (who renames or removes it).
  std::string release();

 private:
  std::string destination_;
  std::string temp_;
  int fd_ = -1;
  bool owned_ = true;  // the destructor removes temp_
};

// fsyncs a folder so that renames into it are durable; errors are ignored (best effort).
void sync_folder(const std::string& folder);

}  // namespace oom::io
