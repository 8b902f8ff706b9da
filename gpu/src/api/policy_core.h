// gpu/src/api/policy_core.h: PolicyCore, the one policy a CachingAllocator runs, chosen at
// construction (Config::policy), and with_policy(), the one place that dispatches to it.
//
// A std::variant visited by hand rather than a virtual interface: the policies are few and known,
// the call is one predictable branch (policy:pytorch first, as it is the default), and each
// policy's member is inlined into the API layer's caller.
#pragma once

#include <memory>
#include <utility>
#include <variant>

#include "policy_pytorch/policy.h"
#include "shell/policy.h"
#include "policy_cachet/policy.h"

namespace cachet::gpu::detail {

static_assert(Policy<PytorchPolicy>);
static_assert(Policy<CachetPolicy>);

class PolicyCore {
 public:
  PolicyCore(std::unique_ptr<DeviceMemory> memory, const Config& config)
      : policy_(make(std::move(memory), config)) {
    cachet_ = std::get_if<CachetPolicy>(&policy_);
    pytorch_ = std::get_if<PytorchPolicy>(&policy_);
  }
  PolicyCore(const PolicyCore&) = delete;
  PolicyCore& operator=(const PolicyCore&) = delete;

  // f(policy&) for the policy this core runs; f must return the same type for every policy.
  template <class F>
  decltype(auto) with_policy(F&& f) {
    if (cachet_ != nullptr) [[unlikely]]
      return std::forward<F>(f)(*cachet_);
    return std::forward<F>(f)(*pytorch_);
  }
  template <class F>
  decltype(auto) with_policy(F&& f) const {
    if (cachet_ != nullptr) [[unlikely]]
      return std::forward<F>(f)(std::as_const(*cachet_));
    return std::forward<F>(f)(std::as_const(*pytorch_));
  }

 private:
  using Variant = std::variant<PytorchPolicy, CachetPolicy>;
  // Built in place (the policies are neither copyable nor movable).
  static Variant make(std::unique_ptr<DeviceMemory> memory, const Config& config) {
    if (config.policy == cachet::Policy::Cachet)
      return Variant(std::in_place_type<CachetPolicy>, std::move(memory), config);
    return Variant(std::in_place_type<PytorchPolicy>, std::move(memory), config);
  }

  // The alternative policy_ holds (the other is null), set at construction. Dispatch reads these,
  // on the cache line where the policy begins, rather than the variant's index, which lies after
  // the policy, on another line.
  CachetPolicy* cachet_ = nullptr;
  PytorchPolicy* pytorch_ = nullptr;
  Variant policy_;
};

}  // namespace cachet::gpu::detail
