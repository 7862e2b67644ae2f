// cuda_bf16.h (emulation): __nv_bfloat16 and its conversions are in emu.h.
#include "emu.h"
