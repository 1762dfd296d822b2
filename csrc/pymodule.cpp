// An empty Python module so `import flashattn._C` loads the shared library and runs its
// TORCH_LIBRARY registrations. There is deliberately no pybind11 here: the library uses only
// the limited C API, which makes one abi3 wheel serve every CPython >= 3.10.
#include <Python.h>

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
