// norm.cuh: row normalisations (plc_rms_norm, plc_layer_norm).
#ifndef PLC_NORM_CUH
#define PLC_NORM_CUH

// Threads per row of a normalisation.
#define PLC_NORM_THREADS 256

#endif
