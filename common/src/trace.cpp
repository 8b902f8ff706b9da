#include "cachet/trace.h"

#include <array>
#include <utility>

namespace cachet {
namespace {
constexpr std::array<std::pair<TraceAction, std::string_view>, 9> kNames{{
    {TraceAction::Alloc, "alloc"},
    {TraceAction::FreeRequested, "free_requested"},
    {TraceAction::FreeCompleted, "free_completed"},
    {TraceAction::SegmentAlloc, "segment_alloc"},
    {TraceAction::SegmentFree, "segment_free"},
    {TraceAction::SegmentMap, "segment_map"},
    {TraceAction::SegmentUnmap, "segment_unmap"},
    {TraceAction::Snapshot, "snapshot"},
    {TraceAction::Oom, "oom"},
}};
}  // namespace

std::string_view to_string(TraceAction a) {
  for (const auto& [action, name] : kNames)
    if (action == a) return name;
  return "unknown";
}

std::optional<TraceAction> trace_action_from_string(std::string_view s) {
  for (const auto& [action, name] : kNames)
    if (name == s) return action;
  return std::nullopt;
}

namespace {
thread_local std::uint32_t t_trace_call = 0;
}  // namespace

TraceCallScope::TraceCallScope(std::uint32_t id) noexcept : previous_(t_trace_call) { t_trace_call = id; }
TraceCallScope::~TraceCallScope() { t_trace_call = previous_; }
std::uint32_t current_trace_call() noexcept { return t_trace_call; }

}  // namespace cachet
