// Entry points of the config library: text in, one validated and resolved tree out.
//
// Note [One config path]: the resolved tree (Resolution::tree, every schema key present with
// its value) is the only representation of a config after parsing. Python turns it into frozen
// section dataclasses once (python/zerostream/config.py), and each component takes its own
// section object; defaults, types and allowed values live in schema.cpp alone. Native
// components take their own small structs (offload::IoConfig, ...), each filled in one place
// from its section.
#pragma once

#include <string>
#include <string_view>

#include "config/resolve.h"

namespace zs::config {

// Reads, validates and resolves config text. Throws zs::ValueError listing every error,
// one per line, each starting with its key path.
Resolution load_config(std::string_view text, const std::string& source, const RunContext& ctx);

// Same, without throwing: the resolution carries the errors (for `zerostream config check`).
Resolution check_config(std::string_view text, const std::string& source, const RunContext& ctx);

}  // namespace zs::config
