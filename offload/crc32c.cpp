#include "offload/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace zs::offload {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}

const std::array<uint32_t, 256>& byte_table() {
  static const std::array<uint32_t, 256> table = make_table();
  return table;
}

#if defined(__x86_64__)
// Note [Three CRC streams]: the crc32 instruction takes 3 cycles and can start one per
// cycle, so a single dependency chain runs at a third of its speed. A block of 3 * L bytes is
// cut into three runs whose CRCs are computed side by side and then joined. The CRC register
// is linear over GF(2): the register after run A then run B equals Z_L(register after A) xor
// (register of B started from 0), where Z_L advances a register over L zero bytes. Z_L is a
// 32x32 bit matrix, applied as four byte-indexed tables built once from its 32 columns.
struct ZeroShift {
  uint32_t t[4][256];

  explicit ZeroShift(size_t zero_bytes) {
    const auto& table = byte_table();
    uint32_t column[32];
    for (int bit = 0; bit < 32; ++bit) {
      uint32_t c = uint32_t{1} << bit;
      for (size_t i = 0; i < zero_bytes; ++i) c = table[c & 0xFFu] ^ (c >> 8);
      column[bit] = c;
    }
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int bit = 0; bit < 8; ++bit) {
          if (b & (1u << bit)) v ^= column[8 * k + bit];
        }
        t[k][b] = v;
      }
    }
  }

  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xFFu] ^ t[1][(c >> 8) & 0xFFu] ^ t[2][(c >> 16) & 0xFFu] ^ t[3][c >> 24];
  }
};

constexpr size_t kLong = 8192;  // bytes per stream in a long block (24 KiB a block)
constexpr size_t kShort = 256;  // in a short one (768 bytes)

inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// One pass of three streams of `len` bytes each (len a multiple of 8) starting at p.
__attribute__((target("sse4.2"))) uint32_t crc3_block(const unsigned char* p, size_t len,
                                                      uint32_t c, const ZeroShift& shift) {
  uint64_t c0 = c, c1 = 0, c2 = 0;
  for (size_t i = 0; i < len; i += 8) {
    c0 = _mm_crc32_u64(c0, load64(p + i));
    c1 = _mm_crc32_u64(c1, load64(p + len + i));
    c2 = _mm_crc32_u64(c2, load64(p + 2 * len + i));
  }
  uint32_t r = shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
  return shift(r) ^ static_cast<uint32_t>(c2);
}

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const void* data, size_t n, uint32_t crc) {
  static const ZeroShift long_shift(kLong);
  static const ZeroShift short_shift(kShort);
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (; n >= 3 * kLong; p += 3 * kLong, n -= 3 * kLong) c = crc3_block(p, kLong, c, long_shift);
  for (; n >= 3 * kShort; p += 3 * kShort, n -= 3 * kShort) {
    c = crc3_block(p, kShort, c, short_shift);
  }
  uint64_t c64 = c;
  for (; n >= 8; p += 8, n -= 8) c64 = _mm_crc32_u64(c64, load64(p));
  c = static_cast<uint32_t>(c64);
  while (n-- > 0) c = _mm_crc32_u8(c, *p++);
  return ~c;
}
#endif

}  // namespace

uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc) {
  const auto& table = byte_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (n-- > 0) c = table[(c ^ *p++) & 0xFFu] ^ (c >> 8);
  return ~c;
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  if (has_sse42) return crc32c_sse42(data, n, crc);
#endif
  return crc32c_portable(data, n, crc);
}

}  // namespace zs::offload
