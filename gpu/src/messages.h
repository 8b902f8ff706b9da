// gpu/src/messages.h: the pieces of gpu/'s error texts that every part writes the same way: an
// address in hex, and a failed device call ("cuMemMap of N bytes on device D failed: ...").
#pragma once

#include <cinttypes>
#include <cstdio>
#include <string>

#include "cachet/gpu/backend.h"
#include "cachet/types.h"

namespace cachet::gpu::detail {

inline std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

inline std::string device_error(const char* call, Bytes n, DeviceIndex device, const Status& st) {
  std::string m = std::string(call);
  if (n) m += " of " + std::to_string(n) + " bytes";
  m += " on device " + std::to_string(device) + " failed: " + st.message;
  return m;
}

}  // namespace cachet::gpu::detail
