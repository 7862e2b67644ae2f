// codec.cuh: the operations of streaming codecs and flow-matching heads (plc_mul).
#ifndef PLC_CODEC_CUH
#define PLC_CODEC_CUH

#include "internal.cuh"

#endif
