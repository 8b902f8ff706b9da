// bench/torch_check_main.cpp: the configure-time check of the PyTorch peer (bench/CMakeLists.txt
// try_compile): torch_peer.cpp must compile and link against the given torch. Never run.
#include "peers.h"

int main(int argc, char**) {
  std::string why;
  if (argc > 100) return cachet::bench::torch_peer(&why) != nullptr ? 0 : 1;
  return 0;
}
