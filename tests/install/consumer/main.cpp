// A user of the installed cachet package: links cachet::cachet and uses its public headers.
#include <cachet/stats.h>
#include <cachet/types.h>

#include <cstdio>

#if __has_include(<cachet/cachet.h>)
#include <cachet/cachet.h>
#define CACHET_CONSUMER_HAS_GPU 1
#endif

int main() {
  cachet::DeviceStats stats;
  stats.allocated_bytes[0].increase(512);
  auto flat = cachet::flatten(stats);
  if (flat.size() != 122) {
    std::fprintf(stderr, "expected 122 stats keys, got %zu\n", flat.size());
    return 1;
  }
  std::printf("consumer: %zu stat keys, kSmallBuffer=%llu\n", flat.size(),
              static_cast<unsigned long long>(cachet::kSmallBuffer));
  return 0;
}
