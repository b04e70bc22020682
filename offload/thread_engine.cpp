// Fallback backend: a pool of threads doing pread/pwrite. Chosen when io_uring cannot be
// set up (seccomp, old kernels, io_uring_disabled) or with aio.backend "threads".
// A blocking thread keeps one transfer in flight, so the pool has
// intra_op_parallelism x min(queue_depth, kMaxThreadsPerWorker) threads to approach the
// queue depth the config asks for without flooding two-core machines with threads.
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "offload/io_engine.h"

namespace zs::offload {
namespace {

constexpr int kMaxThreadsPerWorker = 8;

class ThreadEngine final : public IoEngine {
 public:
  explicit ThreadEngine(const IoConfig& config) : IoEngine(config) {
    const int per_worker = std::min(config.queue_depth, kMaxThreadsPerWorker);
    const int n = config.threads * per_worker;
    for (int i = 0; i < n; ++i) pool_.emplace_back([this] { run(); });
  }

  ~ThreadEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : pool_) t.join();
  }

  const char* backend_name() const override { return "threads"; }
  int workers() const override { return config().threads; }

 protected:
  // One shared queue: any idle thread takes the next piece, whatever its worker index.
  void enqueue(int /*worker*/, std::vector<IoPiece>&& pieces) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& p : pieces) queue_.push_back(std::move(p));
    }
    cv_.notify_all();
  }

 private:
  void run();
  static int64_t attempt(IoPiece& p);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<IoPiece> queue_;
  bool stop_ = false;
  std::vector<std::thread> pool_;
};

int64_t ThreadEngine::attempt(IoPiece& p) {
  begin_attempt(p);
  const IoFile& f = *p.req->file;
  const int fd = p.direct ? f.direct_fd() : f.buffered_fd();
  char* buf = p.io_buffer();
  const size_t len = static_cast<size_t>(p.attempt_length);
  const off_t off = static_cast<off_t>(p.offset + p.done);
  const ssize_t n = p.req->op == IoOp::kRead ? ::pread(fd, buf, len, off)
                                             : ::pwrite(fd, buf, len, off);
  return n < 0 ? -static_cast<int64_t>(errno) : static_cast<int64_t>(n);
}

void ThreadEngine::run() {
  for (;;) {
    IoPiece piece;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      piece = std::move(queue_.front());
      queue_.pop_front();
    }
    while (complete_attempt(piece, attempt(piece)) == AttemptOutcome::kResubmit) {
    }
    finish_piece(piece);
  }
}

}  // namespace

std::unique_ptr<IoEngine> make_thread_engine(const IoConfig& config) {
  return std::make_unique<ThreadEngine>(config);
}

}  // namespace zs::offload
