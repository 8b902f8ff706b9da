// policy:cachet (CachetPolicy, policy_cachet/policy.h): sleep and wake (issue 24,
// docs/sleep-wake.md). Not written yet for this policy: sleep() and wake() refuse with a
// UsageError that says so, after the refusals every policy shares.
#include "cachet/errors.h"
#include "policy_cachet/policy.h"

namespace cachet::gpu::detail {

Bytes CachetPolicy::sleep(const TagList& tags, const TagList& backup_tags) {
  check_sleep_call("sleep()", tags, &backup_tags);
  throw UsageError("sleep(): policy:cachet cannot sleep yet in gpu/ (docs/sleep-wake.md section 9); use policy:pytorch");
}

void CachetPolicy::wake(const TagList& tags) {
  check_sleep_call("wake()", tags, nullptr);
  throw UsageError("wake(): policy:cachet cannot sleep yet in gpu/ (docs/sleep-wake.md section 9); use policy:pytorch");
}

TagList CachetPolicy::sleeping() const { return {}; }

}  // namespace cachet::gpu::detail
