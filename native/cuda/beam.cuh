// beam.cuh: one step of beam search on the device (plc_beam_step).
#ifndef PLC_BEAM_CUH
#define PLC_BEAM_CUH

#include "select.cuh"

// Largest beams*k one step ranks (the candidates are sorted in one block's shared memory).
#define PLC_BEAM_MAX_CAND 4096

#endif
