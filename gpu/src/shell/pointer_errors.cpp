#include "shell/pointer_errors.h"

#include <string>

#include "cachet/errors.h"
#include "messages.h"

namespace cachet::gpu::detail {

void throw_bad_pointer(const char* op, DevicePtr ptr, DeviceIndex device, const std::optional<BlockAt>& holder) {
  const std::string what = std::string(op) + "(" + hex(ptr) + "): ";
  if (holder) {
    if (ptr == holder->ptr && holder->free)
      throw UsageError(what + "double free or never allocated: " + hex(ptr) +
                       " is a free block of this allocator; free each pointer allocate() returned once");
    throw UsageError(what + "interior pointer: " + hex(ptr) + " is " + std::to_string(ptr - holder->ptr) +
                     " bytes into the block at " + hex(holder->ptr) + " (" + std::to_string(holder->size) +
                     " bytes); pass the pointer allocate() returned");
  }
  throw UsageError(what + "unknown pointer: " + hex(ptr) + " was not returned by this allocator (device " +
                   std::to_string(device) + "); pass a pointer allocate() returned");
}

}  // namespace cachet::gpu::detail
