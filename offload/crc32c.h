// CRC32C (Castagnoli), the checksum of swap-store extents (zerostream.verify_swap_checksums).
// SSE4.2's crc32 instruction in three interleaved streams when the CPU has it (about three
// times one stream's speed; Note [Three CRC streams]), a table otherwise; same results.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zs::offload {

// Standard CRC32C: crc32c("123456789") == 0xE3069283. `crc` chains calls over pieces.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);
// The portable table version, exposed so tests can compare both paths.
uint32_t crc32c_portable(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace zs::offload
