// Each op's binding file registers its torch-facing wrappers itself: FASTENC_BINDINGS(name) { m.def(...); }
// defines a binder and a static object that appends (name, binder) to one list at load; bindings.cpp's module
// definition walks the list (in name order), so adding an op's bindings is adding its file, nothing else.
// Pulls in ATen and torch's pybind11 type casters (lighter than torch/extension.h: each binding file compiles
// on its own).
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <utility>
#include <vector>

namespace fastenc_bind {

using Binder = void (*)(pybind11::module_&);

// Every registered (name, binder) of this module (defined in bindings.cpp). Hidden, and not inline: the cpu and
// cuda halves are two shared objects in one process, and an inline function's static would be one object
// (STB_GNU_UNIQUE) shared by both, giving each module the other's ops.
__attribute__((visibility("hidden"))) std::vector<std::pair<const char*, Binder>>& binders();

struct Registrar {
  Registrar(const char* name, Binder binder) { binders().emplace_back(name, binder); }
};

}  // namespace fastenc_bind

#define FASTENC_BINDINGS(name)                                                                      \
  static void fastenc_bind_##name(pybind11::module_& m);                                            \
  static const fastenc_bind::Registrar fastenc_registrar_##name(#name, &fastenc_bind_##name);       \
  static void fastenc_bind_##name(pybind11::module_& m)
