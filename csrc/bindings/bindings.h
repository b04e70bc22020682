// One init_<subsystem>_bindings(m) per subsystem (STYLE.md item 4); module.cpp calls them.
#pragma once

#include <pybind11/pybind11.h>

namespace zs::bindings {

void init_config_bindings(pybind11::module_& m);
void init_report_bindings(pybind11::module_& m);
void init_zero_bindings(pybind11::module_& m);
void init_optim_bindings(pybind11::module_& m);    // csrc/bindings/optim_bindings.cpp
void init_offload_bindings(pybind11::module_& m);  // csrc/bindings/offload_bindings.cpp

}  // namespace zs::bindings
