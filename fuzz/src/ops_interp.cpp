// fuzz/src/ops_interp.cpp: bytes -> configuration + ops -> lockstep run (see ops_interp.h).
#include "ops_interp.h"

// The header comes with clang (libclang-rt-14-dev); g++ builds include it by its full path
// (CMake finds it) rather than adding clang's resource directory to the include path.
#ifdef CACHET_FDP_HEADER
#include CACHET_FDP_HEADER
#else
#include <fuzzer/FuzzedDataProvider.h>
#endif

#include <array>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "pool_ops.h"

namespace cachet::fuzz {
namespace {

using lockstep::Op;

// The oracle recordings' configurations (tests/data/oracle/results/res_*_<name>.json.gz) and a
// few more edges; byte 0 < 0xC0 picks one (byte % size).
constexpr std::array<std::string_view, 10> kPresetConfigs = {
    "",
    "expandable_segments:True",
    "garbage_collection_threshold:0.6,max_split_size_mb:64",
    "max_split_size_mb:128",
    "max_split_size_mb:256,roundup_power2_divisions:4",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "max_split_size_mb:40,max_non_split_rounding_mb:24",
    "expandable_segments:True,max_split_size_mb:64,garbage_collection_threshold:0.5",
    "large_segment_size_mb:32,roundup_power2_divisions:2",
    "expandable_segments:True,large_segment_size_mb:64",
};
constexpr std::uint8_t kStringConfig = 0xC0;

// Device capacities (byte 1 % size): small ones make out-of-memory and the garbage collector
// common; the last is the H200's total memory of the recordings.
constexpr std::array<Bytes, 6> kCapacities = {8 * GiB, 1 * GiB, 256 * MiB, 64 * MiB, 6 * GiB,
                                              150109880320ull};
constexpr std::array<double, 8> kFractions = {0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0};
constexpr StreamId kStreams = 4;    // streams 0..3
constexpr std::size_t kMaxOps = 600;  // bounds one case's time (ASan: ~1-2 ms per op)

Mix g_mix;

// Op selector byte: [0, 128) allocate (low 2 bits: stream, next 3 bits: size class);
// [128, 208) free a live handle; [208, 216) free any handle ever handed out (double free or the
// block now at that address); [216, 228) record_stream; [228, 240) complete events;
// [240, 248) empty_cache; [248, 256) set_memory_fraction.
Bytes decode_size(FuzzedDataProvider& p, unsigned size_class, Bytes capacity) {
  switch (size_class) {
    case 0: return p.ConsumeIntegralInRange<Bytes>(0, 512);
    case 1:
    case 2: return p.ConsumeIntegralInRange<Bytes>(513, 1 * MiB);
    case 3: return p.ConsumeIntegralInRange<Bytes>(1 * MiB + 1, 10 * MiB);
    case 4: return p.ConsumeIntegralInRange<Bytes>(10 * MiB + 1, 64 * MiB);
    case 5: return p.ConsumeIntegralInRange<Bytes>(64 * MiB + 1, 1 * GiB);
    case 6: return p.ConsumeIntegralInRange<Bytes>(0, 2 * capacity);  // exact (seeds use it)
    default: return p.ConsumeIntegralInRange<Bytes>(1, 512) * 2 * MiB;  // 2 MiB multiples
  }
}

// Capacity byte bit 7: pool mode (kPoolMode): selectors [96, 128) are pool and capture ops
// instead of allocations (decode_pool_op, src/pool_ops.h). Byte values below 0x80 decode as before.
constexpr std::uint8_t kPoolMode = 0x80;
constexpr std::uint8_t kPoolSelectors = 96;

// The tags sleep mode draws from, and a tag list from a byte's low bits (bit i: kFuzzTags[i]);
// no bit: the empty list (every tag for sleep and wake, no backup).
constexpr std::array<std::string_view, 3> kFuzzTags = {"default", "weights", "kv_cache"};

TagList decode_tags(std::uint8_t bits) {
  TagList r;
  for (std::size_t i = 0; i < kFuzzTags.size(); ++i)
    if ((bits >> i) & 1u) r.emplace_back(kFuzzTags[i]);
  return r;
}

// Selectors [242,244) tag (byte: kFuzzTags[b % 3]), [244,246) sleep (tags byte, backup byte),
// [246,248) wake (tags byte).
Op decode_sleep_op(FuzzedDataProvider& p, std::uint8_t sel) {
  if (sel < 244) return ops::SetTag{Tag(kFuzzTags[p.ConsumeIntegral<std::uint8_t>() % kFuzzTags.size()])};
  if (sel < 246) {
    TagList tags = decode_tags(p.ConsumeIntegral<std::uint8_t>());
    return ops::Sleep{std::move(tags), decode_tags(p.ConsumeIntegral<std::uint8_t>())};
  }
  return ops::Wake{decode_tags(p.ConsumeIntegral<std::uint8_t>())};
}

template <class LS>
std::optional<Op> decode_op(FuzzedDataProvider& p, const LS& ls, Bytes capacity, bool pool_mode) {
  const auto sel = p.ConsumeIntegral<std::uint8_t>();
  // A pair without private pools (policy:cachet before its pools) decodes them as allocations.
  if (LS::kPools && pool_mode && sel >= kPoolSelectors && sel < 128)
    return decode_pool_op(p, ls.pools(), sel - kPoolSelectors);
  if (sel < 128) {
    const StreamId stream = sel & 3u;
    // With pools, selectors 64..95 allocate on thread 1 (the thread filter, docs/pytorch-allocator.md §14.10.2).
    const ThreadIndex thread = pool_mode && (sel >> 5) == 2 ? 1 : 0;
    return lockstep::Allocate{decode_size(p, (sel >> 2) & 7u, capacity), stream, {}, thread};
  }
  if (sel < 216) {
    const auto k = p.ConsumeIntegral<std::uint16_t>();
    if (sel < 208) {
      const auto live = ls.live_handles();
      if (live.empty()) return std::nullopt;
      return lockstep::Free{live[k % live.size()]};
    }
    if (ls.handle_count() == 0) return std::nullopt;
    return lockstep::Free{k % ls.handle_count()};
  }
  if (sel < 228) {
    const auto k = p.ConsumeIntegral<std::uint16_t>();
    const StreamId stream = p.ConsumeIntegralInRange<StreamId>(0, kStreams - 1);
    const auto live = ls.live_handles();
    if (live.empty()) return std::nullopt;
    return lockstep::RecordStream{live[k % live.size()], stream};
  }
  if (sel < 240) return lockstep::CompleteEvents{p.ConsumeIntegralInRange<StreamId>(0, kStreams - 1)};
  // Sleep mode (the pair runs tag, sleep and wake: cachet_sleep:True, docs/sleep-wake.md section 8):
  // [242,248) are those ops instead of empty_cache.
  if (sel >= 242 && sel < 248 && ls.runs_sleep_ops()) return decode_sleep_op(p, sel);
  // Pool mode where the pair runs wait_stream and kernel (policy:pytorch on the host backend,
  // docs/pytorch-allocator.md §14.10.1): 240 is wait_stream (waiter, waited), 241 a kernel,
  // instead of empty_cache.
  if (pool_mode && (sel == 240 || sel == 241) && ls.runs_stream_ops()) {
    const StreamId a = p.ConsumeIntegralInRange<StreamId>(0, kStreams - 1);
    if (sel == 241) return ops::Kernel{a};
    return ops::WaitStream{a, p.ConsumeIntegralInRange<StreamId>(0, kStreams - 1)};
  }
  if (sel < 248) return lockstep::EmptyCache{};
  return lockstep::SetMemoryFraction{kFractions[p.ConsumeIntegral<std::uint8_t>() % kFractions.size()]};
}

// The configuration of a case, or nullopt when it cannot run here (cudaMallocAsync).
std::optional<Config> runnable_config(const std::string& text) {
  Config c = parse_config(text, ConfigSource::Cachet).config;
  if (c.backend != Backend::Native) return std::nullopt;
  return c;
}

void count(const Op& op, const lockstep::Outcome& o) {
  using K = lockstep::Outcome::Kind;
  ++g_mix.ops;
  if (ops::is_pool_op(op)) {
    ++(o.kind == K::Ok ? g_mix.pool_ops : g_mix.pool_refused);
    return;
  }
  if (ops::is_stream_op(op)) {
    ++(o.kind != K::Ok ? g_mix.stream_refused : std::holds_alternative<ops::WaitStream>(op) ? g_mix.waits : g_mix.kernels);
    return;
  }
  if (ops::is_sleep_op(op)) {
    if (o.kind != K::Ok) ++g_mix.sleep_refused;
    else if (std::holds_alternative<ops::SetTag>(op)) ++g_mix.tags;
    else if (std::holds_alternative<ops::Sleep>(op)) ++g_mix.sleeps;
    else ++g_mix.wakes;
    return;
  }
  if (o.kind == K::Skipped) {
    ++g_mix.noops;
    return;
  }
  if (o.kind == K::UsageError) {
    ++g_mix.usage_errors;
    return;
  }
  if (std::holds_alternative<lockstep::Allocate>(op)) {
    if (o.kind == K::OutOfMemory) ++g_mix.alloc_oom;
    else if (o.ptr == 0) ++g_mix.alloc_zero;
    else ++g_mix.alloc_ptr;
  } else if (std::holds_alternative<lockstep::Free>(op)) {
    ++g_mix.frees;
  } else if (std::holds_alternative<lockstep::RecordStream>(op)) {
    ++g_mix.records;
  } else if (std::holds_alternative<lockstep::CompleteEvents>(op)) {
    ++g_mix.completes;
  } else if (std::holds_alternative<lockstep::EmptyCache>(op)) {
    ++g_mix.empty_caches;
  } else if (std::holds_alternative<lockstep::SetMemoryFraction>(op)) {
    ++g_mix.fractions;
  }
}

std::string report(const std::string& what, const Case& c) {
  return "fuzz_ops: " + what + "\n--- the case (replay: tests/fuzz_regressions/<name>.ops) ---\n" +
         to_ops_file(c) + "--- end of case ---\n";
}

lockstep::Options options_for(const Config& config, Bytes capacity) {
  lockstep::Options o;
  o.config = config;
  o.capacity = capacity;
  o.check_invariants = true;
  return o;
}

}  // namespace

std::string run_bytes(const std::uint8_t* data, std::size_t size, Case* out) {
  FuzzedDataProvider p(data, size);
  Case c;
  const char* fixed = std::getenv("CACHET_FUZZ_CONFIG");
  const auto b = p.ConsumeIntegral<std::uint8_t>();  // consumed either way: seeds stay aligned
  if (fixed != nullptr) {
    c.config = fixed;
  } else {
    if (b < kStringConfig) {
      c.config = std::string(kPresetConfigs[b % kPresetConfigs.size()]);
    } else {
      c.config = p.ConsumeRandomLengthString(256);
      try {
        (void)parse_config(c.config, ConfigSource::Cachet);
      } catch (const ConfigError&) {
        c.config.clear();  // not a configuration: the defaults
      }
    }
  }
  const auto cap_byte = p.ConsumeIntegral<std::uint8_t>();
  const bool pool_mode = (cap_byte & kPoolMode) != 0;
  c.capacity = kCapacities[(cap_byte & ~kPoolMode) % kCapacities.size()];
  std::optional<Config> config;
  try {
    config = runnable_config(c.config);
  } catch (const ConfigError& e) {
    if (out) *out = c;
    return report(std::string("the configuration does not parse: ") + e.what(), c);
  }
  ++g_mix.cases;
  if (!config) {
    ++g_mix.skipped_cases;
    if (out) *out = c;
    return "";
  }
  std::string result;
  // The configuration's policy picks the pair (policy:cachet: model::CachetPolicy).
  lockstep::visit_policy(config->policy, [&]<class LS>(std::type_identity<LS>) {
    LS ls(options_for(*config, c.capacity));
    while (p.remaining_bytes() > 0 && c.ops.size() < kMaxOps) {
      const std::optional<Op> op = decode_op(p, ls, c.capacity, pool_mode);
      if (!op) {
        ++g_mix.ops;
        ++g_mix.noops;
        continue;
      }
      c.ops.push_back(*op);
      std::optional<std::string> diff;
      try {
        diff = ls.apply(*op);
      } catch (const std::exception& e) {
        diff = std::string("the harness threw: ") + e.what();
      }
      if (diff) {
        result = report("divergence at op #" + std::to_string(c.ops.size() - 1) + " (" +
                            lockstep::show(*op) + ")\n" + *diff,
                        c);
        break;
      }
      count(*op, ls.last_sut());
      if (ls.ended()) {  // PyTorch 2.11 fails here (docs/pytorch-allocator.md §14.8); both sides said so: the case ends
        ++g_mix.ended_cases;
        break;
      }
    }
  });
  if (out) *out = std::move(c);
  return result;
}

std::string run_case(const Case& c) {
  std::optional<Config> config;
  try {
    config = runnable_config(c.config);
  } catch (const ConfigError& e) {
    return std::string("configuration does not parse: ") + e.what();
  }
  if (!config) return "";
  return lockstep::visit_policy(config->policy, [&]<class LS>(std::type_identity<LS>) -> std::string {
    LS ls(options_for(*config, c.capacity));
    for (std::size_t i = 0; i < c.ops.size(); ++i) {
      if (auto diff = ls.apply(c.ops[i]))
        return "op #" + std::to_string(i) + " (" + lockstep::show(c.ops[i]) + "): " + *diff;
    }
    return "";
  });
}

// The case-file form is the lockstep harness's (cachet/lockstep.h show_case / parse_case).
std::string to_ops_file(const Case& c) { return lockstep::show_case({c.config, c.capacity, c.ops, false}); }

Case parse_ops_file(const std::string& text) {
  lockstep::Case l = lockstep::parse_case(text);
  return Case{std::move(l.config), l.capacity, std::move(l.ops)};
}

const Mix& mix() { return g_mix; }

std::string show_mix() {
  const Mix& m = g_mix;
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "fuzz_ops mix: %llu cases (%llu skipped), %llu ops: %llu allocs returned memory, "
                "%llu size-0 allocs, %llu OOMs, %llu frees, %llu usage errors, %llu record_stream, "
                "%llu complete, %llu empty_cache, %llu fraction, %llu no-ops, %llu pool ops "
                "(%llu refused or failed), %llu cases ended at a PyTorch failure (§14.8), %llu tag, "
                "%llu sleep, %llu wake (%llu refused or out of memory), %llu wait_stream, %llu kernel "
                "(%llu refused)",
                static_cast<unsigned long long>(m.cases), static_cast<unsigned long long>(m.skipped_cases),
                static_cast<unsigned long long>(m.ops), static_cast<unsigned long long>(m.alloc_ptr),
                static_cast<unsigned long long>(m.alloc_zero), static_cast<unsigned long long>(m.alloc_oom),
                static_cast<unsigned long long>(m.frees), static_cast<unsigned long long>(m.usage_errors),
                static_cast<unsigned long long>(m.records), static_cast<unsigned long long>(m.completes),
                static_cast<unsigned long long>(m.empty_caches), static_cast<unsigned long long>(m.fractions),
                static_cast<unsigned long long>(m.noops), static_cast<unsigned long long>(m.pool_ops),
                static_cast<unsigned long long>(m.pool_refused), static_cast<unsigned long long>(m.ended_cases),
                static_cast<unsigned long long>(m.tags), static_cast<unsigned long long>(m.sleeps),
                static_cast<unsigned long long>(m.wakes), static_cast<unsigned long long>(m.sleep_refused),
                static_cast<unsigned long long>(m.waits), static_cast<unsigned long long>(m.kernels),
                static_cast<unsigned long long>(m.stream_refused));
  return buf;
}

void run_or_abort(const std::uint8_t* data, std::size_t size) {
  Case c;
  const std::string r = run_bytes(data, size, &c);
  if (const char* path = std::getenv("CACHET_FUZZ_OPS_OUT")) {
    std::ofstream(path) << to_ops_file(c);
  }
  if (!r.empty()) {
    std::fputs(r.c_str(), stderr);
    std::fputs("\n", stderr);
    std::abort();
  }
}

void print_mix_at_exit() {
  static bool registered = false;
  if (registered) return;
  registered = true;
  std::atexit([] { std::fprintf(stderr, "%s\n", show_mix().c_str()); });
}

}  // namespace cachet::fuzz
