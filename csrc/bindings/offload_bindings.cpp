// Bindings of the offload subsystem (filled by its issue).
#include "bindings/bindings.h"

namespace zs::bindings {

void init_offload_bindings(pybind11::module_& m) {}

}  // namespace zs::bindings
