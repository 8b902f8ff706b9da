#include "cachet/io/file.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace cachet::io {

bool is_gzip(std::string_view data) {
  return data.size() >= 2 && static_cast<unsigned char>(data[0]) == 0x1f &&
         static_cast<unsigned char>(data[1]) == 0x8b;
}

std::string gunzip(std::string_view data, std::string_view what) {
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 32) != Z_OK) throw ReadError(std::string(what) + ": zlib init failed");
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  std::string out;
  char buf[1 << 16];
  int rc = Z_OK;
  while (true) {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    rc = inflate(&zs, Z_NO_FLUSH);
    out.append(buf, sizeof buf - zs.avail_out);
    if (rc == Z_STREAM_END) {
      // Concatenated gzip members: keep going.
      if (zs.avail_in == 0) break;
      inflateReset(&zs);
      continue;
    }
    if (rc != Z_OK) {
      std::string msg = std::string(what) + ": corrupt or truncated gzip data";
      if (zs.msg) msg += std::string(" (") + zs.msg + ")";
      inflateEnd(&zs);
      throw ReadError(msg);
    }
    if (zs.avail_in == 0 && zs.avail_out != 0) {
      inflateEnd(&zs);
      throw ReadError(std::string(what) + ": truncated gzip data (unexpected end of file)");
    }
  }
  inflateEnd(&zs);
  return out;
}

void check_not_directory(const std::string& path, std::string_view what_is_read) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return;
  std::vector<std::string> files;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) files.push_back(it->path().filename().string());
  std::sort(files.begin(), files.end());
  std::string found = "it holds no files";
  if (!files.empty()) {
    found = "in it: ";
    for (std::size_t i = 0; i < files.size() && i < 5; ++i) found += (i ? ", " : "") + files[i];
    if (files.size() > 5) found += ", and " + std::to_string(files.size() - 5) + " more";
  }
  std::string msg = path + ": is a directory, not a file; pass one file (" + found + ")";
  if (!what_is_read.empty()) msg += ". " + std::string(what_is_read);
  throw ReadError(msg);
}

std::string read_file(const std::string& path) {
  check_not_directory(path, "");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ReadError(path + ": cannot open (" + std::strerror(errno) + ")");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ReadError(path + ": read error");
  std::string data = std::move(ss).str();
  if (is_gzip(data)) return gunzip(data, path);
  return data;
}

}  // namespace cachet::io
