// cachet/io/file.h: reading input files whole, gzip or plain (detected by magic bytes).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace cachet::io {

// A file could not be read or decoded. what() names the file and what was wrong.
class ReadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The bytes of `path`, gunzipped when they start with the gzip magic. Throws ReadError.
std::string read_file(const std::string& path);

// Throws ReadError when `path` is a directory: "<path>: is a directory, not a file; pass one
// file (in it: a, b, ...). <what_is_read>". read_file() checks this with no what_is_read.
void check_not_directory(const std::string& path, std::string_view what_is_read);

// Gunzips `data` (which must be gzip). `what` names the source in errors.
std::string gunzip(std::string_view data, std::string_view what);

bool is_gzip(std::string_view data);

}  // namespace cachet::io
