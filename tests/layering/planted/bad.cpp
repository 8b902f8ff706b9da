// A planted layering violation: gpu_layering_detects_violation_test runs the layering check
// over this folder and must fail. Never compiled.
#include "cachet/model/allocator.h"
