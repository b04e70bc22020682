#include "bindings/bindings.h"
namespace zs::bindings {
void init_config_bindings(pybind11::module_& m) {}
}
