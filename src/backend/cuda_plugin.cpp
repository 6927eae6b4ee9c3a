// Loading the CUDA backend plugin (include/shardbench/backend/cuda_plugin.h).
#include "shardbench/backend/cuda_plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <mutex>
#include <string>

#include "shardbench/core/check.h"

// Defined where the CUDA objects are linked in (test_cuda_backend); null elsewhere.
extern "C" sb::Backend* sb_cuda_backend_new(int comm) __attribute__((weak));
extern "C" void sb_cuda_library_versions(int* cudart, int* nccl) __attribute__((weak));

namespace sb {

namespace {
using Factory = Backend* (*)(int);
using Versions = void (*)(int*, int*);
struct Plugin {
  Factory make = nullptr;
  Versions versions = nullptr;
};
Plugin loaded;  // what make_cuda_backend found; empty until then

// The plugin beside the program: <dir of the executable>/../lib/libshardbench_cuda.so, in the
// build tree (build/bin, build/lib) and in an installation (PREFIX/bin, PREFIX/lib) alike.
std::string plugin_path() {
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  const std::string path = n > 0 ? std::string(exe, size_t(n)) : std::string();
  const size_t slash = path.rfind('/');
  return (slash == std::string::npos ? std::string(".") : path.substr(0, slash)) + "/../lib/libshardbench_cuda.so";
}

Plugin load() {
  if (sb_cuda_backend_new) return {sb_cuda_backend_new, sb_cuda_library_versions};
  const std::string path = plugin_path();
  // RTLD_NOW: a symbol missing from this program or a library missing on this host is said
  // here, with the loader's words, not at the first call into it.
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) SB_FATAL("--backend cuda: cannot load the CUDA backend " + path + ": " + dlerror());
  Plugin p{reinterpret_cast<Factory>(dlsym(h, "sb_cuda_backend_new")),
           reinterpret_cast<Versions>(dlsym(h, "sb_cuda_library_versions"))};
  if (!p.make || !p.versions) SB_FATAL("--backend cuda: " + path + " is not this build's CUDA backend (no entry points)");
  return p;  // never closed: the backend's code and kernels live there until the process ends
}
}  // namespace

std::unique_ptr<Backend> make_cuda_backend(CommLibrary comm) {
  static std::once_flag once;
  std::call_once(once, [] { loaded = load(); });
  return std::unique_ptr<Backend>(loaded.make(int(comm)));
}

bool cuda_library_versions(int& cudart, int& nccl) {
  if (!loaded.versions) return false;
  loaded.versions(&cudart, &nccl);
  return true;
}

}  // namespace sb
