/* The batch kernel: one launch moves a list of blocks between device memory
 * and page-locked host memory, where a DMA each would pay the DMA engine's
 * cost per DMA (docs/design.md, "Batches"). Its PTX is embedded (source:
 * cuda_kernel.cu), so the build needs no CUDA compiler; the driver compiles
 * it on first use. The module is loaded once, into the primary context of
 * pinmem's device, and kept for the process's life, as that context is: the
 * kernel runs only there (cuda.c checks the context of each launch). */
#include "cuda_kernel.h"

#include <pthread.h>

#include "../options.h"
#include "block_parts.h"

static const char ptx[] =
    ".version 8.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry pm_block_copy(\n"
    "    .param .u64 pm_block_copy_param_0,\n"
    "    .param .u64 pm_block_copy_param_1,\n"
    "    .param .u32 pm_block_copy_param_2\n"
    ")\n"
    ".maxntid 256, 1, 1\n"
    "{\n"
    "    .reg .pred     %p<26>;\n"
    "    .reg .b16     %rs<8>;\n"
    "    .reg .b32     %r<69>;\n"
    "    .reg .b64     %rd<191>;\n"
    "    .shared .align 8 .u64 _ZZ13pm_block_copyE3dst;\n"
    "    .shared .align 8 .u64 _ZZ13pm_block_copyE3src;\n"
    "    .shared .align 8 .u64 _ZZ13pm_block_copyE5bytes;\n"
    "    ld.param.u64     %rd68, [pm_block_copy_param_0];\n"
    "    ld.param.u64     %rd69, [pm_block_copy_param_1];\n"
    "    ld.param.u32     %r3, [pm_block_copy_param_2];\n"
    "    cvt.u64.u32     %rd70, %r3;\n"
    "    mul.lo.s64     %rd71, %rd70, %rd69;\n"
    "    mov.u32     %r4, %ctaid.x;\n"
    "    cvt.u64.u32     %rd173, %r4;\n"
    "    setp.le.u64     %p1, %rd71, %rd173;\n"
    "    @%p1 bra     $L__BB0_35;\n"
    "    mov.u32     %r5, %tid.x;\n"
    "    cvt.u64.u32     %rd2, %r5;\n"
    "    mov.u32     %r6, %ntid.x;\n"
    "    cvt.u64.u32     %rd3, %r6;\n"
    "    cvt.u32.u64     %r7, %rd2;\n"
    "    cvta.to.global.u64     %rd74, %rd68;\n"
    "$L__BB0_2:\n"
    "    setp.ne.s32     %p2, %r7, 0;\n"
    "    bar.sync     0;\n"
    "    @%p2 bra     $L__BB0_7;\n"
    "    and.b64      %rd72, %rd173, -4294967296;\n"
    "    setp.eq.s64     %p3, %rd72, 0;\n"
    "    @%p3 bra     $L__BB0_5;\n"
    "    div.u64     %rd174, %rd173, %rd70;\n"
    "    bra.uni     $L__BB0_6;\n"
    "$L__BB0_5:\n"
    "    cvt.u32.u64     %r8, %rd173;\n"
    "    div.u32     %r9, %r8, %r3;\n"
    "    cvt.u64.u32     %rd174, %r9;\n"
    "$L__BB0_6:\n"
    "    mul.lo.s64     %rd75, %rd174, 24;\n"
    "    add.s64     %rd76, %rd74, %rd75;\n"
    "    ld.volatile.global.u64     %rd77, [%rd76];\n"
    "    st.shared.u64     [_ZZ13pm_block_copyE3dst], %rd77;\n"
    "    ld.volatile.global.u64     %rd78, [%rd76+8];\n"
    "    st.shared.u64     [_ZZ13pm_block_copyE3src], %rd78;\n"
    "    ld.volatile.global.u64     %rd79, [%rd76+16];\n"
    "    st.shared.u64     [_ZZ13pm_block_copyE5bytes], %rd79;\n"
    "$L__BB0_7:\n"
    "    bar.sync     0;\n"
    "    ld.shared.u64     %rd8, [_ZZ13pm_block_copyE5bytes];\n"
    "    add.s64     %rd81, %rd70, %rd8;\n"
    "    add.s64     %rd9, %rd81, -1;\n"
    "    and.b64      %rd82, %rd9, -4294967296;\n"
    "    setp.eq.s64     %p4, %rd82, 0;\n"
    "    @%p4 bra     $L__BB0_9;\n"
    "    div.u64     %rd175, %rd9, %rd70;\n"
    "    bra.uni     $L__BB0_10;\n"
    "$L__BB0_9:\n"
    "    cvt.u32.u64     %r10, %rd9;\n"
    "    div.u32     %r11, %r10, %r3;\n"
    "    cvt.u64.u32     %rd175, %r11;\n"
    "$L__BB0_10:\n"
    "    and.b64      %rd84, %rd173, -4294967296;\n"
    "    setp.eq.s64     %p5, %rd84, 0;\n"
    "    @%p5 bra     $L__BB0_12;\n"
    "    rem.u64     %rd176, %rd173, %rd70;\n"
    "    bra.uni     $L__BB0_13;\n"
    "$L__BB0_12:\n"
    "    cvt.u32.u64     %r12, %rd173;\n"
    "    rem.u32     %r13, %r12, %r3;\n"
    "    cvt.u64.u32     %rd176, %r13;\n"
    "$L__BB0_13:\n"
    "    add.s64     %rd86, %rd175, 15;\n"
    "    and.b64      %rd87, %rd86, -16;\n"
    "    mul.lo.s64     %rd16, %rd87, %rd176;\n"
    "    min.u64     %rd17, %rd16, %rd8;\n"
    "    sub.s64     %rd88, %rd8, %rd17;\n"
    "    setp.lt.u64     %p6, %rd88, %rd87;\n"
    "    add.s64     %rd89, %rd17, %rd87;\n"
    "    selp.b64     %rd90, %rd8, %rd89, %p6;\n"
    "    ld.shared.u64     %rd18, [_ZZ13pm_block_copyE3dst];\n"
    "    add.s64     %rd19, %rd18, %rd17;\n"
    "    ld.shared.u64     %rd20, [_ZZ13pm_block_copyE3src];\n"
    "    add.s64     %rd21, %rd20, %rd17;\n"
    "    sub.s64     %rd91, %rd90, %rd17;\n"
    "    cvt.u32.u64     %r14, %rd21;\n"
    "    cvt.u32.u64     %r15, %rd19;\n"
    "    xor.b32      %r16, %r15, %r14;\n"
    "    and.b32      %r1, %r16, 15;\n"
    "    setp.eq.s32     %p7, %r1, 0;\n"
    "    and.b32      %r17, %r16, 3;\n"
    "    setp.eq.s32     %p8, %r17, 0;\n"
    "    selp.b32     %r18, 4, 1, %p8;\n"
    "    selp.b32     %r2, 16, %r18, %p7;\n"
    "    cvt.u64.u32     %rd92, %r2;\n"
    "    add.s32     %r19, %r2, -1;\n"
    "    cvt.u64.u32     %rd93, %r19;\n"
    "    and.b64      %rd94, %rd93, %rd19;\n"
    "    sub.s64     %rd95, %rd92, %rd94;\n"
    "    and.b64      %rd96, %rd95, %rd93;\n"
    "    min.u64     %rd22, %rd96, %rd91;\n"
    "    sub.s64     %rd23, %rd91, %rd22;\n"
    "    not.b64     %rd97, %rd93;\n"
    "    and.b64      %rd24, %rd23, %rd97;\n"
    "    setp.le.u64     %p9, %rd22, %rd2;\n"
    "    @%p9 bra     $L__BB0_15;\n"
    "    add.s64     %rd98, %rd21, %rd2;\n"
    "    ld.u8     %rs1, [%rd98];\n"
    "    add.s64     %rd99, %rd19, %rd2;\n"
    "    st.u8     [%rd99], %rs1;\n"
    "$L__BB0_15:\n"
    "    add.s64     %rd25, %rd19, %rd22;\n"
    "    add.s64     %rd26, %rd21, %rd22;\n"
    "    @%p7 bra     $L__BB0_27;\n"
    "    setp.eq.s32     %p11, %r2, 4;\n"
    "    @%p11 bra     $L__BB0_22;\n"
    "    bra.uni     $L__BB0_17;\n"
    "$L__BB0_22:\n"
    "    shr.u64     %rd40, %rd24, 2;\n"
    "    mul.wide.u32     %rd41, %r6, 3;\n"
    "    add.s64     %rd118, %rd41, %rd2;\n"
    "    setp.ge.u64     %p16, %rd118, %rd40;\n"
    "    mov.u64     %rd185, %rd2;\n"
    "    @%p16 bra     $L__BB0_25;\n"
    "    shl.b64     %rd119, %rd2, 2;\n"
    "    add.s64     %rd120, %rd119, -2;\n"
    "    add.s64     %rd121, %rd20, %rd120;\n"
    "    not.b64     %rd122, %rd8;\n"
    "    not.b64     %rd123, %rd16;\n"
    "    max.u64     %rd124, %rd123, %rd122;\n"
    "    add.s64     %rd125, %rd22, 1;\n"
    "    sub.s64     %rd126, %rd125, %rd124;\n"
    "    add.s64     %rd183, %rd121, %rd126;\n"
    "    add.s64     %rd127, %rd18, %rd120;\n"
    "    add.s64     %rd184, %rd127, %rd126;\n"
    "    shl.b64     %rd44, %rd3, 2;\n"
    "    mov.u64     %rd185, %rd2;\n"
    "$L__BB0_24:\n"
    "    ld.u32     %r22, [%rd183];\n"
    "    add.s64     %rd128, %rd183, %rd44;\n"
    "    ld.u32     %r23, [%rd128];\n"
    "    add.s64     %rd129, %rd128, %rd44;\n"
    "    ld.u32     %r24, [%rd129];\n"
    "    add.s64     %rd130, %rd129, %rd44;\n"
    "    add.s64     %rd183, %rd130, %rd44;\n"
    "    ld.u32     %r25, [%rd130];\n"
    "    st.u32     [%rd184], %r22;\n"
    "    add.s64     %rd131, %rd184, %rd44;\n"
    "    st.u32     [%rd131], %r23;\n"
    "    add.s64     %rd132, %rd131, %rd44;\n"
    "    st.u32     [%rd132], %r24;\n"
    "    add.s64     %rd133, %rd132, %rd44;\n"
    "    add.s64     %rd184, %rd133, %rd44;\n"
    "    st.u32     [%rd133], %r25;\n"
    "    add.s64     %rd134, %rd185, %rd3;\n"
    "    add.s64     %rd185, %rd41, %rd134;\n"
    "    add.s64     %rd135, %rd185, %rd41;\n"
    "    setp.lt.u64     %p17, %rd135, %rd40;\n"
    "    @%p17 bra     $L__BB0_24;\n"
    "$L__BB0_25:\n"
    "    setp.ge.u64     %p18, %rd185, %rd40;\n"
    "    @%p18 bra     $L__BB0_32;\n"
    "$L__BB0_26:\n"
    "    shl.b64     %rd136, %rd185, 2;\n"
    "    add.s64     %rd137, %rd26, %rd136;\n"
    "    ld.u32     %r26, [%rd137];\n"
    "    add.s64     %rd138, %rd25, %rd136;\n"
    "    st.u32     [%rd138], %r26;\n"
    "    add.s64     %rd185, %rd185, %rd3;\n"
    "    setp.lt.u64     %p19, %rd185, %rd40;\n"
    "    @%p19 bra     $L__BB0_26;\n"
    "    bra.uni     $L__BB0_32;\n"
    "$L__BB0_27:\n"
    "    shr.u64     %rd54, %rd24, 4;\n"
    "    mul.wide.u32     %rd55, %r6, 3;\n"
    "    add.s64     %rd139, %rd55, %rd2;\n"
    "    setp.ge.u64     %p20, %rd139, %rd54;\n"
    "    mov.u64     %rd189, %rd2;\n"
    "    @%p20 bra     $L__BB0_30;\n"
    "    shl.b64     %rd140, %rd2, 4;\n"
    "    add.s64     %rd141, %rd18, %rd140;\n"
    "    not.b64     %rd142, %rd8;\n"
    "    not.b64     %rd143, %rd16;\n"
    "    max.u64     %rd144, %rd143, %rd142;\n"
    "    add.s64     %rd145, %rd22, 1;\n"
    "    sub.s64     %rd146, %rd145, %rd144;\n"
    "    add.s64     %rd147, %rd141, %rd146;\n"
    "    add.s64     %rd188, %rd147, -2;\n"
    "    shl.b64     %rd57, %rd3, 4;\n"
    "    neg.s64     %rd58, %rd3;\n"
    "    mov.u64     %rd189, %rd2;\n"
    "$L__BB0_29:\n"
    "    shl.b64     %rd148, %rd189, 4;\n"
    "    add.s64     %rd149, %rd26, %rd148;\n"
    "    shl.b64     %rd150, %rd3, 2;\n"
    "    add.s64     %rd152, %rd149, %rd57;\n"
    "    ld.v4.u32     {%r28, %r29, %r30, %r31}, [%rd152];\n"
    "    add.s64     %rd153, %rd152, %rd57;\n"
    "    ld.v4.u32     {%r36, %r37, %r38, %r39}, [%rd153];\n"
    "    add.s64     %rd154, %rd153, %rd57;\n"
    "    ld.v4.u32     {%r44, %r45, %r46, %r47}, [%rd154];\n"
    "    shl.b64     %rd155, %rd58, 4;\n"
    "    add.s64     %rd156, %rd152, %rd155;\n"
    "    ld.v4.u32     {%r52, %r53, %r54, %r55}, [%rd156];\n"
    "    st.v4.u32     [%rd188], {%r52, %r53, %r54, %r55};\n"
    "    add.s64     %rd157, %rd188, %rd57;\n"
    "    st.v4.u32     [%rd157], {%r28, %r29, %r30, %r31};\n"
    "    add.s64     %rd158, %rd157, %rd57;\n"
    "    st.v4.u32     [%rd158], {%r36, %r37, %r38, %r39};\n"
    "    add.s64     %rd159, %rd158, %rd57;\n"
    "    add.s64     %rd188, %rd159, %rd57;\n"
    "    st.v4.u32     [%rd159], {%r44, %r45, %r46, %r47};\n"
    "    add.s64     %rd189, %rd150, %rd189;\n"
    "    add.s64     %rd160, %rd189, %rd55;\n"
    "    setp.lt.u64     %p21, %rd160, %rd54;\n"
    "    @%p21 bra     $L__BB0_29;\n"
    "$L__BB0_30:\n"
    "    setp.ge.u64     %p22, %rd189, %rd54;\n"
    "    @%p22 bra     $L__BB0_32;\n"
    "$L__BB0_31:\n"
    "    shl.b64     %rd161, %rd189, 4;\n"
    "    add.s64     %rd162, %rd25, %rd161;\n"
    "    add.s64     %rd163, %rd26, %rd161;\n"
    "    ld.v4.u32     {%r60, %r61, %r62, %r63}, [%rd163];\n"
    "    st.v4.u32     [%rd162], {%r60, %r61, %r62, %r63};\n"
    "    add.s64     %rd189, %rd189, %rd3;\n"
    "    setp.lt.u64     %p23, %rd189, %rd54;\n"
    "    @%p23 bra     $L__BB0_31;\n"
    "    bra.uni     $L__BB0_32;\n"
    "$L__BB0_17:\n"
    "    mul.wide.u32     %rd27, %r6, 3;\n"
    "    add.s64     %rd100, %rd27, %rd2;\n"
    "    setp.ge.u64     %p12, %rd100, %rd24;\n"
    "    mov.u64     %rd180, %rd2;\n"
    "    @%p12 bra     $L__BB0_20;\n"
    "    add.s64     %rd101, %rd2, -2;\n"
    "    add.s64     %rd102, %rd20, %rd101;\n"
    "    not.b64     %rd103, %rd8;\n"
    "    not.b64     %rd104, %rd16;\n"
    "    max.u64     %rd105, %rd104, %rd103;\n"
    "    add.s64     %rd106, %rd22, 1;\n"
    "    sub.s64     %rd107, %rd106, %rd105;\n"
    "    add.s64     %rd178, %rd102, %rd107;\n"
    "    add.s64     %rd108, %rd18, %rd101;\n"
    "    add.s64     %rd179, %rd108, %rd107;\n"
    "    shl.b64     %rd30, %rd3, 2;\n"
    "    mov.u64     %rd180, %rd2;\n"
    "$L__BB0_19:\n"
    "    ld.u8     %rs2, [%rd178];\n"
    "    add.s64     %rd109, %rd178, %rd3;\n"
    "    ld.u8     %rs3, [%rd109];\n"
    "    add.s64     %rd110, %rd109, %rd3;\n"
    "    ld.u8     %rs4, [%rd110];\n"
    "    add.s64     %rd111, %rd110, %rd3;\n"
    "    add.s64     %rd178, %rd111, %rd3;\n"
    "    ld.u8     %rs5, [%rd111];\n"
    "    st.u8     [%rd179], %rs2;\n"
    "    add.s64     %rd112, %rd179, %rd3;\n"
    "    st.u8     [%rd112], %rs3;\n"
    "    add.s64     %rd113, %rd112, %rd3;\n"
    "    st.u8     [%rd113], %rs4;\n"
    "    add.s64     %rd114, %rd113, %rd3;\n"
    "    add.s64     %rd179, %rd114, %rd3;\n"
    "    st.u8     [%rd114], %rs5;\n"
    "    add.s64     %rd180, %rd180, %rd30;\n"
    "    add.s64     %rd115, %rd180, %rd27;\n"
    "    setp.lt.u64     %p13, %rd115, %rd24;\n"
    "    @%p13 bra     $L__BB0_19;\n"
    "$L__BB0_20:\n"
    "    setp.ge.u64     %p14, %rd180, %rd24;\n"
    "    @%p14 bra     $L__BB0_32;\n"
    "$L__BB0_21:\n"
    "    add.s64     %rd116, %rd26, %rd180;\n"
    "    ld.u8     %rs6, [%rd116];\n"
    "    add.s64     %rd117, %rd25, %rd180;\n"
    "    st.u8     [%rd117], %rs6;\n"
    "    add.s64     %rd180, %rd180, %rd3;\n"
    "    setp.lt.u64     %p15, %rd180, %rd24;\n"
    "    @%p15 bra     $L__BB0_21;\n"
    "$L__BB0_32:\n"
    "    min.u64     %rd172, %rd16, %rd8;\n"
    "    sub.s64     %rd164, %rd23, %rd24;\n"
    "    setp.le.u64     %p24, %rd164, %rd2;\n"
    "    add.s64     %rd66, %rd22, %rd172;\n"
    "    @%p24 bra     $L__BB0_34;\n"
    "    add.s64     %rd165, %rd66, %rd2;\n"
    "    add.s64     %rd166, %rd165, %rd24;\n"
    "    add.s64     %rd167, %rd20, %rd166;\n"
    "    ld.u8     %rs7, [%rd167];\n"
    "    add.s64     %rd168, %rd18, %rd166;\n"
    "    st.u8     [%rd168], %rs7;\n"
    "$L__BB0_34:\n"
    "    mov.u32     %r68, %nctaid.x;\n"
    "    cvt.u64.u32     %rd169, %r68;\n"
    "    add.s64     %rd173, %rd173, %rd169;\n"
    "    setp.lt.u64     %p25, %rd173, %rd71;\n"
    "    @%p25 bra     $L__BB0_2;\n"
    "$L__BB0_35:\n"
    "    ret;\n"
    "}\n"
;

/* The kernel's block of threads, as cuda_kernel.cu is compiled for. */
enum { THREADS = 256 };
/* Blocks of threads launched per multiprocessor (PINMEM_COPY_KERNEL_PER_SM):
 * enough loads in flight to cover the latency of reading host memory
 * across the bus. At most 8: the most of 256 threads a multiprocessor
 * holds at once. */

static const pm__cuda_api *cu;
static CUdevice device;
static CUcontext primary;
static bool usable;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static CUfunction function;
static unsigned grid_max;
static bool loaded;

void pm__cuda_kernel_open(const pm__cuda_api *api, CUdevice dev, CUcontext ctx, bool can)
{
    cu = api;
    device = dev;
    primary = ctx;
    usable = can && api->module_load_data && api->module_get_function && api->module_unload &&
             api->launch_kernel && api->stream_get_ctx;
}

/* In the primary context, and with this thread's capture mode relaxed:
 * loading a module may be a call the driver forbids while another thread
 * captures a graph in global mode. */
static void load(void)
{
    if (!usable)
        return;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (cu->thread_exchange_capture_mode(&mode) != CUDA_SUCCESS)
        return;
    CUcontext popped = NULL;
    CUmodule module = NULL;
    int sms = 0;
    if (cu->ctx_push(primary) == CUDA_SUCCESS) {
        CUresult rc = cu->module_load_data(&module, ptx);
        if (rc == CUDA_SUCCESS)
            rc = cu->module_get_function(&function, module, "pm_block_copy");
        if (rc == CUDA_SUCCESS)
            rc = cu->device_get_attribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
        if (rc == CUDA_SUCCESS && sms > 0) {
            grid_max = (unsigned)sms * (unsigned)pm__option_value(PM__OPT_COPY_KERNEL_PER_SM);
            loaded = true;
        } else if (module) {
            cu->module_unload(module);
        }
        cu->ctx_pop(&popped);
    }
    cu->thread_exchange_capture_mode(&mode);
}

bool pm__cuda_kernel_loaded(void)
{
    if (!usable)
        return false;
    pthread_once(&load_once, load);
    return loaded;
}

CUresult pm__cuda_kernel_launch(const pm__block_copy *blocks, size_t count,
                                unsigned long long largest, CUstream s)
{
    if (!pm__cuda_kernel_loaded())
        return CUDA_ERROR_NOT_SUPPORTED;
    /* Few blocks are split into parts, so that every multiprocessor works;
     * many are one part each, and the grid strides over them. */
    const unsigned long long parts = pm__block_parts(count, largest, grid_max);
    unsigned long long units = count * parts;
    unsigned grid = units < grid_max ? (unsigned)units : grid_max;
    CUdeviceptr list = (CUdeviceptr)(uintptr_t)blocks; /* device memory, or host memory mapped at its address */
    unsigned long long n = count;
    unsigned p = (unsigned)parts;
    void *params[] = {&list, &n, &p};
    return cu->launch_kernel(function, grid, 1, 1, THREADS, 1, 1, 0, s, params, NULL);
}
