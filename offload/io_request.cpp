#include "offload/io_request.h"

#include "offload/io_error.h"

namespace zs::offload {

void IoRequest::fail(const std::string& message, int err) {
  std::lock_guard<std::mutex> lock(mu_);
  if (has_error_) return;
  has_error_ = true;
  error_ = message;
  err_ = err;
}

void IoRequest::piece_finished() {
  if (pieces_left_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  finish();
}

void IoRequest::finish() {
  if (on_success && !failed()) on_success(*this);
  on_success = nullptr;  // drop captures on the worker, not at the caller's last ref
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

bool IoRequest::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return has_error_;
}

void IoRequest::wait(bool observe) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_.load(std::memory_order_acquire); });
  if (!has_error_) return;
  if (observe) observed_ = true;
  throw IoError(error_, err_);
}

}  // namespace zs::offload
