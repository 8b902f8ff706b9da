// MD2 (RFC 1319) and HMAC-MD2 (RFC 2104, block size 16): the digest the CUDA runtime's integrity
// check asks the driver for (export_tables.cpp). Written from the RFCs; fakecuda_test checks
// RFC 1319's test suite.
#include "fakecuda.h"

#include <cstring>

namespace cachet::fakecuda {
namespace {
// RFC 1319's permutation of 0..255, built from the digits of pi.
constexpr unsigned char kPi[256] = {
    41,  46,  67,  201, 162, 216, 124, 1,   61,  54,  84,  161, 236, 240, 6,   19,  98,  167, 5,   243, 192, 199,
    115, 140, 152, 147, 43,  217, 188, 76,  130, 202, 30,  155, 87,  60,  253, 212, 224, 22,  103, 66,  111, 24,
    138, 23,  229, 18,  190, 78,  196, 214, 218, 158, 222, 73,  160, 251, 245, 142, 187, 47,  238, 122, 169, 104,
    121, 145, 21,  178, 7,   63,  148, 194, 16,  137, 11,  34,  95,  33,  128, 127, 93,  154, 90,  144, 50,  39,
    53,  62,  204, 231, 191, 247, 151, 3,   255, 25,  48,  179, 72,  165, 181, 209, 215, 94,  146, 42,  172, 86,
    170, 198, 79,  184, 56,  210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4,   241, 69,  157, 112, 89,
    100, 113, 135, 32,  134, 91,  207, 101, 230, 45,  168, 2,   27,  96,  37,  173, 174, 176, 185, 246, 28,  70,
    97,  105, 52,  64,  126, 15,  85,  71,  163, 35,  221, 81,  175, 58,  195, 92,  249, 206, 186, 197, 234, 38,
    44,  83,  13,  110, 133, 40,  132, 9,   211, 223, 205, 244, 65,  129, 77,  82,  106, 220, 55,  200, 108, 193,
    171, 250, 36,  225, 123, 8,   12,  189, 177, 74,  120, 136, 149, 139, 227, 99,  232, 109, 233, 203, 213, 254,
    59,  0,   29,  57,  242, 239, 183, 14,  102, 88,  208, 228, 166, 119, 114, 248, 235, 117, 75,  10,  49,  68,
    80,  180, 143, 237, 31,  26,  219, 153, 141, 51,  159, 17,  131, 20};

struct Md2 {
  unsigned char x[48] = {};         // the state (0..15), the block (16..31), their xor (32..47)
  unsigned char checksum[16] = {};
  unsigned char last = 0;           // the checksum's last byte written (L in RFC 1319 3.2)
  unsigned n = 0;                   // bytes of the current block

  void byte(unsigned char b) {
    x[16 + n] = b;
    x[32 + n] = static_cast<unsigned char>(x[n] ^ b);
    last = checksum[n] ^= kPi[b ^ last];
    if (++n < 16) return;
    n = 0;
    unsigned t = 0;
    for (unsigned round = 0; round < 18; ++round) {
      for (unsigned char& v : x) t = v ^= kPi[t];
      t = (t + round) & 0xff;
    }
  }
  void bytes(const unsigned char* p, std::size_t len) {
    for (std::size_t i = 0; i < len; ++i) byte(p[i]);
  }
  void finish(unsigned char out[16]) {
    const unsigned char pad = static_cast<unsigned char>(16 - n);
    for (unsigned i = 0; i < pad; ++i) byte(pad);
    unsigned char c[16];
    std::memcpy(c, checksum, 16);
    bytes(c, 16);
    std::memcpy(out, x, 16);
  }
};
}  // namespace

void md2(const std::string& message, unsigned char out[16]) {
  Md2 h;
  h.bytes(reinterpret_cast<const unsigned char*>(message.data()), message.size());
  h.finish(out);
}

void hmac_md2(const unsigned char key[16], const std::string& message, unsigned char out[16]) {
  unsigned char pad[16], inner[16];
  Md2 in;
  for (int i = 0; i < 16; ++i) pad[i] = key[i] ^ 0x36;
  in.bytes(pad, 16);
  in.bytes(reinterpret_cast<const unsigned char*>(message.data()), message.size());
  in.finish(inner);
  Md2 outer;
  for (int i = 0; i < 16; ++i) pad[i] = key[i] ^ 0x5c;
  outer.bytes(pad, 16);
  outer.bytes(inner, 16);
  outer.finish(out);
}
}  // namespace cachet::fakecuda
