// Faulting in the pages an O_DIRECT read is about to fill, ahead of the read. See
// Note [Populate before reading].
#pragma once

#include <cstddef>

namespace zs::offload {

// Note [Populate before reading]
// An O_DIRECT read into memory no one has touched yet makes the kernel fault in and zero
// every destination page while it maps the request (get_user_pages), on the path that
// submits the I/O, so the disk waits on page faults: on the dev VM a 2 GiB read into fresh
// memory ran at 0.4-1.7 GB/s against 1.5-2.6 into faulted memory. A checkpoint load reads
// Adam's moments into fresh tensors (a resumed process has never stepped). Populating
// each chunk just before its read is queued moves the faulting off the I/O path and
// overlaps it with the reads of the chunks before. MADV_POPULATE_WRITE (Linux 5.14) does
// it in one call without changing the bytes; on older kernels one byte per page is read
// and written back. Transparent huge pages were measured and are not asked for: their
// compaction stalled for seconds on a busy machine.
//
// Makes [data, data + bytes) resident and writable; the contents are unchanged.
void populate_pages(void* data, size_t bytes);

}  // namespace zs::offload
