// Warnings from the offload tier (O_DIRECT refused, memory not lockable, io_uring missing).
// Each distinct key is reported once per process: a degraded mode is worth one line in
// the log, not one per request.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace zs::offload {

// Emits `message` once per `key` through the sink (stderr by default). Thread-safe.
void warn_once(const std::string& key, const std::string& message);

// Every warning emitted so far, oldest first (what `zerostream report` shows).
std::vector<std::string> warnings_emitted();

// Replaces the sink; pass nullptr to restore stderr. Never call into Python from a sink:
// warnings can come from worker threads.
void set_warning_sink(std::function<void(const std::string&)> sink);

}  // namespace zs::offload
