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
  return d;
}

config::RunContext run_context(std::optional<int64_t> world_size, bool require_batch, std::optional<int64_t> train_batch_size,
                               std::optional<int64_t> micro_batch_size,
                               std::optional<int64_t> gradient_accumulation_steps,
                               std::optional<int64_t> hidden_size,
                               std::optional<std::string> model_dtype, std::optional<double> lr,
                               std::optional<int64_t> total_num_steps) {
  config::RunContext c;
  c.world_size = world_size;
  c.require_batch = require_batch;
  c.train_batch_size = train_batch_size;
  c.micro_batch_size = micro_batch_size;
  c.gradient_accumulation_steps = gradient_accumulation_steps;
  c.hidden_size = hidden_size;
  c.model_dtype = std::move(model_dtype);
  c.lr = lr;
  c.total_num_steps = total_num_steps;
  return c;
}

#define ZS_RUN_CONTEXT_ARGS                                                              \
  py::arg("world_size") = py::none(), py::arg("require_batch") = false, py::arg("train_batch_size") = py::none(),                   \
  py::arg("micro_batch_size") = py::none(),                                              \
  py::arg("gradient_accumulation_steps") = py::none(), py::arg("hidden_size") = py::none(), \
  py::arg("model_dtype") = py::none(), py::arg("lr") = py::none(),                       \
  py::arg("total_num_steps") = py::none()

}  // namespace

void init_config_bindings(py::module_& m) {
  py::class_<config::DsConfig>(m, "DsConfig",
                               "A validated, resolved ds_config (the native typed tree).")
      .def_property_readonly("resolution",
                             [](const config::DsConfig& c) { return resolution_dict(c.resolution); })
      .def_property_readonly("zero_stage", [](const config::DsConfig& c) { return c.zero.stage; })
      .def_property_readonly("data_parallel_size",
                             [](const config::DsConfig& c) { return c.batch.data_parallel_size; });

  m.def(
      "check_config",
      [](const std::string& text, const std::string& source, std::optional<int64_t> world_size,
         bool require_batch,
         std::optional<int64_t> tb, std::optional<int64_t> mb, std::optional<int64_t> gas,
         std::optional<int64_t> hidden, std::optional<std::string> dtype,
         std::optional<double> lr, std::optional<int64_t> steps) {
        const config::RunContext ctx =
            run_context(world_size, require_batch, tb, mb, gas, hidden, std::move(dtype), lr, steps);
        config::Resolution r;
        {
          py::gil_scoped_release release;
          r = config::check_config(text, source, ctx);
        }
        return resolution_dict(r);
      },
      "Validates and resolves config text; never raises for a bad config (see 'errors').",
      py::arg("text"), py::arg("source"), ZS_RUN_CONTEXT_ARGS);

  m.def(
      "load_config",
      [](const std::string& text, const std::string& source, std::optional<int64_t> world_size,
         bool require_batch,
         std::optional<int64_t> tb, std::optional<int64_t> mb, std::optional<int64_t> gas,
         std::optional<int64_t> hidden, std::optional<std::string> dtype,
         std::optional<double> lr, std::optional<int64_t> steps) {
        const config::RunContext ctx =
            run_context(world_size, require_batch, tb, mb, gas, hidden, std::move(dtype), lr, steps);
        py::gil_scoped_release release;
        return config::load_config(text, source, ctx);
      },
      "Validates and resolves config text; raises ValueError listing every error.",
      py::arg("text"), py::arg("source"), ZS_RUN_CONTEXT_ARGS);

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
