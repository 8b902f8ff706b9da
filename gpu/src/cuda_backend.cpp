// CUDA backends (compiled only when CACHET_HAVE_CUDA).
