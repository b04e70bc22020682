// zerostream._C: the only translation units that include pybind11 live in csrc/bindings/.
#include <pybind11/pybind11.h>

#include "bindings/bindings.h"
#include "common/check.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "zerostream native core: config, ZeRO planning, CPU optimizers, offload I/O";
  m.attr("__version__") = ZS_VERSION;
  // Bad input surfaces as Python's own ValueError / NotImplementedError (STYLE.md item 11).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const zs::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const zs::NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    }
  });
  zs::bindings::init_config_bindings(m);
  zs::bindings::init_report_bindings(m);
  zs::bindings::init_zero_bindings(m);
  zs::bindings::init_optim_bindings(m);
  zs::bindings::init_offload_bindings(m);
}
