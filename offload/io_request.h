// One submitted read or write: its shared completion state, the block-size pieces the
// engine cut it into, and the ticket a caller waits on. Pieces hold the request alive;
// neither holds anything of Python or torch (the caller keeps the buffer alive until the
// ticket is done, see Note [Buffer lifetime] in csrc/bindings/offload_bindings.cpp).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "offload/bounce_pool.h"
#include "offload/io_file.h"

namespace zs::offload {

enum class IoOp { kRead, kWrite };

class IoRequest {
 public:
  IoRequest(IoOp op, IoFilePtr file, char* buf, int64_t length, int64_t offset)
      : op(op), file(std::move(file)), buf(buf), length(length), offset(offset) {}

  const IoOp op;
  const IoFilePtr file;
  char* const buf;
  const int64_t length;
  const int64_t offset;
  // Runs once on the thread that finishes the last piece, before waiters wake, and only
  // when no piece failed (e.g. checksum verification). May call fail(). Pure C++.
  std::function<void(IoRequest&)> on_success;

  // Records the first failure; later ones are dropped (the first is the cause).
  void fail(const std::string& message, int err);
  // Called once per piece by the engine; the last call completes the request.
  void piece_finished();
  void set_pieces(int64_t n) { pieces_left_.store(n); }

  bool done() const { return done_.load(std::memory_order_acquire); }
  // Blocks until done; throws IoError with the first failure. `observe` marks the error
  // as delivered so that IoEngine::wait_all does not raise it a second time.
  void wait(bool observe = true);
  bool failed() const;
  bool error_observed() const { return observed_.load(); }

 private:
  void finish();
  std::atomic<int64_t> pieces_left_{0};
  std::atomic<bool> done_{false};
  std::atomic<bool> observed_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string error_;
  int err_ = 0;
  bool has_error_ = false;
};

using IoRequestPtr = std::shared_ptr<IoRequest>;

// A block-size slice of a request. `done` bytes have moved; the rest is (re)submitted.
struct IoPiece {
  IoRequestPtr req;
  char* buf = nullptr;
  int64_t offset = 0;
  int64_t length = 0;
  int64_t done = 0;
  bool direct = false;  // through the O_DIRECT fd; see Note [Direct alignment]
  // The attempt in flight (see begin_attempt in io_engine.h): bytes asked for, and an
  // injected errno that replaces its result (fault_injection.h; 0 normally).
  int64_t attempt_length = 0;
  int injected_err = 0;
  // Set for direct pieces of misaligned buffers: see Note [Bounce buffers].
  BouncePool* bounce_pool = nullptr;
  char* bounce = nullptr;  // mirrors buf[0, length) while the piece is in flight

  // Where the next attempt's bytes go to or come from.
  char* io_buffer() const { return (bounce != nullptr ? bounce : buf) + done; }
};

// The caller's handle on one request: wait() for exactly this request, done() to poll.
class IoTicket {
 public:
  IoTicket() = default;
  explicit IoTicket(IoRequestPtr req) : req_(std::move(req)) {}
  bool valid() const { return req_ != nullptr; }
  bool done() const { return !req_ || req_->done(); }
  void wait() const {
    if (req_) req_->wait();
  }
  int64_t bytes() const { return req_ ? req_->length : 0; }
  const IoRequestPtr& request() const { return req_; }

 private:
  IoRequestPtr req_;
};

}  // namespace zs::offload
