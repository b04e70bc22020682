// zerostream._C: the only translation units that include pybind11 live in csrc/bindings/.
#include <pybind11/pybind11.h>

#include "bindings/bindings.h"
#include "common/check.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "zerostream native core: config, ZeRO planning, CPU optimizers, offload I/O";
  m.attr("__version__") = ZS_VERSION;
  py::register_exception<zs::ValueError>(m, "NativeValueError", PyExc_ValueError);
  py::register_exception<zs::NotImplementedError>(m, "NativeNotImplementedError",
                                                  PyExc_NotImplementedError);
  zs::bindings::init_config_bindings(m);
  zs::bindings::init_report_bindings(m);
  zs::bindings::init_zero_bindings(m);
  zs::bindings::init_optim_bindings(m);
  zs::bindings::init_offload_bindings(m);
}
