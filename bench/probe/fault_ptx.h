/* A kernel that stores to the address it is given, as PTX the driver
 * compiles (no nvcc needed): given one no allocation covers, it leaves the
 * device a sticky error. Shared by the sticky-error probes and
 * tests/test_sticky_error.c. */
#ifndef PINMEM_FAULT_PTX_H
#define PINMEM_FAULT_PTX_H

static const char fault_ptx[] = ".version 7.0\n"
                                ".target sm_75\n"
                                ".address_size 64\n"
                                ".visible .entry store_one(.param .u64 where)\n"
                                "{\n"
                                "  .reg .u64 %rd<2>;\n"
                                "  .reg .u32 %r<2>;\n"
                                "  ld.param.u64 %rd1, [where];\n"
                                "  mov.u32 %r1, 1;\n"
                                "  st.global.u32 [%rd1], %r1;\n"
                                "  ret;\n"
                                "}\n";

#endif
