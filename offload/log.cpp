#include "offload/log.h"

#include <cstdio>
#include <mutex>
#include <set>

namespace zs::offload {
namespace {

struct WarningLog {
  std::mutex mu;
  std::set<std::string> keys;
  std::vector<std::string> messages;
  std::function<void(const std::string&)> sink;
};

WarningLog& log() {
  static WarningLog* instance = new WarningLog();  // never destroyed: used at exit
  return *instance;
}

}  // namespace

void warn_once(const std::string& key, const std::string& message) {
  WarningLog& l = log();
  std::function<void(const std::string&)> sink;
  {
    std::lock_guard<std::mutex> lock(l.mu);
    if (!l.keys.insert(key).second) return;
    l.messages.push_back(message);
    sink = l.sink;
  }
  if (sink) {
    sink(message);
  } else {
    std::fprintf(stderr, "[zerostream] warning: %s\n", message.c_str());
  }
}

std::vector<std::string> warnings_emitted() {
  std::lock_guard<std::mutex> lock(log().mu);
  return log().messages;
}

void set_warning_sink(std::function<void(const std::string&)> sink) {
  std::lock_guard<std::mutex> lock(log().mu);
  log().sink = std::move(sink);
}

}  // namespace zs::offload
