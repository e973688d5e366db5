#include "jit/nvrtc.h"

#include <dlfcn.h>
#include <nvrtc.h>

#include "ditops/tensor.h"

namespace ditops::jit {

namespace {

struct Nvrtc {
  decltype(&::nvrtcVersion) version = nullptr;
  decltype(&::nvrtcCreateProgram) create = nullptr;
  decltype(&::nvrtcCompileProgram) compile = nullptr;
  decltype(&::nvrtcGetProgramLogSize) log_size = nullptr;
  decltype(&::nvrtcGetProgramLog) log = nullptr;
  decltype(&::nvrtcGetCUBINSize) cubin_size = nullptr;
  decltype(&::nvrtcGetCUBIN) cubin = nullptr;
  decltype(&::nvrtcDestroyProgram) destroy = nullptr;
  decltype(&::nvrtcGetErrorString) error_string = nullptr;
  int packed_version = 0;
  std::string why;
};

const Nvrtc& nvrtc() {
  static const Nvrtc* loaded = [] {
    auto* n = new Nvrtc();
    void* lib = nullptr;
    for (const char* name : {"libnvrtc.so.13", "libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so.13"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
    }
    if (!lib) {
      n->why = "NVRTC unavailable: libnvrtc.so.13 could not be loaded";
      return n;
    }
    auto load = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      if (!fn && n->why.empty()) n->why = std::string("NVRTC unavailable: missing ") + symbol;
    };
    load(n->version, "nvrtcVersion");
    load(n->create, "nvrtcCreateProgram");
    load(n->compile, "nvrtcCompileProgram");
    load(n->log_size, "nvrtcGetProgramLogSize");
    load(n->log, "nvrtcGetProgramLog");
    load(n->cubin_size, "nvrtcGetCUBINSize");
    load(n->cubin, "nvrtcGetCUBIN");
    load(n->destroy, "nvrtcDestroyProgram");
    load(n->error_string, "nvrtcGetErrorString");
    if (!n->why.empty()) return n;
    int major = 0, minor = 0;
    n->version(&major, &minor);
    n->packed_version = major * 1000 + minor * 10;
    return n;
  }();
  return *loaded;
}

}  // namespace

int nvrtc_version(std::string* why) {
  const Nvrtc& n = nvrtc();
  if (!n.why.empty() && why) *why = n.why;
  return n.why.empty() ? n.packed_version : 0;
}

std::vector<uint8_t> nvrtc_compile(const std::string& source, const std::string& program_name,
                                   const std::string& arch, const std::vector<SourceFile>& headers,
                                   const std::vector<std::string>& extra_options) {
  const Nvrtc& n = nvrtc();
  if (!n.why.empty()) throw Error(n.why);
  std::vector<const char*> header_sources, header_names;
  for (const auto& h : headers) {
    header_sources.push_back(h.contents.c_str());
    header_names.push_back(h.name.c_str());
  }
  nvrtcProgram program = nullptr;
  nvrtcResult r = n.create(&program, source.c_str(), program_name.c_str(),
                           static_cast<int>(headers.size()), header_sources.data(),
                           header_names.data());
  if (r != NVRTC_SUCCESS)
    throw Error("nvrtcCreateProgram(" + program_name + "): " + n.error_string(r));
  // Exact IEEE division and sqrt, no flush-to-zero, FMA contraction on (nvcc's defaults, which
  // the bit-exact contracts are written against).
  std::vector<std::string> options = {"--gpu-architecture=" + arch, "-std=c++17",
                                      "--fmad=true", "--ftz=false", "--prec-div=true",
                                      "--prec-sqrt=true", "-DDITOPS_NVRTC=1"};
  options.insert(options.end(), extra_options.begin(), extra_options.end());
  std::vector<const char*> option_ptrs;
  for (const auto& o : options) option_ptrs.push_back(o.c_str());
  r = n.compile(program, static_cast<int>(option_ptrs.size()), option_ptrs.data());
  if (r != NVRTC_SUCCESS) {
    size_t log_size = 0;
    n.log_size(program, &log_size);
    std::string log(log_size, '\0');
    if (log_size) n.log(program, log.data());
    n.destroy(&program);
    throw Error("NVRTC failed to compile " + program_name + " for " + arch + " (" +
                n.error_string(r) + "):\n" + log);
  }
  size_t size = 0;
  n.cubin_size(program, &size);
  std::vector<uint8_t> cubin(size);
  n.cubin(program, reinterpret_cast<char*>(cubin.data()));
  n.destroy(&program);
  return cubin;
}

}  // namespace ditops::jit
