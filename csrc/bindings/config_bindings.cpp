// ds_config parsing for Python: zerostream.config wraps these.
#include <optional>

#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "config/ds_config.h"

namespace py = pybind11;

namespace zs::bindings {
namespace {

using config::Json;

py::object to_python(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return py::none();
    case Json::value_t::boolean: return py::bool_(v.get<bool>());
    case Json::value_t::number_integer: return py::int_(v.get<int64_t>());
    case Json::value_t::number_unsigned: return py::int_(v.get<uint64_t>());
    case Json::value_t::number_float: return py::float_(v.get<double>());
    case Json::value_t::string: return py::str(v.get<std::string>());
    case Json::value_t::array: {
      py::list out;
      for (const Json& item : v) out.append(to_python(item));
      return std::move(out);
    }
    case Json::value_t::object: {
      py::dict out;
      for (auto it = v.begin(); it != v.end(); ++it) out[py::str(it.key())] = to_python(it.value());
      return std::move(out);
    }
    default: return py::none();
  }
}

py::dict resolution_dict(const config::Resolution& r) {
  py::dict resolved;
  for (const auto& [path, origin] : r.origins) {
    py::dict entry;
    entry["value"] = to_python(r.at(path));
    entry["source"] = config::origin_name(origin);
    resolved[py::str(path)] = entry;
  }
  py::dict d;
  d["ok"] = r.ok();
  d["errors"] = r.errors;
  d["warnings"] = r.warnings;
  d["notes"] = r.notes;
  d["tree"] = to_python(r.tree);
  d["resolved"] = resolved;
  d["data_parallel_size"] = r.data_parallel_size;
  return d;
}

}  // namespace

void init_config_bindings(py::module_& m) {
  py::class_<config::RunContext>(m, "RunContext",
                                 "What the run knows: resolves \"auto\" and the batch rule.")
      .def(py::init<>())
      .def_readwrite("world_size", &config::RunContext::world_size)
      .def_readwrite("require_batch", &config::RunContext::require_batch)
      .def_readwrite("train_batch_size", &config::RunContext::train_batch_size)
      .def_readwrite("micro_batch_size", &config::RunContext::micro_batch_size)
      .def_readwrite("gradient_accumulation_steps",
                     &config::RunContext::gradient_accumulation_steps)
      .def_readwrite("hidden_size", &config::RunContext::hidden_size)
      .def_readwrite("model_dtype", &config::RunContext::model_dtype)
      .def_readwrite("lr", &config::RunContext::lr)
      .def_readwrite("total_num_steps", &config::RunContext::total_num_steps);

  m.def(
      "check_config",
      [](const std::string& text, const std::string& source, const config::RunContext& ctx) {
        config::Resolution r;
        {
          py::gil_scoped_release release;
          r = config::check_config(text, source, ctx);
        }
        return resolution_dict(r);
      },
      "Validates and resolves config text; never raises for a bad config (see 'errors').",
      py::arg("text"), py::arg("source"), py::arg("context") = config::RunContext());

  m.def(
      "load_config",
      [](const std::string& text, const std::string& source, const config::RunContext& ctx) {
        config::Resolution r;
        {
          py::gil_scoped_release release;
          r = config::load_config(text, source, ctx);
        }
        return resolution_dict(r);
      },
      "Validates and resolves config text into the resolution (see check_config); raises "
      "ValueError listing every error. See Note [One config path] in csrc/config/ds_config.h.",
      py::arg("text"), py::arg("source"), py::arg("context") = config::RunContext());

  m.def(
      "read_json_text",
      [](const std::string& text, const std::string& source) {
        return to_python(config::read_json_text(text, source));
      },
      "Parses ds_config text (comments and trailing commas allowed) into Python objects.",
      py::arg("text"), py::arg("source"));

  m.def("accepted_key_paths", &config::accepted_key_paths,
        "Every ds_config key path zerostream accepts (aliases included).");
}

}  // namespace zs::bindings
