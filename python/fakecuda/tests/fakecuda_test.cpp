// The fake CUDA device answers what PyTorch reads, for a target given by CACHET_FAKE_* (this
// test's ctest environment: an "NVIDIA L4", sm_89, 58 SMs, 1 GiB of which 100 MiB are outside the
// allocator). The program links the real libcudart: the preloaded fake must win every call.
#include <cuda_runtime_api.h>
#include <cublasLt.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace {
constexpr size_t kMiB = 1 << 20;
template <class F>
F fake(const char* name) {
  void* p = dlsym(RTLD_DEFAULT, name);
  EXPECT_NE(p, nullptr) << name;
  return reinterpret_cast<F>(p);
}
}  // namespace

TEST(FakeCuda, IsTheTargetDevice) {
  int n = -1;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  EXPECT_EQ(n, 1);
  cudaDeviceProp p;
  ASSERT_EQ(cudaGetDeviceProperties(&p, 0), cudaSuccess);
  EXPECT_STREQ(p.name, "NVIDIA L4");
  EXPECT_EQ(p.major, 8);
  EXPECT_EQ(p.minor, 9);
  EXPECT_EQ(p.multiProcessorCount, 58);
  EXPECT_EQ(p.totalGlobalMem, 1073741824u);
  int v = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  EXPECT_EQ(v, 58);
  EXPECT_EQ(cudaSetDevice(1), cudaErrorInvalidDevice);
}

TEST(FakeCuda, MemoryRunsOutWhereTheTargetWould) {
  size_t free_b = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total), cudaSuccess);
  EXPECT_EQ(total, 1073741824u);
  EXPECT_EQ(free_b, 1073741824u - 100 * kMiB);
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 600 * kMiB), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&b, 400 * kMiB), cudaErrorMemoryAllocation);  // 600 + 400 + 100 > 1024
  ASSERT_EQ(cudaMalloc(&c, 300 * kMiB), cudaSuccess);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % (2 * kMiB), 0u);
  EXPECT_NE(a, c);
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total), cudaSuccess);
  EXPECT_EQ(free_b, 1073741824u - 1000 * kMiB);
  cudaPointerAttributes attr;
  ASSERT_EQ(cudaPointerGetAttributes(&attr, c), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  ASSERT_EQ(cudaFree(a), cudaSuccess);
  ASSERT_EQ(cudaFree(c), cudaSuccess);
  EXPECT_EQ(cudaFree(c), cudaErrorInvalidValue);
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total), cudaSuccess);
  EXPECT_EQ(free_b, 1073741824u - 100 * kMiB);
}

TEST(FakeCuda, CopiesToTheHostReadThePlaceholder) {
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4096), cudaSuccess);
  std::vector<unsigned char> h(64, 0xab);
  ASSERT_EQ(cudaMemcpy(h.data(), d, h.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (unsigned char x : h) EXPECT_EQ(x, 0);
  std::vector<unsigned char> src(64, 7), dst(64, 0);
  ASSERT_EQ(cudaMemcpy(dst.data(), src.data(), 64, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(dst[63], 7);
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, 1 << 16, 0), cudaSuccess);
  std::memset(pinned, 1, 1 << 16);  // real host memory
  cudaPointerAttributes attr;
  ASSERT_EQ(cudaPointerGetAttributes(&attr, static_cast<char*>(pinned) + 100), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  ASSERT_EQ(cudaFreeHost(pinned), cudaSuccess);
  ASSERT_EQ(cudaFree(d), cudaSuccess);
}

TEST(FakeCuda, GraphCaptureState) {
  cudaStream_t s = nullptr, t = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&t), cudaSuccess);
  EXPECT_NE(s, t);
  EXPECT_NE(s, nullptr);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureStatus st;
  unsigned long long id = 0;
  ASSERT_EQ(cudaStreamGetCaptureInfo(s, &st, &id, nullptr, nullptr, nullptr, nullptr), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusActive);
  EXPECT_NE(id, 0u);
  ASSERT_EQ(cudaStreamIsCapturing(t, &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusNone);
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  EXPECT_NE(g, nullptr);
  ASSERT_EQ(cudaStreamIsCapturing(s, &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusNone);
  EXPECT_EQ(cudaEventQuery(nullptr), cudaSuccess);
}

TEST(FakeCuda, LibrariesAnswerOneAlgorithm) {
  using Heur = cublasStatus_t (*)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                  cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                  cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t*, int*);
  cublasLtMatmulHeuristicResult_t r[4];
  std::memset(r, 0xff, sizeof r);
  int returned = -1;
  ASSERT_EQ(fake<Heur>("cublasLtMatmulAlgoGetHeuristic")(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                         nullptr, 4, r, &returned), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(returned, 1);
  EXPECT_EQ(r[0].state, CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(r[0].workspaceSize, 0u);
  using Fwd = cudnnStatus_t (*)(cudnnHandle_t, const cudnnTensorDescriptor_t, const cudnnFilterDescriptor_t,
                                const cudnnConvolutionDescriptor_t, const cudnnTensorDescriptor_t, const int, int*,
                                cudnnConvolutionFwdAlgoPerf_t*);
  using MakeT = cudnnStatus_t (*)(cudnnTensorDescriptor_t*);
  using MakeF = cudnnStatus_t (*)(cudnnFilterDescriptor_t*);
  using MakeC = cudnnStatus_t (*)(cudnnConvolutionDescriptor_t*);
  using SetT = cudnnStatus_t (*)(cudnnTensorDescriptor_t, cudnnDataType_t, int, const int*, const int*);
  using SetF = cudnnStatus_t (*)(cudnnFilterDescriptor_t, cudnnDataType_t, cudnnTensorFormat_t, int, const int*);
  using SetC = cudnnStatus_t (*)(cudnnConvolutionDescriptor_t, int, const int*, const int*, const int*,
                                 cudnnConvolutionMode_t, cudnnDataType_t);
  cudnnTensorDescriptor_t x = nullptr;
  cudnnFilterDescriptor_t w3 = nullptr, w1 = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  fake<MakeT>("cudnnCreateTensorDescriptor")(&x);
  fake<MakeF>("cudnnCreateFilterDescriptor")(&w3);
  fake<MakeF>("cudnnCreateFilterDescriptor")(&w1);
  fake<MakeC>("cudnnCreateConvolutionDescriptor")(&conv);
  EXPECT_NE(static_cast<void*>(w3), static_cast<void*>(w1));
  const int xd[4] = {2, 8, 16, 16}, xs[4] = {2048, 256, 16, 1}, w3d[4] = {8, 8, 3, 3}, w1d[4] = {8, 8, 1, 1};
  const int pad[2] = {1, 1}, stride[2] = {1, 1}, dil[2] = {1, 1};
  fake<SetT>("cudnnSetTensorNdDescriptor")(x, CUDNN_DATA_FLOAT, 4, xd, xs);
  fake<SetF>("cudnnSetFilterNdDescriptor")(w3, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 4, w3d);
  fake<SetF>("cudnnSetFilterNdDescriptor")(w1, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 4, w1d);
  fake<SetC>("cudnnSetConvolutionNdDescriptor")(conv, 2, pad, stride, dil, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
  cudnnConvolutionFwdAlgoPerf_t perf[3];
  returned = -1;
  ASSERT_EQ(fake<Fwd>("cudnnGetConvolutionForwardAlgorithm_v7")(nullptr, x, w3, conv, nullptr, 3, &returned, perf),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(returned, 1);
  EXPECT_EQ(perf[0].status, CUDNN_STATUS_SUCCESS);
  // 3x3: 2 x the input (2*8*16*16*4 B) + the filter (8*8*3*3*4 B) + 16 B (docs/predict.md section 3).
  EXPECT_EQ(perf[0].memory, 2u * 16384u + 2304u + 16u);
  ASSERT_EQ(fake<Fwd>("cudnnGetConvolutionForwardAlgorithm_v7")(nullptr, x, w1, conv, nullptr, 3, &returned, perf),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(perf[0].memory, 400u);  // pointwise, unit stride
  using Version = size_t (*)();
  EXPECT_EQ(fake<Version>("cudnnGetVersion")(), static_cast<size_t>(CUDNN_VERSION));
  // A function answered by the generated stubs: success, nothing else.
  using Generic = long (*)();
  EXPECT_EQ(fake<Generic>("cusparseCreate")(), 0);
}
