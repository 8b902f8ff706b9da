// fuzz_trace: any bytes are given to the trace and snapshot readers (cachet/io/trace_reader.h):
// PyTorch pickle and JSON snapshots and oracle recordings, gzip or not (detected by content).
// Reading never crashes and never throws anything but io::ReadError, whose message is not
// empty and starts with the name given. A file that parses also survives event_count() and
// device() lookups. The stats sidecar reader gets the same bytes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "cachet/io/file.h"
#include "cachet/io/trace_reader.h"

namespace {

constexpr std::string_view kName = "fuzz-input";

[[noreturn]] void fail(const char* entry, const std::string& what) {
  std::fprintf(stderr, "fuzz_trace: %s: %s\n", entry, what.c_str());
  std::abort();
}

template <class F>
void expect_read_error_only(const char* entry, F&& f) {
  try {
    f();
  } catch (const cachet::io::ReadError& e) {
    const std::string_view msg = e.what();
    if (msg.empty()) fail(entry, "ReadError with an empty message");
    if (msg.substr(0, kName.size()) != kName)
      fail(entry, "ReadError message does not start with the source name: " + std::string(msg));
  } catch (const std::exception& e) {
    fail(entry, std::string("threw a non-ReadError exception: ") + e.what());
  } catch (...) {
    fail(entry, "threw a non-std exception");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  expect_read_error_only("parse_trace", [&] {
    const cachet::io::TraceFile t = cachet::io::parse_trace(bytes, kName);
    std::size_t n = 0;
    for (const auto& d : t.devices) {
      if (t.device(d.device) != &d) fail("parse_trace", "device() does not find a listed device");
      n += d.events.size();
    }
    if (n != t.event_count()) fail("parse_trace", "event_count() differs from the events held");
  });
  expect_read_error_only("apply_stats_sidecar", [&] {
    cachet::io::TraceFile t;
    cachet::io::apply_stats_sidecar(t, bytes, kName);
  });
  return 0;
}
