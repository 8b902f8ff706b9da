// A fake cuDNN, libcachet_fakecudnn.so: preloaded after libcachet_fakecuda.so only where NVIDIA's
// own cuDNN cannot run on the fake device (CACHET_FAKE_CUDNN=fake; docs/predict.md section 3).
// cuDNN is then driven through its v7 API (TORCH_CUDNN_V8_API_DISABLED=1, set by the capture):
// its algorithms report the workspace cudnn_workspace() gives (0 bytes unless
// CACHET_FAKE_CUDNN_WORKSPACE says otherwise). Handles and descriptors are fresh handles
// (fakecuda.h F3).
#include "../fakecuda.h"

#include <cudnn.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

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
}  // namespace
}  // namespace cachet::fakecuda

using namespace cachet::fakecuda;

extern "C" {

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

}  // extern "C"
