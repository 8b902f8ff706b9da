#include "shell/block_state.h"

#include <cstdio>
#include <cstdlib>

#include "messages.h"

namespace cachet::gpu::detail {

const char* state_name(BlockState s) {
  switch (s) {
    case BlockState::Allocated: return "Allocated";
    case BlockState::AwaitingEvents: return "AwaitingEvents";
    case BlockState::Free: return "Free";
    case BlockState::Unmapped: return "Unmapped";
    case BlockState::Deferred: return "Deferred";
  }
  return "?";
}

// Both print "cachet: internal check failed: [INV-STATE-1] ..." (check.h's form) and abort.
void illegal_transition(BlockState from, BlockState to, DevicePtr ptr) {
  std::fprintf(stderr, "cachet: internal check failed: ");
  std::fprintf(stderr, "[INV-STATE-1] block at %s: %s -> %s is not a legal transition\n", hex(ptr).c_str(),
               state_name(from), state_name(to));
  std::abort();
}

void illegal_birth_or_removal(const char* what, BlockState s, DevicePtr ptr) {
  std::fprintf(stderr, "cachet: internal check failed: ");
  std::fprintf(stderr, "[INV-STATE-1] block at %s: %s in state %s (only Free or Unmapped)\n", hex(ptr).c_str(),
               what, state_name(s));
  std::abort();
}

}  // namespace cachet::gpu::detail
