// io_uring backend: one ring per worker thread; each worker keeps up to queue_depth pieces
// in flight, submits them in one batch (or one at a time with single_submit), reaps
// completions and checks each result (Note [Completion results]). The loop follows
// liburing's examples/io_uring-cp.c: queue, submit, reap, requeue short transfers.
#include <liburing.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "offload/io_engine.h"
#include "offload/io_error.h"
#include "offload/log.h"
#include "offload/uring_fixed.h"

namespace zs::offload {
namespace {

class UringWorker {
 public:
  UringWorker(const IoConfig& config, int index, const FixedTable& fixed)
      : config_(config), fixed_(fixed) {
    const unsigned entries = static_cast<unsigned>(config.queue_depth);
    const int ret = io_uring_queue_init(entries, &ring_, 0);
    ZS_CHECK_URING(ret, "io_uring_queue_init for worker", std::to_string(index), 0, entries);
    // Sparse tables up front; the engine fills slots as buffers and files are registered.
    if (config.register_buffers) {
      buffers_ok_ = io_uring_register_buffers_sparse(&ring_, kFixedBufferSlots) == 0;
    }
    if (config.register_files) {
      files_ok_ = io_uring_register_files_sparse(&ring_, kFixedFileSlots) == 0;
    }
    thread_ = std::thread([this] { run(); });
  }

  io_uring* ring() { return &ring_; }
  bool buffers_ok() const { return buffers_ok_; }
  bool files_ok() const { return files_ok_; }

  ~UringWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
    io_uring_queue_exit(&ring_);
  }

  void enqueue(std::vector<IoPiece>&& pieces) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& p : pieces) queue_.push_back(new IoPiece(std::move(p)));
    }
    cv_.notify_one();
  }

 private:
  void run();
  void fill();
  void prep(IoPiece* p);
  void reap(unsigned wait_nr);
  void finish(IoPiece* p, int64_t result);

  IoConfig config_;
  const FixedTable& fixed_;
  bool buffers_ok_ = false;
  bool files_ok_ = false;
  io_uring ring_{};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<IoPiece*> queue_;  // waiting for a free slot in the ring
  std::deque<IoPiece*> retry_;  // short or -EAGAIN: go before new work
  bool stop_ = false;
  unsigned inflight_ = 0;
  std::thread thread_;
};

void UringWorker::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Sleep only when nothing is in flight; otherwise completions wake us (and new
      // work is picked up right after the next one).
      cv_.wait(lock,
               [this] { return stop_ || !queue_.empty() || !retry_.empty() || inflight_ > 0; });
      // Drain on shutdown: callers may still wait on tickets of queued pieces.
      if (stop_ && queue_.empty() && retry_.empty() && inflight_ == 0) return;
    }
    fill();
    if (inflight_ == 0) continue;
    // overlap_events: refill as soon as one completes; otherwise DeepSpeed's sequential
    // mode, which waits for the whole batch before submitting the next.
    reap(config_.overlap_events ? 1u : inflight_);
  }
}

void UringWorker::fill() {
  while (inflight_ < static_cast<unsigned>(config_.queue_depth)) {
    IoPiece* p = nullptr;
    if (!retry_.empty()) {
      p = retry_.front();
      retry_.pop_front();
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) break;
      p = queue_.front();
      queue_.pop_front();
    }
    prep(p);
    ++inflight_;
    if (config_.single_submit) io_uring_submit(&ring_);
  }
}

void UringWorker::prep(IoPiece* p) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  // The ring has queue_depth entries and at most queue_depth pieces are in flight, so an
  // entry is always free; a full SQ here would be a bookkeeping bug.
  while (sqe == nullptr) {
    io_uring_submit(&ring_);
    sqe = io_uring_get_sqe(&ring_);
  }
  const IoFile& f = *p->req->file;
  begin_attempt(*p);
  char* buf = p->io_buffer();
  const unsigned len = static_cast<unsigned>(p->attempt_length);
  const uint64_t off = static_cast<uint64_t>(p->offset + p->done);
  const int file_slot = files_ok_ ? fixed_.file_slot(&f, p->direct) : -1;
  const int fd = file_slot >= 0 ? file_slot : (p->direct ? f.direct_fd() : f.buffered_fd());
  const int buf_slot = buffers_ok_ ? fixed_.buffer_slot(buf, len) : -1;
  const bool read = p->req->op == IoOp::kRead;
  if (buf_slot >= 0) {
    if (read) {
      io_uring_prep_read_fixed(sqe, fd, buf, len, off, buf_slot);
    } else {
      io_uring_prep_write_fixed(sqe, fd, buf, len, off, buf_slot);
    }
  } else if (read) {
    io_uring_prep_read(sqe, fd, buf, len, off);
  } else {
    io_uring_prep_write(sqe, fd, buf, len, off);
  }
  if (file_slot >= 0) sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data(sqe, p);
}

void UringWorker::reap(unsigned wait_nr) {
  // One io_uring_enter both submits what fill() queued (the batch) and waits; entries a
  // failed submit left in the SQ go out with the next call, so nothing is stranded.
  const int ret = io_uring_submit_and_wait(&ring_, wait_nr);
  if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
    warn_once("io_uring_enter",
              describe_io_failure("io_uring_submit_and_wait", "(ring)", 0, 0, -ret));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // no hot spin
  }
  io_uring_cqe* cqe = nullptr;
  unsigned head = 0;
  unsigned seen = 0;
  io_uring_for_each_cqe(&ring_, head, cqe) {
    auto* p = static_cast<IoPiece*>(io_uring_cqe_get_data(cqe));
    finish(p, cqe->res);
    ++seen;
  }
  io_uring_cq_advance(&ring_, seen);
  inflight_ -= seen;
}

void UringWorker::finish(IoPiece* p, int64_t result) {
  if (complete_attempt(*p, result) == AttemptOutcome::kResubmit) {
    retry_.push_back(p);
    return;
  }
  finish_piece(*p);
  delete p;
}

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(const IoConfig& config) : IoEngine(config) {
    for (int i = 0; i < config.threads; ++i) {
      workers_.push_back(std::make_unique<UringWorker>(this->config(), i, fixed_));
      buffers_ok_ = buffers_ok_ && workers_.back()->buffers_ok();
      files_ok_ = files_ok_ && workers_.back()->files_ok();
    }
    if (config.register_buffers && !buffers_ok_) {
      warn_once("fixed-buffers",
                "io_uring: registered buffers unavailable on this kernel; "
                "using plain reads and writes");
    }
    if (config.register_files && !files_ok_) {
      warn_once("fixed-files",
                "io_uring: registered files unavailable on this kernel; "
                "using plain descriptors");
    }
  }
  ~UringEngine() override {
    workers_.clear();  // join the workers before the table they read goes away
  }
  const char* backend_name() const override { return "io_uring"; }
  int workers() const override { return static_cast<int>(workers_.size()); }

  bool register_buffer(void* ptr, int64_t bytes) override;
  void unregister_buffer(void* ptr) override;
  bool register_file(const IoFilePtr& file) override;
  void unregister_file(const IoFilePtr& file) override;

 protected:
  void enqueue(int worker, std::vector<IoPiece>&& pieces) override {
    workers_[static_cast<size_t>(worker)]->enqueue(std::move(pieces));
  }

 private:
  // Sets slot `slot` of every ring's table; false (and the slot cleared) if one refuses.
  bool update_buffers(int slot, void* ptr, int64_t bytes);
  bool update_files(int slot, int fd);

  FixedTable fixed_;
  bool buffers_ok_ = true;
  bool files_ok_ = true;
  std::vector<std::unique_ptr<UringWorker>> workers_;
};

bool UringEngine::update_buffers(int slot, void* ptr, int64_t bytes) {
  iovec iov{ptr, static_cast<size_t>(bytes)};
  __u64 tag = 0;
  for (auto& w : workers_) {
    const int ret = io_uring_register_buffers_update_tag(w->ring(), static_cast<unsigned>(slot),
                                                         &iov, &tag, 1);
    if (ret < 0) {
      warn_once("fixed-buffer-update",
                "io_uring: registering a buffer of " + std::to_string(bytes) + " bytes failed: " +
                    describe_io_failure("register", "(buffer)", 0, bytes, -ret));
      if (ptr != nullptr) update_buffers(slot, nullptr, 0);
      return false;
    }
  }
  return true;
}

bool UringEngine::update_files(int slot, int fd) {
  for (auto& w : workers_) {
    const int ret = io_uring_register_files_update(w->ring(), static_cast<unsigned>(slot), &fd, 1);
    if (ret < 0) {
      if (fd != -1) update_files(slot, -1);
      return false;
    }
  }
  return true;
}

bool UringEngine::register_buffer(void* ptr, int64_t bytes) {
  // The kernel caps one fixed buffer at 1 GiB.
  if (!config().register_buffers || !buffers_ok_ || bytes <= 0 || bytes > (int64_t{1} << 30)) {
    return false;
  }
  auto lock = fixed_.lock();
  const int slot = fixed_.free_buffer_slot();
  if (slot < 0 || !update_buffers(slot, ptr, bytes)) return false;
  fixed_.add_buffer(static_cast<char*>(ptr), bytes, slot);
  return true;
}

void UringEngine::unregister_buffer(void* ptr) {
  auto lock = fixed_.lock();
  const int slot = fixed_.remove_buffer(static_cast<const char*>(ptr));
  // Pieces already submitted keep the kernel's reference until they complete.
  if (slot >= 0) update_buffers(slot, nullptr, 0);
}

bool UringEngine::register_file(const IoFilePtr& file) {
  if (!config().register_files || !files_ok_ || !file) return false;
  auto lock = fixed_.lock();
  FixedTable::FileSlots slots{file, -1, -1};
  slots.buffered = fixed_.free_file_slot();
  if (slots.buffered < 0 || !update_files(slots.buffered, file->buffered_fd())) return false;
  if (file->direct()) {
    slots.direct = fixed_.free_file_slot(slots.buffered);
    if (slots.direct < 0 || !update_files(slots.direct, file->direct_fd())) {
      update_files(slots.buffered, -1);
      return false;
    }
  }
  fixed_.add_file(slots);
  return true;
}

void UringEngine::unregister_file(const IoFilePtr& file) {
  auto lock = fixed_.lock();
  const FixedTable::FileSlots s = fixed_.remove_file(file.get());
  if (s.buffered >= 0) update_files(s.buffered, -1);
  if (s.direct >= 0) update_files(s.direct, -1);
}

}  // namespace

std::unique_ptr<IoEngine> make_uring_engine(const IoConfig& config) {
  return std::make_unique<UringEngine>(config);
}

}  // namespace zs::offload
