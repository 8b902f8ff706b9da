// behaviour_dump: writes or checks the per-op behaviour dump of gpu/'s CachingAllocator
// (tests/data/behaviour/README.md).
//
//   behaviour_dump --write DIR    regenerate DIR/<group>.txt.gz (the baseline: tests/data/behaviour)
//   behaviour_dump --check DIR    regenerate in memory and compare with DIR/<group>.txt.gz; for
//                                 each input that differs, print its first differing line, old
//                                 and new, and the stats that differ after it; exit 1 on any
//                                 difference, 0 when identical
//   behaviour_dump --print        write the dump as plain text to stdout
// Options: --only TEXT (inputs whose name contains TEXT; --check then ignores the others),
// --group NAME (one group), --data DIR (tests/data; default: this checkout's), --jobs N (2).
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cachet/io/file.h"
#include "dump.h"
#include "stats_codec.h"

namespace {

using cachet::behaviour::Input;

struct Options {
  std::string mode, dir, only, group, data = CACHET_TEST_DATA;
  unsigned jobs = 2;
};

int usage() {
  std::cerr << "usage: behaviour_dump (--write DIR | --check DIR | --print) [--only TEXT] [--group NAME]\n"
               "                      [--data DIR] [--jobs N]\n";
  return 2;
}

// The dumps of `inputs`, computed on `jobs` threads, in input order.
std::vector<std::string> run_all(const std::vector<Input>& inputs, unsigned jobs) {
  std::vector<std::string> out(inputs.size());
  std::vector<std::string> errors(inputs.size());
  std::atomic<std::size_t> next{0};
  const auto work = [&] {
    for (std::size_t i; (i = next++) < inputs.size();) try {
        out[i] = cachet::behaviour::dump(inputs[i]);
      } catch (const std::exception& e) {
        errors[i] = inputs[i].name + ": " + e.what();
      }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < std::max(1u, jobs); ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (!e.empty()) throw std::runtime_error(e);
  return out;
}

void write_gzip(const std::string& path, const std::vector<std::string>& parts) {
  gzFile f = gzopen(path.c_str(), "wb9");
  if (!f) throw std::runtime_error("cannot write " + path);
  for (const auto& p : parts)
    if (!p.empty() && gzwrite(f, p.data(), static_cast<unsigned>(p.size())) != static_cast<int>(p.size())) {
      gzclose(f);
      throw std::runtime_error("cannot write " + path);
    }
  if (gzclose(f) != Z_OK) throw std::runtime_error("cannot write " + path);
}

std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    out.push_back(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
  }
  return out;
}

// Sections of a dump file: input name -> its lines (header included).
std::vector<std::pair<std::string, std::vector<std::string_view>>> sections(std::string_view text) {
  std::vector<std::pair<std::string, std::vector<std::string_view>>> out;
  for (std::string_view line : lines_of(text)) {
    if (line.starts_with("== ")) {
      const auto name = line.substr(3, line.find(' ', 3) - 3);
      out.emplace_back(std::string(name), std::vector<std::string_view>{});
    }
    if (!out.empty()) out.back().second.push_back(line);
  }
  return out;
}

// Absolute stat values (stat_key_names() order) after lines[0..upto], from the "s" fields.
std::vector<std::int64_t> stats_after(const std::vector<std::string_view>& lines, std::size_t upto) {
  std::vector<std::int64_t> v;
  for (std::size_t i = 0; i <= upto && i < lines.size(); ++i) {
    const auto s = lines[i].find(" | s ");
    if (s == std::string_view::npos) continue;
    std::string_view field = lines[i].substr(s + 5);
    cachet::behaviour::decode_stats(field.substr(0, field.find(" | ")), v);
  }
  v.resize(cachet::behaviour::stat_key_names().size(), 0);
  return v;
}

// Compares one group's regenerated dump with its baseline; prints each input's first
// difference. Returns the number of inputs that differ.
int compare(const std::string& group, std::string_view old_text, std::string_view new_text, const std::string& only) {
  const auto olds = sections(old_text), news = sections(new_text);
  std::map<std::string, const std::vector<std::string_view>*> by_name;
  for (const auto& [name, lines] : news) by_name[name] = &lines;
  int differing = 0;
  std::map<std::string, bool> seen;
  for (const auto& [name, old_lines] : olds) {
    if (!only.empty() && name.find(only) == std::string::npos) continue;
    seen[name] = true;
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      std::cout << group << ": " << name << ": in the baseline, not produced now\n";
      ++differing;
      continue;
    }
    const auto& new_lines = *it->second;
    std::size_t first = std::string_view::npos, count = 0;
    for (std::size_t i = 0; i < std::max(old_lines.size(), new_lines.size()); ++i) {
      const std::string_view o = i < old_lines.size() ? old_lines[i] : "<none>";
      const std::string_view n = i < new_lines.size() ? new_lines[i] : "<none>";
      if (o == n) continue;
      if (first == std::string_view::npos) first = i;
      ++count;
    }
    if (first == std::string_view::npos) continue;
    ++differing;
    const std::string_view o = first < old_lines.size() ? old_lines[first] : "<none>";
    const std::string_view n = first < new_lines.size() ? new_lines[first] : "<none>";
    std::cout << group << ": " << name << ": first difference at dump line " << first << " (op "
              << (first >= 2 ? std::to_string(first - 2) : std::string(first == 1 ? "init" : "header")) << "), "
              << count << " of " << old_lines.size() << " lines differ\n  old: " << o << "\n  new: " << n << "\n";
    const auto so = stats_after(old_lines, first), sn = stats_after(new_lines, first);
    const auto& keys = cachet::behaviour::stat_key_names();
    int shown = 0, more = 0;
    for (std::size_t k = 0; k < keys.size(); ++k) {
      if (so[k] == sn[k]) continue;
      if (shown++ < 8) std::cout << "  stat after this line: " << keys[k] << " old " << so[k] << ", new " << sn[k] << "\n";
      else ++more;
    }
    if (more) std::cout << "  ... and " << more << " more stats differ\n";
  }
  for (const auto& [name, lines] : news)
    if (!seen.count(name) && (only.empty() || name.find(only) != std::string::npos)) {
      std::cout << group << ": " << name << ": produced now, not in the baseline\n";
      ++differing;
    }
  return differing;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--write" || a == "--check") o.mode = a, o.dir = value();
      else if (a == "--print") o.mode = a;
      else if (a == "--only") o.only = value();
      else if (a == "--group") o.group = value();
      else if (a == "--data") o.data = value();
      else if (a == "--jobs") o.jobs = static_cast<unsigned>(std::stoul(value()));
      else return usage();
    } catch (const std::exception& e) {
      std::cerr << "behaviour_dump: " << e.what() << "\n";
      return usage();
    }
  }
  if (o.mode.empty()) return usage();
  const auto start = std::chrono::steady_clock::now();
  int differing = 0;
  std::size_t inputs_total = 0, bytes_total = 0;
  try {
    for (const std::string& group : cachet::behaviour::group_names()) {
      if (!o.group.empty() && group != o.group) continue;
      std::vector<Input> inputs = cachet::behaviour::group_inputs(group, o.data);
      if (!o.only.empty())
        std::erase_if(inputs, [&](const Input& in) { return in.name.find(o.only) == std::string::npos; });
      const std::vector<std::string> dumps = run_all(inputs, o.jobs);
      inputs_total += inputs.size();
      for (const auto& d : dumps) bytes_total += d.size();
      if (o.mode == "--print") {
        for (const auto& d : dumps) std::cout << d;
      } else if (o.mode == "--write") {
        write_gzip(o.dir + "/" + group + ".txt.gz", dumps);
      } else {
        const std::string old_text = cachet::io::read_file(o.dir + "/" + group + ".txt.gz");
        std::string new_text;
        new_text.reserve(bytes_total);
        for (const auto& d : dumps) new_text += d;
        differing += compare(group, old_text, new_text, o.only);
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "behaviour_dump: " << e.what() << "\n";
    return 2;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "behaviour_dump: %zu inputs, %zu bytes of dump, %.1f s%s\n", inputs_total, bytes_total, secs,
               o.mode == "--check" ? (differing ? ", DIFFERENT from the baseline" : ", identical to the baseline") : "");
  if (o.mode == "--check" && differing) {
    std::cout << differing << " input(s) differ from the baseline in " << o.dir
              << ". If the change is intended, regenerate it: behaviour_dump --write " << o.dir
              << " (tests/data/behaviour/README.md)\n";
    return 1;
  }
  return 0;
}
