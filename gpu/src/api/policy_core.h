// gpu/src/api/policy_core.h: PolicyCore, the one policy a CachingAllocator runs, chosen at
// construction (Config::policy), and with_policy(), the one place that dispatches to it.
//
// A std::variant visited by hand rather than a virtual interface: the policies are few and known,
// the call is one predictable branch on the variant's index (policy:pytorch first, as it is the
// default), and each policy's member is inlined into the API layer's caller.
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
      : policy_(make(std::move(memory), config)) {}

  // f(policy&) for the policy this core runs; f must return the same type for every policy.
  template <class F>
  decltype(auto) with_policy(F&& f) {
    if (auto* c = std::get_if<CachetPolicy>(&policy_)) [[unlikely]]
      return std::forward<F>(f)(*c);
    return std::forward<F>(f)(*std::get_if<PytorchPolicy>(&policy_));
  }
  template <class F>
  decltype(auto) with_policy(F&& f) const {
    if (const auto* c = std::get_if<CachetPolicy>(&policy_)) [[unlikely]]
      return std::forward<F>(f)(*c);
    return std::forward<F>(f)(*std::get_if<PytorchPolicy>(&policy_));
  }

 private:
  using Variant = std::variant<PytorchPolicy, CachetPolicy>;
  // Built in place (the policies are neither copyable nor movable).
  static Variant make(std::unique_ptr<DeviceMemory> memory, const Config& config) {
    if (config.policy == cachet::Policy::Cachet)
      return Variant(std::in_place_type<CachetPolicy>, std::move(memory), config);
    return Variant(std::in_place_type<PytorchPolicy>, std::move(memory), config);
  }

  Variant policy_;
};

}  // namespace cachet::gpu::detail
