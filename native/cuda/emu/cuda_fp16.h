// cuda_fp16.h (emulation): __half and its conversions are in emu.h.
#include "emu.h"
