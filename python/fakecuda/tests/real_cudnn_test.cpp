// NVIDIA's cuDNN on the fake device (docs/predict.md section 3): cuDNN links its own CUDA runtime,
// which reaches the fake driver through cuGetProcAddress and cuGetExportTable (driver_static.cpp,
// export_tables.cpp). Run with only libcachet_fakecuda.so preloaded and the H200 as the target,
// cuDNN must start and its heuristics must ask for the workspace the H200 asked for: 122,065,680
// bytes for ResNet-50's first convolution at batch 32 in fp32, the first allocation of
// torchvision's ResNet-50 forward that the fake cuDNN missed (bench/predict/RESULTS.md, recorded
// on the H200 with cuDNN 9.19). Skipped (77) where this cuDNN is not 9.19.
#include <cudnn.h>
#include <gtest/gtest.h>

#include <cstdlib>

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
}  // namespace
