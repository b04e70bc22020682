// The I/O engine: moves bytes between host buffers and files, asynchronously, with a
// per-request ticket. Two backends share this front: io_uring (one ring per worker
// thread, uring_engine.cpp) and a pread/pwrite thread pool (thread_engine.cpp), picked by
// IoConfig::backend. Requests are cut into block-size pieces spread over the workers;
// every completion is checked (see Note [Completion results]).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "offload/io_config.h"
#include "offload/io_file.h"
#include "offload/io_request.h"

namespace zs::offload {

// Note [Completion results]
// DeepSpeed's libaio path counted completions and never read their result, so short and
// failed transfers vanished. Here every attempt's result goes through complete_attempt():
//  * -EAGAIN / -EINTR: resubmitted as is;
//  * other negative values: the request fails with path, offset, length and strerror;
//  * 0 on a read: the file ended before the request did, an error (never zeros);
//  * fewer bytes than asked: the remainder is resubmitted from where it stopped.
enum class AttemptOutcome { kFinished, kResubmit };
// Sets up the next attempt of `piece` (its length, and any injected fault); the engines
// call it right before submitting, and complete_attempt() with the attempt's result.
void begin_attempt(IoPiece& piece);
AttemptOutcome complete_attempt(IoPiece& piece, int64_t result);
// After kFinished: returns the piece's bounce buffer and counts it done on its request
// (which may complete the request). The piece must not be used afterwards.
void finish_piece(IoPiece& piece);

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // Queues a transfer of `length` bytes at `offset` of `file`; returns at once. The
  // buffer must stay valid until the ticket is done. `on_success` see IoRequest.
  IoTicket submit(IoOp op, IoFilePtr file, void* buf, int64_t length, int64_t offset,
                  std::function<void(IoRequest&)> on_success = {});
  // Convenience: opens `path` (create for writes) with this engine's O_DIRECT setting.
  IoTicket read(const std::string& path, void* buf, int64_t length, int64_t offset);
  IoTicket write(const std::string& path, const void* buf, int64_t length, int64_t offset);
  IoFilePtr open(const std::string& path, OpenMode mode) const;

  // Waits for every request submitted since the last wait_all; returns how many there
  // were. Throws the first failure not already raised by that request's own wait().
  int64_t wait_all();

  // Optional io_uring fixed resources (IoConfig::register_buffers / register_files):
  // pieces inside a registered buffer use READ_FIXED/WRITE_FIXED (no page pinning per
  // I/O) and registered files skip the fd lookup. All return false, changing nothing, on
  // the thread backend, when the config leaves them off, or when the kernel refuses. A
  // registered buffer must stay mapped until unregister_buffer; a registered file stays
  // open (the engine holds it) until unregister_file.
  virtual bool register_buffer(void* /*ptr*/, int64_t /*bytes*/) { return false; }
  virtual void unregister_buffer(void* /*ptr*/) {}
  virtual bool register_file(const IoFilePtr& /*file*/) { return false; }
  virtual void unregister_file(const IoFilePtr& /*file*/) {}

  const IoConfig& config() const { return config_; }
  // Bounce buffers made so far: nonzero once a misaligned buffer's body went direct.
  int64_t bounce_buffers() const { return bounce_.allocated(); }
  virtual const char* backend_name() const = 0;
  virtual int workers() const = 0;

 protected:
  explicit IoEngine(const IoConfig& config);
  // Hands pieces to worker `worker` (0 <= worker < config().threads). Derived engines
  // must finish every piece before their destructor returns (bounce buffers belong to
  // the base).
  virtual void enqueue(int worker, std::vector<IoPiece>&& pieces) = 0;

 private:
  void track(const IoRequestPtr& req);
  IoConfig config_;
  BouncePool bounce_;
  std::atomic<uint64_t> next_worker_{0};
  std::mutex mu_;
  std::vector<IoRequestPtr> since_wait_all_;
};

// Cuts a request into pieces: see Note [Direct alignment] for head/body/tail; body pieces
// are block_size bytes; the pieces are dealt in `workers` contiguous runs, run g going to
// worker (first_worker + g) % workers. The engine rotates first_worker per request so
// that requests of one piece spread over the rings too. Exposed for tests.
// With a `bounce` pool, the body of a request whose buffer is misaligned differently from
// its offset still goes direct, through bounce buffers (Note [Bounce buffers]); without
// one, such a request is all buffered.
std::vector<std::vector<IoPiece>> split_request(const IoRequestPtr& req, int64_t block_size,
                                                int workers, int first_worker = 0,
                                                BouncePool* bounce = nullptr);

// Builds the engine `config.backend` asks for. kAuto falls back to threads (one warning)
// when probe_io_uring() (io_probe.h) fails or this config's rings cannot be set up; an
// explicit kIoUring that fails throws IoError.
std::unique_ptr<IoEngine> make_io_engine(const IoConfig& config);

// Backends (constructors throw IoError when their resources cannot be created).
std::unique_ptr<IoEngine> make_uring_engine(const IoConfig& config);
std::unique_ptr<IoEngine> make_thread_engine(const IoConfig& config);

}  // namespace zs::offload
