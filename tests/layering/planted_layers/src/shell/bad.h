// A planted include across gpu/src's layers (shell/ must not include api/):
// gpu_layering_detects_layer_violation_test runs the layering check over this folder and must
// fail. Never compiled.
#include "api/policy_core.h"
