// The fault-injecting wrapper (see cachet/gpu/fault_backend.h).
#include "cachet/gpu/fault_backend.h"

#include <string>

namespace cachet::gpu {

void FaultInjector::set_plan(const FaultPlan& plan) {
  std::lock_guard lock(mu_);
  plan_ = plan;
  active_ = true;
  since_plan_ = 0;
  rng_.seed(plan.seed);
}

void FaultInjector::clear() {
  std::lock_guard lock(mu_);
  active_ = false;
}

std::uint64_t FaultInjector::failures() const {
  std::lock_guard lock(mu_);
  return failures_;
}

std::uint64_t FaultInjector::calls(CallClass c) const {
  std::lock_guard lock(mu_);
  return counts_[static_cast<int>(c)];
}

Status FaultInjector::inject(CallClass c, const char* call) {
  std::lock_guard lock(mu_);
  ++counts_[static_cast<int>(c)];
  if (!active_ || plan_.cls != c) return Status::ok();
  ++since_plan_;
  bool fail = false;
  if (plan_.fail_kth != 0) fail = since_plan_ == plan_.fail_kth || (plan_.repeat && since_plan_ > plan_.fail_kth);
  else if (plan_.probability > 0.0) fail = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < plan_.probability;
  if (!fail) return Status::ok();
  ++failures_;
  std::string m = std::string("injected failure of ") + call + " (call " + std::to_string(since_plan_) + ")";
  return plan_.as_oom ? Status::oom(m) : Status::error(m);
}

Result<DevicePtr> FaultInjector::malloc(Bytes n) {
  if (auto st = inject(CallClass::Alloc, "cudaMalloc"); !st.is_ok()) return {st, 0};
  return inner_->malloc(n);
}
Status FaultInjector::free(DevicePtr p) {
  if (auto st = inject(CallClass::Free, "cudaFree"); !st.is_ok()) return st;
  return inner_->free(p);
}
Result<EventHandle> FaultInjector::event_create() {
  if (auto st = inject(CallClass::Event, "cudaEventCreate"); !st.is_ok()) return {st, 0};
  return inner_->event_create();
}
Status FaultInjector::event_record(EventHandle e, StreamId s) {
  if (auto st = inject(CallClass::Event, "cudaEventRecord"); !st.is_ok()) return st;
  return inner_->event_record(e, s);
}
Result<bool> FaultInjector::event_query(EventHandle e) {
  if (auto st = inject(CallClass::Event, "cudaEventQuery"); !st.is_ok()) return {st, false};
  return inner_->event_query(e);
}
Status FaultInjector::event_synchronize(EventHandle e) {
  if (auto st = inject(CallClass::Event, "cudaEventSynchronize"); !st.is_ok()) return st;
  return inner_->event_synchronize(e);
}
Result<DevicePtr> FaultInjector::reserve(Bytes n) {
  if (auto st = inject(CallClass::Alloc, "cuMemAddressReserve"); !st.is_ok()) return {st, 0};
  return inner_->reserve(n);
}
Status FaultInjector::unreserve(DevicePtr p, Bytes n) {
  if (auto st = inject(CallClass::Free, "cuMemAddressFree"); !st.is_ok()) return st;
  return inner_->unreserve(p, n);
}
Status FaultInjector::map(DevicePtr p, Bytes n) {
  if (auto st = inject(CallClass::Alloc, "cuMemMap"); !st.is_ok()) return st;
  return inner_->map(p, n);
}
Status FaultInjector::unmap(DevicePtr p, Bytes n) {
  if (auto st = inject(CallClass::Free, "cuMemUnmap"); !st.is_ok()) return st;
  return inner_->unmap(p, n);
}

Status FaultInjector::map_pieces(DevicePtr p, Bytes n) {
  if (auto st = inject(CallClass::Alloc, "cuMemCreate/cuMemMap (wake)"); !st.is_ok()) return st;
  return inner_->map_pieces(p, n);
}
Result<void*> FaultInjector::host_alloc(Bytes n) {
  if (auto st = inject(CallClass::HostAlloc, "cudaHostAlloc"); !st.is_ok()) return {st, nullptr};
  return inner_->host_alloc(n);
}

}  // namespace cachet::gpu
