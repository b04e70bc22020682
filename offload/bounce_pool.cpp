#include "offload/bounce_pool.h"

#include <cstdlib>
#include <new>

namespace zs::offload {

BouncePool::~BouncePool() {
  for (char* b : free_) std::free(b);
}

char* BouncePool::get() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      char* b = free_.back();
      free_.pop_back();
      return b;
    }
    ++allocated_;
  }
  void* p = nullptr;
  if (::posix_memalign(&p, 4096, static_cast<size_t>(bytes_)) != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    --allocated_;
    throw std::bad_alloc();
  }
  return static_cast<char*>(p);
}

void BouncePool::put(char* buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(buffer);
}

int64_t BouncePool::allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

}  // namespace zs::offload
