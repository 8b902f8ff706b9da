// cuBLAS, cuBLASLt and NCCL as the target answers them (docs/predict.md section 3): handles and
// descriptors are fresh handles (fakecuda.h F3), heuristics return one algorithm. cuBLAS's own
// workspace is allocated by PyTorch through its caching allocator and handed to
// cublasSetWorkspace: it is in the trace, and the ledger names it. A value the program reads back
// (a dot product to the host) is the placeholder, 0. cuDNN is NVIDIA's own, running on the fake
// driver (driver_static.cpp); cudnn/ holds a fake of it for where that cannot run.
#include "fakecuda.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace cachet::fakecuda {
namespace {
template <class T>
cublasStatus_t make_blas(T* out) {
  *out = reinterpret_cast<T>(new_handle());
  return CUBLAS_STATUS_SUCCESS;
}
}  // namespace
}  // namespace cachet::fakecuda

using namespace cachet::fakecuda;

extern "C" {

// ---- cuBLAS ----
cublasStatus_t cublasCreate_v2(cublasHandle_t* h) { return make_blas(h); }
cublasStatus_t cublasDestroy_v2(cublasHandle_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void* ws, size_t bytes) {
  char key[96];
  std::snprintf(key, sizeof key, "ws:%p:%p", static_cast<void*>(h), ws);
  ledger_once(key, "cublas_workspace\t" + std::to_string(reinterpret_cast<std::uintptr_t>(ws)) + "\t" +
                       std::to_string(bytes));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetMathMode(cublasHandle_t, cublasMath_t* m) { *m = CUBLAS_DEFAULT_MATH; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t, cublasPointerMode_t* m) { *m = CUBLAS_POINTER_MODE_HOST; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSdot_v2(cublasHandle_t, int, const float*, int, const float*, int, float* r) {
  if (!is_device_pointer(r)) *r = 0;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDdot_v2(cublasHandle_t, int, const double*, int, const double*, int, double* r) {
  if (!is_device_pointer(r)) *r = 0;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- cuBLASLt ----
// cuDNN's GEMM-based convolution engines open cuBLASLt themselves and look its functions up with
// dlsym; dlsym below hands them these, so that they rank and size their plans against this
// cuBLASLt as PyTorch's own calls do (docs/predict.md section 3).
size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }
cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) { return make_blas(h); }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t, cudaDataType_t) { return make_blas(d); }
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType, uint64_t, uint64_t, int64_t) { return make_blas(l); }
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) { return make_blas(p); }
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* returned) {
  if (requested < 1) { *returned = 0; return CUBLAS_STATUS_INVALID_VALUE; }
  std::memset(results, 0, sizeof *results);
  results->state = CUBLAS_STATUS_SUCCESS;
  results->workspaceSize = 0;  // it runs in the workspace PyTorch gave (in the trace)
  results->wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- NCCL (a process group on the fake device is not modelled: docs/predict.md section 5) ----
typedef int ncclResult_fake;
ncclResult_fake ncclGetVersion(int* v) { *v = 22907; return 0; }
const char* ncclGetErrorString(ncclResult_fake) { return "unhandled system error (cachet's fake CUDA device has no NCCL)"; }
const char* ncclGetLastError(void*) { return "cachet's fake CUDA device has no NCCL"; }
ncclResult_fake ncclGetUniqueId(void*) { return 2; }
ncclResult_fake ncclCommInitRank(void**, int, char[128], int) { return 2; }
ncclResult_fake ncclCommInitRankConfig(void**, int, char[128], int, void*) { return 2; }

// ---- cuSPARSE ----
const char* cusparseGetErrorString(int) { return "CUSPARSE_STATUS_SUCCESS"; }

// A cuBLASLt function looked up by name in NVIDIA's library (cuDNN does) resolves to the one above
// of that name; every other lookup is glibc's.
void* dlsym(void* handle, const char* name) {
  using Dlsym = void* (*)(void*, const char*);
  static const Dlsym real = [] {
    auto d = reinterpret_cast<Dlsym>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    return d ? d : reinterpret_cast<Dlsym>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
  }();
  void* found = real(handle, name);
  if (!found || !name || std::strncmp(name, "cublasLt", 8) != 0) return found;
  Dl_info self{}, there{};
  if (!dladdr(reinterpret_cast<void*>(&cublasLtGetVersion), &self) || !dladdr(found, &there)) return found;
  if (there.dli_fbase == self.dli_fbase) return found;
  void* own = real(RTLD_DEFAULT, name);
  if (own && dladdr(own, &there) && there.dli_fbase == self.dli_fbase) {
    ledger_once(std::string("lt:") + name, std::string("default\tcuBLASLt ") + name + " looked up by name: the fake's");
    return own;
  }
  return found;
}
}  // extern "C"
