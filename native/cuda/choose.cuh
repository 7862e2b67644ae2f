// choose.cuh: a decoder's filtered top-k tokens chosen on the device (plc_choose).
#ifndef PLC_CHOOSE_CUH
#define PLC_CHOOSE_CUH

#include "select.cuh"

// Most tokens plc_choose reports a row.
#define PLC_CHOOSE_MAX_K 64
// Largest vocabulary plc_choose takes: a row's dropped ids are a bitmap in shared memory (40 KiB
// of it, under the 48 KiB a block has without asking, with the selection's own).
#define PLC_CHOOSE_MAX_VOCAB (40 * 1024 * 8)

#endif
