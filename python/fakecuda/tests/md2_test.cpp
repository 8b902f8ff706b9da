// md2.cpp against RFC 1319's test suite (appendix A.5) and RFC 2202-style HMAC construction
// checked by its definition on a known MD2: HMAC(K, m) = MD2((K^opad) || MD2((K^ipad) || m)).
#include "../fakecuda.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace {
std::string hex(const unsigned char* d) {
  char s[33];
  for (int i = 0; i < 16; ++i) std::snprintf(s + 2 * i, 3, "%02x", d[i]);
  return s;
}
std::string md2_hex(const std::string& m) {
  unsigned char d[16];
  cachet::fakecuda::md2(m, d);
  return hex(d);
}
}  // namespace

TEST(Md2, Rfc1319TestSuite) {
  EXPECT_EQ(md2_hex(""), "8350e5a3e24c153df2275c9f80692773");
  EXPECT_EQ(md2_hex("a"), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
  EXPECT_EQ(md2_hex("abc"), "da853b0d3f88d99b30283a69e6ded6bb");
  EXPECT_EQ(md2_hex("message digest"), "ab4f496bfb2a530b219ff33031fe06b0");
  EXPECT_EQ(md2_hex("abcdefghijklmnopqrstuvwxyz"), "4e8ddff3650292ab5a4108c3aa47940b");
  EXPECT_EQ(md2_hex("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"),
            "da33def2a42df13975352846c30338cd");
  EXPECT_EQ(md2_hex("12345678901234567890123456789012345678901234567890123456789012345678901234567890"),
            "d5976f79d83d3a0dc9806c3c66f3efd8");
}

TEST(Md2, HmacIsTheTwoNestedDigests) {
  unsigned char key[16];
  for (int i = 0; i < 16; ++i) key[i] = static_cast<unsigned char>(i * 17 + 3);
  const std::string m = "cachet";
  std::string inner_in, outer_in;
  for (unsigned char k : key) inner_in.push_back(static_cast<char>(k ^ 0x36));
  inner_in += m;
  unsigned char inner[16], mac[16];
  cachet::fakecuda::md2(inner_in, inner);
  for (unsigned char k : key) outer_in.push_back(static_cast<char>(k ^ 0x5c));
  outer_in.append(reinterpret_cast<const char*>(inner), 16);
  cachet::fakecuda::hmac_md2(key, m, mac);
  EXPECT_EQ(hex(mac), md2_hex(outer_in));
  EXPECT_NE(hex(mac), md2_hex(m));
}
