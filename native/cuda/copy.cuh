// copy.cuh: type conversions between float buffers (plc_copy).
#ifndef PLC_COPY_CUH
#define PLC_COPY_CUH

// plc_copy_supports reports whether plc_copy reads or writes type dt (F32, F16, BF16; BF16 only
// to BF16).
int plc_copy_supports(int dt);

#endif
