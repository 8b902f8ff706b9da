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

}  // namespace cachet
