// Bindings of the optim subsystem (filled by its issue).
#include "bindings/bindings.h"

namespace zs::bindings {

void init_optim_bindings(pybind11::module_& m) {}

}  // namespace zs::bindings
