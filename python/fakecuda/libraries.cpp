// cuBLAS, cuBLASLt, cuDNN and NCCL as the target answers them (docs/predict.md section 3): handles and
// descriptors are fresh handles (fakecuda.h F3), heuristics return one algorithm, and the
// workspace a library asks PyTorch for is modelled here. cuBLAS's own workspace is allocated by
// PyTorch through its caching allocator and handed to cublasSetWorkspace: it is in the trace, and
// the ledger names it. cuDNN is driven through its v7 API (TORCH_CUDNN_V8_API_DISABLED=1, set by
// the capture): its algorithms report the workspace cudnn_workspace() gives (0 bytes unless
// CACHET_FAKE_CUDNN_WORKSPACE says otherwise, docs/predict.md section 3). A value the program
// reads back (a dot product to the host) is the placeholder, 0.
#include "fakecuda.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cudnn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace cachet::fakecuda {
namespace {
// What the descriptors say, kept for the workspace rule: bytes of a tensor or filter, and a
// convolution's kernel and strides.
struct Shape {
  std::size_t bytes = 0;
  std::size_t kernel = 1;  // filter: product of the spatial dimensions
};
struct Conv {
  bool unit_stride = true;
};
std::mutex desc_mu;
std::map<const void*, Shape> shapes;
std::map<const void*, Conv> convs;
std::size_t element_bytes(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_DOUBLE: case CUDNN_DATA_INT64: return 8;
    case CUDNN_DATA_HALF: case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_INT8: case CUDNN_DATA_UINT8: case CUDNN_DATA_BOOLEAN: return 1;
    default: return 4;
  }
}
void keep_shape(const void* d, cudnnDataType_t t, int n, const int* dims, bool filter) {
  Shape s;
  s.bytes = element_bytes(t);
  for (int i = 0; i < n; ++i) s.bytes *= static_cast<std::size_t>(dims[i] > 0 ? dims[i] : 1);
  if (filter)
    for (int i = 2; i < n; ++i) s.kernel *= static_cast<std::size_t>(dims[i] > 0 ? dims[i] : 1);
  std::lock_guard<std::mutex> g(desc_mu);
  shapes[d] = s;
}
Shape shape_of(const void* d) {
  std::lock_guard<std::mutex> g(desc_mu);
  auto it = shapes.find(d);
  return it == shapes.end() ? Shape{} : it->second;
}
bool unit_stride(const void* c) {
  std::lock_guard<std::mutex> g(desc_mu);
  auto it = convs.find(c);
  return it == convs.end() || it->second.unit_stride;
}
// The workspace a convolution asks for (docs/predict.md section 3). By default 0 bytes: cuDNN's
// heuristics are not modelled. CACHET_FAKE_CUDNN_WORKSPACE=BYTES gives every algorithm that many;
// CACHET_FAKE_CUDNN_WORKSPACE=model the rule below, read off ResNet-50's 3x3 convolutions on an
// H200 (cuDNN 9.19): a pointwise, unit-stride convolution 400 B; any other 2 x the input (the
// gradient's, for backward data) + the filter + 16 B. On the suite it made ResNet-50's peak
// reserved error worse (-5.98% against -5.12%, bench/predict/RESULTS.md), so it is not the default.
// `input` is x for the forward and the filter gradient, dy for the data gradient.
std::size_t cudnn_workspace(const void* input, const void* filter, const void* conv) {
  static const char* fixed = std::getenv("CACHET_FAKE_CUDNN_WORKSPACE");
  if (!fixed || !*fixed) return 0;
  if (std::strcmp(fixed, "model") != 0) return static_cast<std::size_t>(std::strtoull(fixed, nullptr, 10));
  const Shape w = shape_of(filter);
  if (w.kernel == 1 && unit_stride(conv)) return 400;
  return 2 * shape_of(input).bytes + w.bytes + 16;
}
std::size_t cudnn_version() {
  // The version the torch in this process was built against (the capture sets it), so that
  // torch.backends.cudnn's compatibility check passes.
  const char* v = std::getenv("CACHET_FAKE_CUDNN_VERSION");
  return v && *v ? static_cast<std::size_t>(std::strtoull(v, nullptr, 10)) : std::size_t{CUDNN_VERSION};
}
template <class Perf, class Algo>
void one_algorithm(int* returned, Perf* perf, Algo algo, std::size_t workspace) {
  *returned = 1;
  std::memset(perf, 0, sizeof *perf);
  perf->algo = algo;
  perf->status = CUDNN_STATUS_SUCCESS;
  perf->time = 1.0f;
  perf->memory = workspace;
  perf->determinism = CUDNN_DETERMINISTIC;
  perf->mathType = CUDNN_DEFAULT_MATH;
}
template <class T>
cudnnStatus_t make(T* out) {
  *out = reinterpret_cast<T>(new_handle());
  return CUDNN_STATUS_SUCCESS;
}
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
size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }
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

// ---- cuDNN ----
size_t cudnnGetVersion(void) { return cudnn_version(); }
size_t cudnnGetCudartVersion(void) { return CUDART_VERSION; }
cudnnStatus_t cudnnGetProperty(libraryPropertyType type, int* value) {
  std::size_t v = cudnn_version();
  *value = type == MAJOR_VERSION ? static_cast<int>(v / 10000)
                                 : type == MINOR_VERSION ? static_cast<int>(v / 100 % 100) : static_cast<int>(v % 100);
  return CUDNN_STATUS_SUCCESS;
}
const char* cudnnGetErrorString(cudnnStatus_t s) {
  return s == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS" : "CUDNN_STATUS_NOT_SUPPORTED (cachet's fake CUDA device)";
}
void cudnnGetLastErrorString(char* message, const size_t max) {
  if (message && max) message[0] = '\0';
}
cudnnStatus_t cudnnCreate(cudnnHandle_t* h) { return make(h); }
cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t d, cudnnDataType_t t, int n, const int* dims, const int*) {
  keep_shape(d, t, n, dims, false);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t, cudnnTensorFormat_t, int n, const int* dims) {
  keep_shape(d, t, n, dims, true);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionNdDescriptor(cudnnConvolutionDescriptor_t d, int n, const int*, const int* strides, const int*,
                                              cudnnConvolutionMode_t, cudnnDataType_t) {
  Conv c;
  for (int i = 0; i < n; ++i) c.unit_stride = c.unit_stride && strides[i] == 1;
  std::lock_guard<std::mutex> g(desc_mu);
  convs[d] = c;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetStream(cudnnHandle_t, cudaStream_t* s) { *s = nullptr; return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* d) { return make(d); }
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* d) { return make(d); }
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* d) { return make(d); }
cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t* d) { return make(d); }
cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t* d) { return make(d); }
cudnnStatus_t cudnnCreateDropoutDescriptor(cudnnDropoutDescriptor_t* d) { return make(d); }
cudnnStatus_t cudnnCreateRNNDescriptor(cudnnRNNDescriptor_t* d) { return make(d); }
cudnnStatus_t cudnnCreateRNNDataDescriptor(cudnnRNNDataDescriptor_t* d) { return make(d); }
cudnnStatus_t cudnnCreateCTCLossDescriptor(cudnnCTCLossDescriptor_t* d) { return make(d); }
cudnnStatus_t cudnnCreateSpatialTransformerDescriptor(cudnnSpatialTransformerDescriptor_t* d) { return make(d); }
cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t* d) { return make(d); }
// The v8 graph API is not modelled: finalizing a graph says so, and PyTorch takes another path.
cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t) {
  ledger_once("cudnn_v8", "default\tcuDNN's graph API (v8) answered NOT_SUPPORTED");
  return CUDNN_STATUS_NOT_SUPPORTED;
}
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
                                                     const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t, const int,
                                                     int* returned, cudnnConvolutionFwdAlgoPerf_t* perf) {
  one_algorithm(returned, perf, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, cudnn_workspace(x, w, c));
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t, const cudnnTensorDescriptor_t x, const void*,
                                                     const cudnnFilterDescriptor_t w, const void*, const cudnnConvolutionDescriptor_t c,
                                                     const cudnnTensorDescriptor_t, void*, const int, int* returned,
                                                     cudnnConvolutionFwdAlgoPerf_t* perf, void*, size_t) {
  one_algorithm(returned, perf, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, cudnn_workspace(x, w, c));
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
                                                          const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t, const int,
                                                          int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  one_algorithm(returned, perf, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, cudnn_workspace(dy, w, c));
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t, const cudnnFilterDescriptor_t w, const void*,
                                                          const cudnnTensorDescriptor_t dy, const void*, const cudnnConvolutionDescriptor_t c,
                                                          const cudnnTensorDescriptor_t, void*, const int, int* returned,
                                                          cudnnConvolutionBwdDataAlgoPerf_t* perf, void*, size_t) {
  one_algorithm(returned, perf, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, cudnn_workspace(dy, w, c));
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t,
                                                            const cudnnConvolutionDescriptor_t c, const cudnnFilterDescriptor_t dw, const int,
                                                            int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  one_algorithm(returned, perf, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, cudnn_workspace(x, dw, c));
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t, const cudnnTensorDescriptor_t x, const void*,
                                                            const cudnnTensorDescriptor_t, const void*, const cudnnConvolutionDescriptor_t c,
                                                            const cudnnFilterDescriptor_t dw, void*, const int, int* returned,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* perf, void*, size_t) {
  one_algorithm(returned, perf, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, cudnn_workspace(x, dw, c));
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
                                                      const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t,
                                                      cudnnConvolutionFwdAlgo_t, size_t* size) {
  *size = cudnn_workspace(x, w, c);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
                                                           const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t,
                                                           cudnnConvolutionBwdDataAlgo_t, size_t* size) {
  *size = cudnn_workspace(dy, w, c);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t,
                                                             const cudnnConvolutionDescriptor_t c, const cudnnFilterDescriptor_t dw,
                                                             cudnnConvolutionBwdFilterAlgo_t, size_t* size) {
  *size = cudnn_workspace(x, dw, c);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t,
                                                                       const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                                                       const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                                                       const cudnnActivationDescriptor_t, size_t* size) {
  *size = 0;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetBatchNormalizationBackwardExWorkspaceSize(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t,
                                                                const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                                                const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                                                const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                                                const cudnnActivationDescriptor_t, size_t* size) {
  *size = 0;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t,
                                                                   const cudnnActivationDescriptor_t, const cudnnTensorDescriptor_t,
                                                                   size_t* size) {
  *size = 0;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDropoutGetStatesSize(cudnnHandle_t, size_t* size) { *size = 0; return CUDNN_STATUS_SUCCESS; }

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

}  // extern "C"
