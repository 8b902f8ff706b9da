// The two segment sources: synthetic (deterministic addresses, a capacity) and recorded.
#include "cachet/model/segment_source.h"

#include <cstdio>
#include <string>

namespace cachet::model {

namespace {
std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}
std::string row(std::uint64_t addr, Bytes size) {
  return "address " + std::to_string(addr) + " (" + hex(addr) + ") size " + std::to_string(size);
}
}  // namespace

SyntheticSegmentSource::SyntheticSegmentSource(Bytes capacity, Bytes total)
    : capacity_(capacity), total_(total == 0 ? capacity : total) {}

std::optional<std::uint64_t> SyntheticSegmentSource::allocate(Bytes size) {
  if (size > capacity_ - in_use_) return std::nullopt;
  in_use_ += size;
  const std::uint64_t addr = next_segment_;
  next_segment_ += (size + kSmallBuffer - 1) / kSmallBuffer * kSmallBuffer;
  return addr;
}

void SyntheticSegmentSource::free(std::uint64_t, Bytes size) { in_use_ -= size; }

std::uint64_t SyntheticSegmentSource::reserve(Bytes size) {
  const std::uint64_t addr = next_reservation_;
  next_reservation_ += (size + kSmallBuffer - 1) / kSmallBuffer * kSmallBuffer;
  return addr;
}

void SyntheticSegmentSource::release_reservation(std::uint64_t, Bytes) {}

bool SyntheticSegmentSource::map(std::uint64_t, Bytes size) {
  if (size > capacity_ - in_use_) return false;
  in_use_ += size;
  return true;
}

void SyntheticSegmentSource::unmap(std::uint64_t, Bytes size) { in_use_ -= size; }

RecordedSegmentSource::RecordedSegmentSource(const std::vector<TraceEvent>& events,
                                             Bytes total_memory)
    : total_(total_memory) {
  for (const TraceEvent& e : events) {
    switch (e.action) {
      case TraceAction::SegmentAlloc: allocs_.push_back({e.addr, e.size}); break;
      case TraceAction::SegmentFree: frees_.push_back({e.addr, e.size}); break;
      case TraceAction::SegmentMap: maps_.push_back({e.addr, e.size}); break;
      case TraceAction::SegmentUnmap: unmaps_.push_back({e.addr, e.size}); break;
      default: break;
    }
  }
}

const RecordedSegmentSource::Row& RecordedSegmentSource::take(std::vector<Row>& rows,
                                                              std::size_t& cursor,
                                                              const char* what) {
  if (cursor >= rows.size())
    throw Divergence(std::string(what) + " #" + std::to_string(cursor + 1),
                     "no more " + std::string(what) + " rows (the recording has " +
                         std::to_string(rows.size()) + ")",
                     "another one");
  return rows[cursor++];
}

std::optional<std::uint64_t> RecordedSegmentSource::allocate(Bytes size) {
  const std::size_t index = alloc_i_;
  const Row& r = take(allocs_, alloc_i_, "segment_alloc");
  if (r.size != size)
    throw Divergence("segment_alloc #" + std::to_string(index + 1), "size " + std::to_string(r.size),
                     "size " + std::to_string(size));
  in_use_ += size;
  return r.addr;
}

void RecordedSegmentSource::free(std::uint64_t addr, Bytes size) {
  const std::size_t index = free_i_;
  const Row& r = take(frees_, free_i_, "segment_free");
  if (r.addr != addr || r.size != size)
    throw Divergence("segment_free #" + std::to_string(index + 1), row(r.addr, r.size),
                     row(addr, size));
  in_use_ -= size;
}

std::uint64_t RecordedSegmentSource::reserve(Bytes) {
  if (map_i_ >= maps_.size())
    throw Divergence("expandable segment reservation", "no more segment_map rows",
                     "a new reservation");
  return maps_[map_i_].addr;
}

bool RecordedSegmentSource::map(std::uint64_t addr, Bytes size) {
  const std::size_t index = map_i_;
  const Row& r = take(maps_, map_i_, "segment_map");
  if (r.addr != addr || r.size != size)
    throw Divergence("segment_map #" + std::to_string(index + 1), row(r.addr, r.size),
                     row(addr, size));
  in_use_ += size;
  return true;
}

void RecordedSegmentSource::unmap(std::uint64_t addr, Bytes size) {
  const std::size_t index = unmap_i_;
  const Row& r = take(unmaps_, unmap_i_, "segment_unmap");
  if (r.addr != addr || r.size != size)
    throw Divergence("segment_unmap #" + std::to_string(index + 1), row(r.addr, r.size),
                     row(addr, size));
  in_use_ -= size;
}

}  // namespace cachet::model
