// Facts about this build and machine for `zerostream report`.
#include <omp.h>

#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "common/cpu_features.h"
#include "cuda/cuda_status.h"
#include "offload/io_probe.h"

namespace py = pybind11;

namespace zs::bindings {

void init_report_bindings(py::module_& m) {
  m.def("build_info", [] {
    py::dict d;
    d["version"] = ZS_VERSION;
#if defined(__clang__)
    d["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
    d["compiler"] = std::string("gcc ") + __VERSION__;
#else
    d["compiler"] = "unknown";
#endif
    d["openmp"] = _OPENMP;
#ifdef ZS_WITH_CUDA
    d["with_cuda"] = true;
#else
    d["with_cuda"] = false;
#endif
    return d;
  });
  m.def("cpu_info", [] {
    const CpuFeatures& f = cpu_features();
    py::dict d;
    d["simd_level"] = simd_level_name(best_simd_level());
    d["avx2"] = f.avx2;
    d["fma"] = f.fma;
    d["f16c"] = f.f16c;
    d["avx512f"] = f.avx512f;
    d["avx512bw"] = f.avx512bw;
    d["avx512vl"] = f.avx512vl;
    d["avx512bf16"] = f.avx512bf16;
    d["neon"] = f.neon;
    d["omp_max_threads"] = omp_get_max_threads();
    return d;
  });
  m.def(
      "probe_io_uring",
      [] {
        py::gil_scoped_release release;
        return offload::probe_io_uring();
      },
      "Sets up an io_uring ring and round-trips a NOP; returns \"\" or why it failed.");
  m.def(
      "probe_o_direct",
      [](const std::string& dir) {
        py::gil_scoped_release release;
        return offload::probe_o_direct(dir);
      },
      "Writes and reads 4 KiB with O_DIRECT under dir; returns \"\" or why it failed.",
      py::arg("dir"));
  m.def("cuda_info", [] {
    cuda::CudaStatus s;
    {
      py::gil_scoped_release release;
      s = cuda::probe();
    }
    py::dict d;
    d["built"] = s.built;
    d["runtime_version"] = s.runtime_version;
    d["driver_version"] = s.driver_version;
    d["device_count"] = s.device_count;
    d["kernel_ok"] = s.kernel_ok;
    d["nccl_version"] = s.nccl_version;
    d["error"] = s.error;
    return d;
  });
}

}  // namespace zs::bindings
