// Bindings of the offload subsystem (zerostream._C.offload): IoConfig, IoEngine, IoTicket,
// HostArena/HostBuffer (DLPack export), SwapStore, and test-only fault injection.
// Every call that can block (open, fallocate, waits, budget backpressure) releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cerrno>

#include "bindings/bindings.h"
#include "common/check.h"
#include "offload/crc32c.h"
#include "offload/fault_injection.h"
#include "offload/host_arena.h"
#include "offload/io_engine.h"
#include "offload/io_error.h"
#include "offload/log.h"
#include "offload/populate.h"
#include "offload/swap_store.h"

namespace py = pybind11;

namespace zs::bindings {
namespace {

using namespace zs::offload;

// Note [Buffer lifetime]
// Worker threads see only raw pointers (DeepSpeed's GIL deadlock, #7727, came from a
// worker dropping the last reference to a torch tensor). The Python object that owns the
// memory rides in the PyTicket as `keepalive`, touched only with the GIL held. Dropping a
// ticket whose I/O is still in flight waits for it (GIL released) before letting go of the
// buffer, so the kernel never writes into freed memory.
struct PyTicket {
  IoTicket ticket;
  py::object keepalive;

  PyTicket(IoTicket t, py::object keep) : ticket(std::move(t)), keepalive(std::move(keep)) {}
  PyTicket(const PyTicket&) = delete;
  ~PyTicket() {
    if (ticket.done()) return;
    py::gil_scoped_release nogil;
    try {
      ticket.request()->wait(/*observe=*/false);
    } catch (const std::exception&) {
      // The error belongs to whoever waits; a dropped ticket has no one to tell.
    }
  }
};

// --- DLPack (v0 ABI, the stable C structs torch.from_dlpack accepts) -------------------
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

// Owns one reference to the arena buffer for as long as torch's storage lives. Its
// deleter may run on any thread, with or without the GIL: it touches no Python object.
struct DlpackContext {
  HostBufferPtr buffer;
  int64_t shape[1];
  DLManagedTensor managed;
};

void dlpack_deleter(DLManagedTensor* self) {
  delete static_cast<DlpackContext*>(self->manager_ctx);
}

py::capsule to_dlpack(const HostBufferPtr& buffer) {
  auto* ctx = new DlpackContext{buffer, {buffer->size()}, {}};
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = buffer->data();
  t.device = DLDevice{1 /* kDLCPU */, 0};
  t.ndim = 1;
  t.dtype = DLDataType{1 /* kDLUInt */, 8, 1};
  t.shape = ctx->shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = dlpack_deleter;
  // A capsule never consumed (still named "dltensor") frees its context itself.
  return py::capsule(&ctx->managed, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      m->deleter(m);
    }
  });
}

void* as_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

py::dict arena_stats(const HostArenaStats& s) {
  py::dict d;
  d["budget"] = s.budget;
  d["in_use"] = s.in_use;
  d["peak"] = s.peak;
  d["waits"] = s.waits;
  d["allocations"] = s.allocations;
  d["unlocked"] = s.unlocked;
  d["registrations"] = s.registrations;
  d["registered"] = s.registered;
  d["register_failed"] = s.register_failed;
  d["pool_misses"] = s.pool_misses;
  return d;
}

py::dict store_stats(const SwapStoreStats& s) {
  py::dict d;
  d["tensors"] = s.tensors;
  d["used_bytes"] = s.used_bytes;
  d["file_bytes"] = s.file_bytes;
  d["free_bytes"] = s.free_bytes;
  d["free_ranges"] = s.free_ranges;
  return d;
}

void register_errors(py::module_& m) {
  // IoError is an OSError whose errno and strerror are set, so `except OSError as e:
  // e.errno == errno.ENOSPC` works; str() carries path, offset and length.
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> storage;
  storage.call_once_and_store_result([&]() {
    return py::object(py::reinterpret_steal<py::object>(
        PyErr_NewException("zerostream._C.offload.IoError", PyExc_OSError, nullptr)));
  });
  m.attr("IoError") = storage.get_stored();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const IoError& e) {
      // errno 0 (end of file, checksum) carries no OS code: message only, errno None.
      py::object args = e.err() != 0 ? py::object(py::make_tuple(e.err(), e.what()))
                                     : py::object(py::make_tuple(e.what()));
      PyErr_SetObject(storage.get_stored().ptr(), args.ptr());
    }
  });
}

void bind_config(py::module_& m) {
  py::class_<IoConfig>(m, "IoConfig", "ds_config `aio` plus zerostream's I/O knobs")
      .def(py::init<>())
      .def_readwrite("block_size", &IoConfig::block_size)
      .def_readwrite("queue_depth", &IoConfig::queue_depth)
      .def_readwrite("threads", &IoConfig::threads)
      .def_readwrite("single_submit", &IoConfig::single_submit)
      .def_readwrite("overlap_events", &IoConfig::overlap_events)
      .def_readwrite("use_direct", &IoConfig::use_direct)
      .def_readwrite("register_buffers", &IoConfig::register_buffers)
      .def_readwrite("register_files", &IoConfig::register_files)
      .def_property(
          "backend", [](const IoConfig& c) { return std::string(io_backend_name(c.backend)); },
          [](IoConfig& c, const std::string& name) { c.backend = parse_io_backend(name); })
      .def("validate", &IoConfig::validate);
}

void bind_engine(py::module_& m) {
  py::class_<PyTicket>(m, "IoTicket", "One request: wait() for it alone, done() to poll")
      .def("wait",
           [](PyTicket& t) {
             py::gil_scoped_release nogil;
             t.ticket.wait();
           })
      .def("done", [](const PyTicket& t) { return t.ticket.done(); })
      .def_property_readonly("nbytes", [](const PyTicket& t) { return t.ticket.bytes(); });

  auto submit = [](IoOp op) {
    return [op](IoEngine& e, const std::string& path, uintptr_t ptr, int64_t nbytes, int64_t offset,
                py::object keepalive) {
      IoTicket t;
      {
        py::gil_scoped_release nogil;  // open() can block on a slow filesystem
        t = op == IoOp::kRead ? e.read(path, as_ptr(ptr), nbytes, offset)
                              : e.write(path, as_ptr(ptr), nbytes, offset);
      }
      return std::make_unique<PyTicket>(std::move(t), std::move(keepalive));
    };
  };
  py::class_<IoEngine>(m, "IoEngine", "Asynchronous file I/O (io_uring or thread pool)")
      .def(py::init([](const IoConfig& c) {
             py::gil_scoped_release nogil;
             return make_io_engine(c);
           }),
           py::arg("config"))
      .def("read", submit(IoOp::kRead), py::arg("path"), py::arg("ptr"), py::arg("nbytes"),
           py::arg("offset") = 0, py::arg("keepalive") = py::none())
      .def("write", submit(IoOp::kWrite), py::arg("path"), py::arg("ptr"), py::arg("nbytes"),
           py::arg("offset") = 0, py::arg("keepalive") = py::none())
      .def("wait_all", &IoEngine::wait_all, py::call_guard<py::gil_scoped_release>())
      .def(
          "register_buffer",
          [](IoEngine& e, uintptr_t ptr, int64_t nbytes) {
            return e.register_buffer(as_ptr(ptr), nbytes);
          },
          py::arg("ptr"), py::arg("nbytes"), py::call_guard<py::gil_scoped_release>())
      .def(
          "unregister_buffer", [](IoEngine& e, uintptr_t ptr) { e.unregister_buffer(as_ptr(ptr)); },
          py::arg("ptr"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("backend", &IoEngine::backend_name)
      .def_property_readonly("workers", &IoEngine::workers)
      .def_property_readonly("bounce_buffers", &IoEngine::bounce_buffers,
                             "bounce buffers made so far: pieces of misaligned buffers went "
                             "through them (Note [Bounce buffers])")
      .def_property_readonly("config", &IoEngine::config);
}

void bind_arena(py::module_& m) {
  py::class_<HostBuffer, HostBufferPtr>(m, "HostBuffer", "A page-locked arena buffer")
      .def_property_readonly(
          "ptr", [](const HostBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); })
      .def_property_readonly("nbytes", &HostBuffer::size)
      .def_property_readonly("footprint", &HostBuffer::footprint)
      .def_property_readonly("locked", &HostBuffer::locked)
      .def_property_readonly("cuda_registered", &HostBuffer::cuda_registered)
      .def("to_dlpack", &to_dlpack,
           "A DLPack capsule (uint8, 1-D) that keeps this buffer alive for torch");

  py::class_<HostArena>(m, "HostArena", "Budgeted page-locked host memory")
      .def(py::init([](int64_t budget, bool lock, bool cuda_register, bool pooled) {
             return std::make_unique<HostArena>(
                 HostArenaOptions{budget, lock, cuda_register, pooled});
           }),
           py::arg("budget_bytes"), py::arg("lock") = true, py::arg("cuda_register") = false,
           py::arg("pooled") = false)
      .def("allocate", &HostArena::allocate, py::arg("nbytes"), py::arg("timeout_s") = 60.0,
           py::call_guard<py::gil_scoped_release>())
      .def("try_allocate", &HostArena::try_allocate, py::arg("nbytes"),
           py::call_guard<py::gil_scoped_release>())
      .def("stats", [](const HostArena& a) { return arena_stats(a.stats()); });
  m.def(
      "populate",
      [](uintptr_t ptr, int64_t nbytes) {
        ZS_CHECK_VALUE(nbytes >= 0, "populate: nbytes must be >= 0; got ", nbytes);
        populate_pages(reinterpret_cast<void*>(ptr), static_cast<size_t>(nbytes));
      },
      py::arg("ptr"), py::arg("nbytes"), py::call_guard<py::gil_scoped_release>(),
      "Faults in the pages of nbytes at ptr, contents unchanged (Note [Populate before "
      "reading])");
}

void bind_store(py::module_& m) {
  auto io = [](IoOp op) {
    return [op](SwapStore& s, uint64_t id, uintptr_t ptr, int64_t nbytes, py::object keep) {
      IoTicket t;
      {
        py::gil_scoped_release nogil;  // write may fallocate; read may wait for a write
        t = op == IoOp::kRead ? s.read(id, as_ptr(ptr), nbytes) : s.write(id, as_ptr(ptr), nbytes);
      }
      return std::make_unique<PyTicket>(std::move(t), std::move(keep));
    };
  };
  py::class_<SwapStore>(m, "SwapStore", "A rank's extent-allocated swap files")
      .def(py::init([](IoEngine& e, const std::string& nvme_path, int rank, const std::string& name,
                       int files, int64_t align, int64_t grow_bytes, bool verify_checksums) {
             SwapStoreConfig c{nvme_path, rank, name, files, align, grow_bytes, verify_checksums};
             py::gil_scoped_release nogil;
             return std::make_unique<SwapStore>(c, e);
           }),
           py::arg("engine"), py::arg("nvme_path"), py::arg("rank") = 0, py::arg("name") = "swap",
           py::arg("files") = 4, py::arg("align") = 0, py::arg("grow_bytes") = int64_t{64} << 20,
           py::arg("verify_checksums") = false, py::keep_alive<1, 2>())
      .def("write", io(IoOp::kWrite), py::arg("id"), py::arg("ptr"), py::arg("nbytes"),
           py::arg("keepalive") = py::none())
      .def("read", io(IoOp::kRead), py::arg("id"), py::arg("ptr"), py::arg("nbytes"),
           py::arg("keepalive") = py::none())
      .def("free", &SwapStore::free, py::arg("id"), py::call_guard<py::gil_scoped_release>())
      .def("close", &SwapStore::close, py::call_guard<py::gil_scoped_release>(),
           "Waits for requests in flight, deletes the files and gives up the directory.")
      .def("contains", &SwapStore::contains, py::arg("id"))
      .def("bytes_needed", &SwapStore::bytes_needed, py::arg("sizes"))
      .def("free_bytes_on_disk", &SwapStore::free_bytes_on_disk)
      .def("size_of", &SwapStore::size_of, py::arg("id"))
      .def(
          "extent_of",
          [](const SwapStore& s, uint64_t id) {
            const Extent e = s.extent_of(id);
            return py::make_tuple(s.file_path(e.file), e.offset, e.bytes);
          },
          py::arg("id"))
      .def("stats", [](const SwapStore& s) { return store_stats(s.stats()); })
      .def_property_readonly("directory", &SwapStore::directory)
      .def("file_path", &SwapStore::file_path, py::arg("index"));
}

void bind_testing(py::module_& m) {
  m.def(
      "_set_io_fault", [](const std::string& spec) { set_io_fault(parse_fault_spec(spec)); },
      py::arg("spec"), "Test only: same syntax as ZS_IO_FAULT, e.g. '3:EIO', '2:short'");
  m.def("_clear_io_fault", &clear_io_fault);
  m.def("_io_faults_injected", &io_faults_injected);
  m.def("warnings_emitted", &warnings_emitted);
  m.def(
      "crc32c",
      [](uintptr_t ptr, int64_t nbytes, uint32_t crc) {
        ZS_CHECK_VALUE(nbytes >= 0, "crc32c: nbytes must be >= 0; got ", nbytes);
        return crc32c(reinterpret_cast<const void*>(ptr), static_cast<size_t>(nbytes), crc);
      },
      py::arg("ptr"), py::arg("nbytes"), py::arg("crc") = 0,
      py::call_guard<py::gil_scoped_release>(),
      "The swap store's checksum of nbytes at ptr (bench io times it)");
}

}  // namespace

void init_offload_bindings(pybind11::module_& m) {
  py::module_ sub = m.def_submodule("offload", "Offload I/O: host arena, io engine, swap store");
  register_errors(sub);
  bind_config(sub);
  bind_engine(sub);
  bind_arena(sub);
  bind_store(sub);
  bind_testing(sub);
}

}  // namespace zs::bindings
