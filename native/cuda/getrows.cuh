// getrows.cuh: row gathers (plc_get_rows).
#ifndef PLC_GETROWS_CUH
#define PLC_GETROWS_CUH

// plc_get_rows_supports reports whether plc_get_rows reads tables of type dt.
int plc_get_rows_supports(int dt);

#endif
