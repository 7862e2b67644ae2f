// rope.cuh: rotary position embedding (plc_rope).
#ifndef PLC_ROPE_CUH
#define PLC_ROPE_CUH
#endif
