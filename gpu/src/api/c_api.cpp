// The C ABI (cachet/cachet.h): exceptions become statuses and cachet_last_error().
#include "cachet/cachet.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/host_backend.h"

struct cachet_allocator {
  std::unique_ptr<cachet::CachingAllocator> impl;
};

namespace {

thread_local std::string g_last_error;

cachet_status fail(cachet_status s, const char* what) {
  g_last_error = what;
  return s;
}

template <class F>
cachet_status guarded(F&& f) {
  try {
    f();
    g_last_error.clear();
    return CACHET_OK;
  } catch (const cachet::OutOfMemory& e) {
    return fail(CACHET_ERR_OUT_OF_MEMORY, e.what());
  } catch (const cachet::UsageError& e) {
    return fail(CACHET_ERR_USAGE, e.what());
  } catch (const cachet::ConfigError& e) {
    return fail(CACHET_ERR_CONFIG, e.what());
  } catch (const cachet::DeviceError& e) {
    return fail(CACHET_ERR_DEVICE, e.what());
  } catch (const std::exception& e) {
    return fail(CACHET_ERR_INTERNAL, e.what());
  } catch (...) {
    return fail(CACHET_ERR_INTERNAL, "unknown error");
  }
}

cachet::Config parse(const char* config) {
  if (config == nullptr || *config == '\0') return {};
  if (std::strcmp(config, "env") == 0) return cachet::CachingAllocator::config_from_environment();
  return cachet::parse_config(config, cachet::ConfigSource::Cachet).config;
}

char* dup(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  out += '"';
}

// {"key": value, ...} of flatten()'s pairs.
std::string flat_json(const std::vector<std::pair<std::string, std::int64_t>>& kv) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : kv) {
    if (!first) out += ", ";
    first = false;
    append_json_string(out, k);
    out += ": " + std::to_string(v);
  }
  return out + "}";
}

std::string stats_json(const cachet::DeviceStats& s) { return flat_json(cachet::flatten(s)); }
std::string sleep_stats_json(const cachet::SleepStats& s) { return flat_json(cachet::flatten(s)); }

cachet::TagList tag_list(const char* const* tags, std::size_t n) {
  cachet::TagList out;
  for (std::size_t i = 0; i < n; ++i) {
    if (tags == nullptr || tags[i] == nullptr)
      throw cachet::UsageError("cachet: a null tag in a tag list of " + std::to_string(n) + "; pass n strings");
    out.emplace_back(tags[i]);
  }
  return out;
}

std::string snapshot_json(const cachet::Snapshot& snap, int device) {
  std::string out = "[";
  for (std::size_t i = 0; i < snap.size(); ++i) {
    const auto& seg = snap[i];
    if (i) out += ", ";
    out += "{\"device\": " + std::to_string(device) + ", \"address\": " + std::to_string(seg.address) +
           ", \"total_size\": " + std::to_string(seg.total_size) +
           ", \"allocated_size\": " + std::to_string(seg.allocated_size()) +
           ", \"active_size\": " + std::to_string(seg.active_size()) +
           ", \"requested_size\": " + std::to_string(seg.requested_size()) +
           ", \"stream\": " + std::to_string(seg.stream) + ", \"segment_type\": \"" +
           (seg.is_large ? "large" : "small") + "\", \"is_expandable\": " + (seg.is_expandable ? "true" : "false") +
           (seg.is_sleeping ? ", \"is_sleeping\": true, \"backup_size\": " + std::to_string(seg.backup_size) : "") +
           ", \"blocks\": [";
    for (std::size_t b = 0; b < seg.blocks.size(); ++b) {
      const auto& bl = seg.blocks[b];
      if (b) out += ", ";
      out += "{\"address\": " + std::to_string(bl.address) + ", \"size\": " + std::to_string(bl.size) +
             ", \"requested_size\": " + std::to_string(bl.requested_size) + ", \"state\": ";
      append_json_string(out, cachet::to_string(bl.state));
      out += "}";
    }
    out += "]}";
  }
  return out + "]";
}

template <class F>
char* guarded_string(cachet_allocator* a, F&& f) {
  std::string s;
  if (a == nullptr) {
    fail(CACHET_ERR_USAGE, "cachet: null allocator handle; create one with cachet_create");
    return nullptr;
  }
  if (guarded([&] { s = f(); }) != CACHET_OK) return nullptr;
  char* p = dup(s);
  if (!p) fail(CACHET_ERR_INTERNAL, "cachet: out of host memory for the result string");
  return p;
}

#define CACHET_REQUIRE_HANDLE(a) \
  if ((a) == nullptr) return fail(CACHET_ERR_USAGE, "cachet: null allocator handle; create one with cachet_create")

}  // namespace

extern "C" {

cachet_allocator* cachet_create(int device, const char* config) {
  cachet_allocator* out = nullptr;
  guarded([&] {
    auto impl = cachet::CachingAllocator::for_cuda_device(device, parse(config));
    out = new cachet_allocator{std::move(impl)};
  });
  return out;
}

cachet_allocator* cachet_create_host(uint64_t capacity, const char* config) {
  cachet_allocator* out = nullptr;
  guarded([&] {
    cachet::gpu::HostOptions o;
    o.capacity = capacity;
    auto impl = std::make_unique<cachet::CachingAllocator>(cachet::gpu::make_host_memory(o), parse(config));
    out = new cachet_allocator{std::move(impl)};
  });
  return out;
}

void cachet_destroy(cachet_allocator* a) { delete a; }

cachet_status cachet_allocate(cachet_allocator* a, size_t size, uint64_t stream, void** out) {
  CACHET_REQUIRE_HANDLE(a);
  if (out == nullptr) return fail(CACHET_ERR_USAGE, "cachet_allocate: `out` is NULL; pass where to store the pointer");
  *out = nullptr;
  return guarded([&] { *out = a->impl->allocate(size, stream); });
}

cachet_status cachet_free(cachet_allocator* a, void* ptr) {
  CACHET_REQUIRE_HANDLE(a);
  return guarded([&] { a->impl->free(ptr); });
}

cachet_status cachet_record_stream(cachet_allocator* a, void* ptr, uint64_t stream) {
  CACHET_REQUIRE_HANDLE(a);
  return guarded([&] { a->impl->record_stream(ptr, stream); });
}

cachet_status cachet_empty_cache(cachet_allocator* a) {
  CACHET_REQUIRE_HANDLE(a);
  return guarded([&] { a->impl->empty_cache(); });
}

cachet_status cachet_set_memory_fraction(cachet_allocator* a, double fraction) {
  CACHET_REQUIRE_HANDLE(a);
  return guarded([&] { a->impl->set_memory_fraction(fraction); });
}

cachet_status cachet_set_tag(const char* tag) {
  if (tag == nullptr) return fail(CACHET_ERR_USAGE, "cachet_set_tag: a null tag; pass a tag such as \"default\"");
  return guarded([&] { cachet::set_current_tag(tag); });
}

cachet_status cachet_sleep(cachet_allocator* a, const char* const* tags, size_t n_tags, const char* const* backup_tags,
                           size_t n_backup_tags, uint64_t* bytes_out) {
  CACHET_REQUIRE_HANDLE(a);
  return guarded([&] {
    const cachet::Bytes given = a->impl->sleep(tag_list(tags, n_tags), tag_list(backup_tags, n_backup_tags));
    if (bytes_out != nullptr) *bytes_out = given;
  });
}

cachet_status cachet_wake(cachet_allocator* a, const char* const* tags, size_t n_tags) {
  CACHET_REQUIRE_HANDLE(a);
  return guarded([&] { a->impl->wake(tag_list(tags, n_tags)); });
}

char* cachet_sleeping_json(cachet_allocator* a) {
  return guarded_string(a, [&] {
    std::string out = "[";
    for (const auto& t : a->impl->sleeping()) {
      if (out.size() > 1) out += ", ";
      append_json_string(out, t);
    }
    return out + "]";
  });
}

char* cachet_sleep_stats_json(cachet_allocator* a) {
  return guarded_string(a, [&] { return sleep_stats_json(a->impl->sleep_stats()); });
}

cachet_status cachet_release_backup_buffers(cachet_allocator* a, uint64_t* bytes_out) {
  CACHET_REQUIRE_HANDLE(a);
  return guarded([&] {
    const cachet::Bytes given = a->impl->release_backup_buffers();
    if (bytes_out != nullptr) *bytes_out = given;
  });
}

char* cachet_stats_json(cachet_allocator* a) {
  return guarded_string(a, [&] { return stats_json(a->impl->stats()); });
}

char* cachet_snapshot_json(cachet_allocator* a) {
  return guarded_string(a, [&] { return snapshot_json(a->impl->snapshot(), a->impl->device()); });
}

char* cachet_summary(cachet_allocator* a) {
  return guarded_string(a, [&] { return a->impl->summary(); });
}

void cachet_string_free(char* s) { std::free(s); }

const char* cachet_last_error(void) { return g_last_error.c_str(); }

}  // extern "C"
