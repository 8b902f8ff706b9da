// `cachet explain TRACE [--cap BYTES] [--device-memory BYTES] [--json]`: why the recorded run ran
// out of memory (its first out-of-memory; with none, peak reserved): the request and its stack,
// reserved/allocated/requested, reserved - allocated taken apart by PyTorch's rules of which
// free block may serve a request, the allocation sites holding the most, and the smallest change
// of configuration that avoids it, found by replay (tools/replay/src/explain*.cpp).
#if __has_include("cachet/replay/explain.h")
#include <cstdio>
#include <memory>
#include <string>

#include "cachet/replay/explain.h"
#include "command.h"
#include "explain_input.h"

namespace cachet::cli {
namespace {

struct Args {
  std::string path;
  std::string cap;
  std::string fraction;  // --fraction F: the cap is F x the device memory
  std::string device_memory;
  std::optional<std::string> conf;  // --conf: start from it in place of the recorded configuration
  unsigned threads = 2;
  std::size_t top = 8;
  bool json = false;
};

int run_explain(const Args& a) {
  using namespace cachet::replay;
  std::string cap_text = a.cap;  // --cap, or --fraction's cap in bytes
  if (!fraction_to_cap("explain", a.path, a.fraction, a.device_memory, cap_text)) return kExitBadInput;
  auto in = load_explain_input("explain", a.path, cap_text, a.device_memory, a.threads, a.conf);
  if (!in) return kExitBadInput;
  ExplainOptions eo;
  eo.threads = a.threads;
  eo.top_sites = a.top;
  eo.cap_text = cap_text;
  const Explanation e = explain(in->loaded, in->options, in->frames, eo);
  const std::string out = a.json ? explain_json(e) : explain_text(e);
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

Runner setup(CLI::App& sub) {
  auto a = std::make_shared<Args>();
  sub.add_option("TRACE", a->path, "PyTorch memory snapshot (pickle or JSON) or an oracle recording")->required();
  sub.add_option("--cap", a->cap,
                 "the memory cap the run had (set_per_process_memory_fraction x total memory; K/M/G/T ok)");
  sub.add_option("--fraction", a->fraction, kFractionHelp);
  sub.add_option("--conf", a->conf, kStartConfHelp);
  sub.add_option("--device-memory", a->device_memory, kDeviceMemoryHelp);
  sub.add_option("--threads", a->threads, "worker threads for the search of a fix (default 2)");
  sub.add_option("--top", a->top, "allocation sites to list (default 8)");
  sub.add_flag("--json", a->json, "print JSON");
  return [a] { return run_explain(*a); };
}

[[maybe_unused]] const bool registered = register_command(
    {"explain", "Explain a trace's first out-of-memory (or its peak) and find the smallest fix", setup});

}  // namespace
}  // namespace cachet::cli
#endif
