// The host simulation backend (see cachet/gpu/host_backend.h).
#include "cachet/gpu/host_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "messages.h"

namespace cachet::gpu {

using detail::hex;

namespace {
constexpr Bytes kSyntheticAlign = 2 * MiB;
Bytes align_up(Bytes n, Bytes a) { return (n + a - 1) / a * a; }
}  // namespace

HostSim::HostSim(HostOptions opts)
    : opts_(std::move(opts)), bump_(opts_.first_address), low_(opts_.first_address + (Bytes{1} << 42)), va_bump_(opts_.first_address + (Bytes{1} << 44)) {
  if (!opts_.total_memory) opts_.total_memory = opts_.capacity;
}

void HostSim::complete_events(StreamId stream) {
  std::lock_guard lock(mu_);
  for (auto& [h, e] : events_)
    if (e.recorded && e.stream == stream) e.complete = true;
}

void HostSim::complete_all_events() {
  std::lock_guard lock(mu_);
  for (auto& [h, e] : events_)
    if (e.recorded) e.complete = true;
}

void HostSim::set_stream_device(StreamId stream, DeviceIndex device) {
  std::lock_guard lock(mu_);
  stream_device_[stream] = device;
}

Bytes HostSim::used() const {
  std::lock_guard lock(mu_);
  return used_;
}

std::size_t HostSim::live_events() const {
  std::lock_guard lock(mu_);
  return events_.size();
}

std::size_t HostSim::recorded_left() const {
  std::lock_guard lock(mu_);
  return opts_.recorded ? opts_.recorded->size() - recorded_pos_ : 0;
}

Result<DevicePtr> HostSim::next_recorded(const char* what, bool take) {
  const auto& list = *opts_.recorded;
  if (recorded_pos_ >= list.size())
    return {Status::error(std::string("host backend (recorded addresses): ") + what +
                          " needs address #" + std::to_string(recorded_pos_ + 1) + " but the recording has only " +
                          std::to_string(list.size()) + "; the replay made more device calls than PyTorch did"),
            0};
  DevicePtr p = list[recorded_pos_];
  if (take) ++recorded_pos_;
  return {Status::ok(), p};
}

Result<DevicePtr> HostSim::malloc(Bytes n) {
  std::lock_guard lock(mu_);
  if (n == 0) return {Status::error("host backend: malloc of 0 bytes"), 0};
  if (used_ + n > opts_.capacity) return {Status::oom(), 0};
  DevicePtr p;
  if (opts_.recorded) {
    auto r = next_recorded("malloc", true);
    if (!r.is_ok()) return r;
    p = r.value;
    // A replay that diverged from the recording (another size, another order) would get an
    // address inside a live segment: refuse it, as the real driver never would.
    auto next = segments_.lower_bound(p);
    const bool overlaps = (next != segments_.end() && next->first < p + n) ||
                          (next != segments_.begin() && std::prev(next)->first + std::prev(next)->second > p);
    if (overlaps)
      return {Status::error("host backend (recorded addresses): malloc of " + std::to_string(n) + " bytes at " +
                            hex(p) + " (address #" + std::to_string(recorded_pos_) +
                            ") overlaps a live segment; the replay made other device calls than PyTorch did"),
              0};
  } else if (opts_.driver_like_addresses) {
    const Bytes span = align_up(n, kSyntheticAlign);
    if (auto it = freed_.lower_bound({span, 0}); it != freed_.end() && it->first == span) {
      p = it->second;
      freed_.erase(it);
    } else {
      low_ -= span;
      p = low_;
    }
  } else {
    p = bump_;
    bump_ = align_up(bump_ + n, kSyntheticAlign);
  }
  used_ += n;
  segments_[p] = n;
  return {Status::ok(), p};
}

Status HostSim::free(DevicePtr p) {
  std::lock_guard lock(mu_);
  auto it = segments_.find(p);
  if (it == segments_.end()) return Status::error("host backend: free of " + hex(p) + ", which malloc did not return");
  used_ -= it->second;
  if (opts_.driver_like_addresses && !opts_.recorded) freed_.insert({align_up(it->second, kSyntheticAlign), p});
  forget_contents_locked(p, it->second);
  segments_.erase(it);
  return Status::ok();
}

Result<MemInfo> HostSim::mem_get_info() {
  std::lock_guard lock(mu_);
  return {Status::ok(), MemInfo{opts_.capacity - used_, *opts_.total_memory, used_}};
}

bool HostSim::stream_valid(StreamId s) {
  std::lock_guard lock(mu_);
  auto it = stream_device_.find(s);
  return it == stream_device_.end() || it->second == opts_.device;
}

Result<EventHandle> HostSim::event_create() {
  std::lock_guard lock(mu_);
  EventHandle h = next_event_++;
  events_[h] = Event{};
  return {Status::ok(), h};
}

Status HostSim::event_record(EventHandle e, StreamId s) {
  std::lock_guard lock(mu_);
  auto it = events_.find(e);
  if (it == events_.end()) return Status::error("host backend: record of unknown event " + std::to_string(e));
  it->second = Event{s, true, opts_.events_complete_when_recorded};
  return Status::ok();
}

Result<bool> HostSim::event_query(EventHandle e) {
  std::lock_guard lock(mu_);
  auto it = events_.find(e);
  if (it == events_.end()) return {Status::error("host backend: query of unknown event " + std::to_string(e)), false};
  return {Status::ok(), it->second.complete || !it->second.recorded};
}

Status HostSim::event_synchronize(EventHandle e) {
  std::lock_guard lock(mu_);
  auto it = events_.find(e);
  if (it == events_.end()) return Status::error("host backend: synchronize of unknown event " + std::to_string(e));
  it->second.complete = true;
  return Status::ok();
}

void HostSim::event_destroy(EventHandle e) {
  std::lock_guard lock(mu_);
  events_.erase(e);
}

Result<DevicePtr> HostSim::reserve(Bytes n) {
  std::lock_guard lock(mu_);
  DevicePtr p;
  if (opts_.recorded) {
    auto r = next_recorded("reserve", false);
    if (!r.is_ok()) return r;
    p = r.value;
  } else {
    p = va_bump_;
    va_bump_ = align_up(va_bump_ + n, kSyntheticAlign) + kSyntheticAlign;  // a guard gap
  }
  reservations_[p] = n;
  return {Status::ok(), p};
}

Status HostSim::unreserve(DevicePtr p, Bytes n) {
  std::lock_guard lock(mu_);
  auto it = reservations_.find(p);
  if (it == reservations_.end() || it->second != n)
    return Status::error("host backend: unreserve of " + hex(p) + " that reserve did not return");
  reservations_.erase(it);
  return Status::ok();
}

Status HostSim::map(DevicePtr p, Bytes n) {
  std::lock_guard lock(mu_);
  return map_locked(p, n);
}

Status HostSim::map_locked(DevicePtr p, Bytes n) {
  if (used_ + n > opts_.capacity) return Status::oom();
  if (opts_.recorded) {
    auto r = next_recorded("map", true);
    if (!r.is_ok()) return r.status;
    if (r.value != p)
      return Status::error("host backend (recorded addresses): map at " + hex(p) + " but the recording mapped " +
                           hex(r.value) + " at position " + std::to_string(recorded_pos_));
  }
  used_ += n;
  mappings_[p] = n;
  forget_contents_locked(p, n);  // new physical memory: fresh contents
  return Status::ok();
}

Status HostSim::unmap(DevicePtr p, Bytes n) {
  std::lock_guard lock(mu_);
  // A mapping may be unmapped in pieces (whole pages of it); split ranges as needed.
  Bytes left = n;
  DevicePtr at = p;
  while (left > 0) {
    auto it = mappings_.upper_bound(at);
    if (it == mappings_.begin()) return Status::error("host backend: unmap of unmapped " + hex(at));
    --it;
    DevicePtr base = it->first;
    Bytes size = it->second;
    if (at >= base + size) return Status::error("host backend: unmap of unmapped " + hex(at));
    Bytes take = std::min(left, base + size - at);
    mappings_.erase(it);
    if (at > base) mappings_[base] = at - base;
    if (at + take < base + size) mappings_[at + take] = base + size - (at + take);
    used_ -= take;
    forget_contents_locked(at, take);
    left -= take;
    at += take;
  }
  return Status::ok();
}

// ------------------------------------------------------------------ contents and sleep calls

bool HostSim::backed_locked(DevicePtr p, Bytes n) const {
  // malloc'd segments hold whole ranges; mappings may be split, so walk them.
  if (auto it = segments_.upper_bound(p); it != segments_.begin()) {
    --it;
    if (p >= it->first && p + n <= it->first + it->second) return true;
  }
  DevicePtr at = p;
  const DevicePtr end = p + n;
  while (at < end) {
    auto it = mappings_.upper_bound(at);
    if (it == mappings_.begin()) return false;
    --it;
    if (at >= it->first + it->second) return false;
    at = it->first + it->second;
  }
  return true;
}

void HostSim::forget_contents_locked(DevicePtr p, Bytes n) {
  const DevicePtr end = p + n;
  auto it = contents_.lower_bound(p / kContentPage * kContentPage);
  while (it != contents_.end() && it->first < end) {
    const DevicePtr page = it->first;
    if (page >= p && page + kContentPage <= end) {
      it = contents_.erase(it);
      continue;
    }
    // A page only partly in the range: its part in the range reads fresh again.
    const DevicePtr lo = std::max(p, page), hi = std::min(end, page + kContentPage);
    if (lo < hi) std::memset(it->second.get() + (lo - page), kFreshByte, hi - lo);
    ++it;
  }
}

Status HostSim::write_locked(DevicePtr p, const unsigned char* src, Bytes n, const unsigned char* fill) {
  if (!backed_locked(p, n))
    return Status::error("host backend: write of " + std::to_string(n) + " bytes at " + hex(p) +
                         ", which is not allocated or mapped memory");
  for (Bytes done = 0; done < n;) {
    const DevicePtr at = p + done;
    const DevicePtr page = at / kContentPage * kContentPage;
    auto& mem = contents_[page];
    if (!mem) {
      mem = std::make_unique<unsigned char[]>(kContentPage);
      std::memset(mem.get(), kFreshByte, kContentPage);
    }
    const Bytes take = std::min(n - done, page + kContentPage - at);
    if (src != nullptr) std::memcpy(mem.get() + (at - page), src + done, take);
    else std::memset(mem.get() + (at - page), *fill, take);
    done += take;
  }
  return Status::ok();
}

Status HostSim::read_locked(DevicePtr p, unsigned char* dst, Bytes n) const {
  if (!backed_locked(p, n))
    return Status::error("host backend: read of " + std::to_string(n) + " bytes at " + hex(p) +
                         ", which is not allocated or mapped memory");
  for (Bytes done = 0; done < n;) {
    const DevicePtr at = p + done;
    const DevicePtr page = at / kContentPage * kContentPage;
    const Bytes take = std::min(n - done, page + kContentPage - at);
    auto it = contents_.find(page);
    if (it == contents_.end()) std::memset(dst + done, kFreshByte, take);
    else std::memcpy(dst + done, it->second.get() + (at - page), take);
    done += take;
  }
  return Status::ok();
}

Status HostSim::write(DevicePtr p, const void* src, Bytes n) {
  std::lock_guard lock(mu_);
  return write_locked(p, static_cast<const unsigned char*>(src), n, nullptr);
}

Status HostSim::fill(DevicePtr p, unsigned char byte, Bytes n) {
  std::lock_guard lock(mu_);
  return write_locked(p, nullptr, n, &byte);
}

Status HostSim::read(DevicePtr p, void* dst, Bytes n) const {
  std::lock_guard lock(mu_);
  return read_locked(p, static_cast<unsigned char*>(dst), n);
}

Bytes HostSim::pinned_bytes() const {
  std::lock_guard lock(mu_);
  return pinned_bytes_;
}

std::size_t HostSim::map_piece_calls() const {
  std::lock_guard lock(mu_);
  return map_piece_calls_;
}

std::size_t HostSim::copies() const {
  std::lock_guard lock(mu_);
  return copies_;
}

Result<void*> HostSim::host_alloc(Bytes n) {
  void* h = std::malloc(n == 0 ? 1 : n);
  if (h == nullptr) return {Status::oom("host backend: no host memory for " + std::to_string(n) + " bytes"), nullptr};
  std::lock_guard lock(mu_);
  pinned_[h] = n;
  pinned_bytes_ += n;
  return {Status::ok(), h};
}

void HostSim::host_free(void* h) {
  {
    std::lock_guard lock(mu_);
    auto it = pinned_.find(h);
    if (it == pinned_.end()) return;
    pinned_bytes_ -= it->second;
    pinned_.erase(it);
  }
  std::free(h);
}

Status HostSim::copy_to_host(void* h, DevicePtr p, Bytes n) {
  std::lock_guard lock(mu_);
  ++copies_;
  return read_locked(p, static_cast<unsigned char*>(h), n);
}

Status HostSim::copy_to_device(DevicePtr p, const void* h, Bytes n) {
  std::lock_guard lock(mu_);
  ++copies_;
  return write_locked(p, static_cast<const unsigned char*>(h), n, nullptr);
}

Status HostSim::map_pieces(DevicePtr p, Bytes n) {
  std::lock_guard lock(mu_);
  for (Bytes done = 0; done < n;) {
    const Bytes piece = std::min(n - done, kMaxMapPiece);
    ++map_piece_calls_;
    if (Status st = map_locked(p + done, piece); !st.is_ok()) {
      // Nothing stays mapped: give back the pieces mapped so far.
      for (Bytes off = 0; off < done;) {
        const Bytes q = std::min(done - off, kMaxMapPiece);
        auto it = mappings_.find(p + off);
        if (it != mappings_.end()) {
          used_ -= it->second;
          mappings_.erase(it);
        }
        off += q;
      }
      return st;
    }
    done += piece;
  }
  return Status::ok();
}

std::unique_ptr<DeviceMemory> make_host_memory(HostOptions opts, std::shared_ptr<HostSim>* sim) {
  auto s = std::make_shared<HostSim>(std::move(opts));
  if (sim) *sim = s;
  return make_device_memory<HostBackend>(s);
}

}  // namespace cachet::gpu
