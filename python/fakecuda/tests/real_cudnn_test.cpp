// NVIDIA's cuDNN on the fake device (docs/predict.md section 3): cuDNN links its own CUDA runtime,
// which reaches the fake driver through cuGetProcAddress and cuGetExportTable (driver_static.cpp,
// export_tables.cpp). Run with only libcachet_fakecuda.so preloaded and the H200 as the target,
// cuDNN must start and its heuristics must ask for the workspace the H200 asked for: 122,065,680
// bytes for ResNet-50's first convolution at batch 32 in fp32, the first allocation of
// torchvision's ResNet-50 forward that the fake cuDNN missed (bench/predict/RESULTS.md, recorded
// on the H200 with cuDNN 9.19). Skipped (77) where this cuDNN is not 9.19.
//
// The other two cases hold what the H200 answered in the fp16 EfficientNet-B0 of bench/predict
// (CUDNN_LOGLEVEL_DBG=3 and a driver-call log of the native run, 2026-12-02): cuDNN's heuristics
// give 40 engine configurations for the squeeze-excitation 1x1 convolution 32->8 at batch 48, the
// first of them engine 58, which runs on cuBLASLt; and cuDNN's hardware detection reads the H200's
// cluster occupancy.
#include <cuda.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace {
#define CUDNN_OK(x) ASSERT_EQ((x), CUDNN_STATUS_SUCCESS) << #x
TEST(RealCudnn, StartsOnTheFakeDriverAndAsksTheH200sWorkspace) {
  if (cudnnGetVersion() / 100 != 919) GTEST_SKIP() << "cuDNN " << cudnnGetVersion() << " is not 9.19";
  cudnnHandle_t h = nullptr;
  CUDNN_OK(cudnnCreate(&h));
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t c;
  CUDNN_OK(cudnnCreateTensorDescriptor(&x));
  CUDNN_OK(cudnnCreateTensorDescriptor(&y));
  CUDNN_OK(cudnnCreateFilterDescriptor(&w));
  CUDNN_OK(cudnnCreateConvolutionDescriptor(&c));
  CUDNN_OK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 32, 3, 224, 224));
  CUDNN_OK(cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 64, 3, 7, 7));
  CUDNN_OK(cudnnSetConvolution2dDescriptor(c, 3, 3, 2, 2, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUDNN_OK(cudnnSetConvolutionMathType(c, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION));
  int n = 0, k = 0, hh = 0, ww = 0;
  CUDNN_OK(cudnnGetConvolution2dForwardOutputDim(c, x, w, &n, &k, &hh, &ww));
  ASSERT_EQ(hh, 112);
  CUDNN_OK(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, k, hh, ww));
  cudnnConvolutionFwdAlgoPerf_t perf[8];
  int returned = 0;
  CUDNN_OK(cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, c, y, 8, &returned, perf));
  ASSERT_GE(returned, 1);
  EXPECT_EQ(perf[0].status, CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(perf[0].memory, 122065680u);
  CUDNN_OK(cudnnDestroy(h));
}

using D = cudnnBackendDescriptor_t;
D tensor(std::int64_t id, std::vector<std::int64_t> dims, std::vector<std::int64_t> strides) {
  D d = nullptr;
  cudnnDataType_t t = CUDNN_DATA_HALF;
  std::int64_t align = 16;
  EXPECT_EQ(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &d), CUDNN_STATUS_SUCCESS);
  cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &t);
  cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id);
  cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  EXPECT_EQ(cudnnBackendFinalize(d), CUDNN_STATUS_SUCCESS);
  return d;
}

TEST(RealCudnn, RanksTheCublasLtEngineFirstForA1x1ConvolutionAsTheH200) {
  if (cudnnGetVersion() / 100 != 919) GTEST_SKIP() << "cuDNN " << cudnnGetVersion() << " is not 9.19";
  cudnnHandle_t h = nullptr;
  CUDNN_OK(cudnnCreate(&h));
  D x = tensor('x', {48, 32, 1, 1}, {32, 1, 1, 1}), w = tensor('w', {8, 32, 1, 1}, {32, 1, 1, 1}),
    y = tensor('y', {48, 8, 1, 1}, {8, 1, 1, 1});
  D conv = nullptr, op = nullptr, graph = nullptr, heur = nullptr;
  CUDNN_OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &conv));
  std::int64_t dims = 2;
  std::vector<std::int64_t> one = {1, 1}, zero = {0, 0};
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims);
  cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, one.data());
  cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, one.data());
  cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, zero.data());
  cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, zero.data());
  CUDNN_OK(cudnnBackendFinalize(conv));
  CUDNN_OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, &op));
  float alpha = 1, beta = 0;
  cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
  cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv);
  cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
  cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  CUDNN_OK(cudnnBackendFinalize(op));
  CUDNN_OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph));
  cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op);
  cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  CUDNN_OK(cudnnBackendFinalize(graph));
  CUDNN_OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
  cudnnBackendHeurMode_t instant = CUDNN_HEUR_MODE_INSTANT;  // PyTorch's (Conv_v8.cpp)
  cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
  cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &instant);
  CUDNN_OK(cudnnBackendFinalize(heur));
  std::int64_t n = 0;
  CUDNN_OK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr));
  EXPECT_EQ(n, 40);
  ASSERT_GE(n, 1);
  std::vector<D> configs(static_cast<std::size_t>(n));
  for (D& c : configs) cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &c);
  CUDNN_OK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &n, configs.data()));
  D engine = nullptr;
  std::int64_t count = 0, index = -1;
  cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine);
  CUDNN_OK(cudnnBackendGetAttribute(configs[0], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &engine));
  CUDNN_OK(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count, &index));
  EXPECT_EQ(index, 58);
  CUDNN_OK(cudnnDestroy(h));
}

TEST(RealCudnn, ClusterOccupancyIsTheH200s) {
  using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get = reinterpret_cast<GetProc>(dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2"));
  if (!get) get = reinterpret_cast<GetProc>(dlsym(RTLD_DEFAULT, "cuGetProcAddress"));
  ASSERT_NE(get, nullptr) << "the fake driver is not preloaded";
  using Clusters = CUresult (*)(int*, CUfunction, const CUlaunchConfig*);
  void* fn = nullptr;
  CUdriverProcAddressQueryResult q{};
  ASSERT_EQ(get("cuOccupancyMaxActiveClusters", &fn, 12000, 0, &q), CUDA_SUCCESS);
  ASSERT_NE(fn, nullptr);
  // cuDNN's hardware-detection launch: 128 threads, all of the opt-in shared memory, n blocks.
  const int expected[][2] = {{1, 132}, {2, 66}, {3, 39}, {8, 15}, {9, 9}, {16, 7}, {17, 2}, {18, 2}, {19, 0}};
  for (const auto& [blocks, clusters] : expected) {
    CUlaunchAttribute a{};
    a.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    a.value.clusterDim.x = static_cast<unsigned>(blocks);
    a.value.clusterDim.y = a.value.clusterDim.z = 1;
    CUlaunchConfig c{};
    c.gridDimX = static_cast<unsigned>(blocks);
    c.gridDimY = c.gridDimZ = 1;
    c.blockDimX = 128;
    c.blockDimY = c.blockDimZ = 1;
    c.sharedMemBytes = 232448;
    c.attrs = &a;
    c.numAttrs = 1;
    int n = -1;
    ASSERT_EQ(reinterpret_cast<Clusters>(fn)(&n, nullptr, &c), CUDA_SUCCESS);
    EXPECT_EQ(n, clusters) << blocks << " blocks a cluster";
  }
}
}  // namespace
