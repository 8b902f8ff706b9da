// A user of the installed cachet package: links cachet::cachet and uses its public headers and
// the C ABI on the host-simulation backend (no GPU needed).
#include <cachet/cachet.h>
#include <cachet/stats.h>
#include <cachet/types.h>

#include <cstdio>
#include <cstring>

int main() {
  cachet::DeviceStats stats;
  if (cachet::flatten(stats).size() != 122) {
    std::fprintf(stderr, "expected 122 stats keys\n");
    return 1;
  }
  cachet_allocator* a = cachet_create_host(1ull << 30, "max_split_size_mb:64");
  if (!a) {
    std::fprintf(stderr, "cachet_create_host: %s\n", cachet_last_error());
    return 1;
  }
  void* p = nullptr;
  if (cachet_allocate(a, 1000, 0, &p) != CACHET_OK || !p) {
    std::fprintf(stderr, "cachet_allocate: %s\n", cachet_last_error());
    return 1;
  }
  char* json = cachet_stats_json(a);
  // One 1000-byte request: a 512-rounded 1024-byte block in a 2 MiB small segment.
  const bool ok = json && std::strstr(json, "\"allocated_bytes.all.current\": 1024") != nullptr &&
                  std::strstr(json, "\"reserved_bytes.all.current\": 2097152") != nullptr;
  if (!ok) std::fprintf(stderr, "unexpected stats: %s\n", json ? json : cachet_last_error());
  cachet_string_free(json);
  cachet_free(a, p);
  cachet_destroy(a);
  std::printf("consumer: ok\n");
  return ok ? 0 : 1;
}
