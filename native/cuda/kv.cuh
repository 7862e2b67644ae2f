// kv.cuh: storing keys and values into a block KV cache (plc_store_kv).
#ifndef PLC_KV_CUH
#define PLC_KV_CUH

// plc_kv_supports reports whether caches (and full-attention keys and values) of type dt are
// handled: F32, F16 and BF16.
int plc_kv_supports(int dt);

#endif
