// sampling.cuh: token choice on the device (plc_argmax, plc_draw).
#ifndef PLC_SAMPLING_CUH
#define PLC_SAMPLING_CUH

#include "select.cuh"

#endif
