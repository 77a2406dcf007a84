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
    "    .reg .b64     %rd<188>;\n"
    "    .shared .align 8 .u64 _ZZ13pm_block_copyE3dst;\n"
    "    .shared .align 8 .u64 _ZZ13pm_block_copyE3src;\n"
    "    .shared .align 8 .u64 _ZZ13pm_block_copyE5bytes;\n"
    "    ld.param.u64     %rd67, [pm_block_copy_param_0];\n"
    "    ld.param.u64     %rd68, [pm_block_copy_param_1];\n"
    "    ld.param.u32     %r3, [pm_block_copy_param_2];\n"
    "    cvt.u64.u32     %rd69, %r3;\n"
    "    mul.lo.s64     %rd70, %rd69, %rd68;\n"
    "    mov.u32     %r4, %ctaid.x;\n"
    "    cvt.u64.u32     %rd170, %r4;\n"
    "    setp.le.u64     %p1, %rd70, %rd170;\n"
    "    @%p1 bra     $L__BB0_35;\n"
    "    mov.u32     %r5, %tid.x;\n"
    "    cvt.u64.u32     %rd2, %r5;\n"
    "    mov.u32     %r6, %ntid.x;\n"
    "    cvt.u64.u32     %rd3, %r6;\n"
    "    cvt.u32.u64     %r7, %rd2;\n"
    "    cvta.to.global.u64     %rd73, %rd67;\n"
    "$L__BB0_2:\n"
    "    setp.ne.s32     %p2, %r7, 0;\n"
    "    bar.sync     0;\n"
    "    @%p2 bra     $L__BB0_7;\n"
    "    and.b64      %rd71, %rd170, -4294967296;\n"
    "    setp.eq.s64     %p3, %rd71, 0;\n"
    "    @%p3 bra     $L__BB0_5;\n"
    "    div.u64     %rd171, %rd170, %rd69;\n"
    "    bra.uni     $L__BB0_6;\n"
    "$L__BB0_5:\n"
    "    cvt.u32.u64     %r8, %rd170;\n"
    "    div.u32     %r9, %r8, %r3;\n"
    "    cvt.u64.u32     %rd171, %r9;\n"
    "$L__BB0_6:\n"
    "    mul.lo.s64     %rd74, %rd171, 24;\n"
    "    add.s64     %rd75, %rd73, %rd74;\n"
    "    ld.volatile.global.u64     %rd76, [%rd75];\n"
    "    st.shared.u64     [_ZZ13pm_block_copyE3dst], %rd76;\n"
    "    ld.volatile.global.u64     %rd77, [%rd75+8];\n"
    "    st.shared.u64     [_ZZ13pm_block_copyE3src], %rd77;\n"
    "    ld.volatile.global.u64     %rd78, [%rd75+16];\n"
    "    st.shared.u64     [_ZZ13pm_block_copyE5bytes], %rd78;\n"
    "$L__BB0_7:\n"
    "    bar.sync     0;\n"
    "    ld.shared.u64     %rd8, [_ZZ13pm_block_copyE5bytes];\n"
    "    and.b64      %rd79, %rd8, -4294967296;\n"
    "    setp.eq.s64     %p4, %rd79, 0;\n"
    "    @%p4 bra     $L__BB0_9;\n"
    "    div.u64     %rd172, %rd8, %rd69;\n"
    "    bra.uni     $L__BB0_10;\n"
    "$L__BB0_9:\n"
    "    cvt.u32.u64     %r10, %rd8;\n"
    "    div.u32     %r11, %r10, %r3;\n"
    "    cvt.u64.u32     %rd172, %r11;\n"
    "$L__BB0_10:\n"
    "    and.b64      %rd81, %rd170, -4294967296;\n"
    "    setp.eq.s64     %p5, %rd81, 0;\n"
    "    @%p5 bra     $L__BB0_12;\n"
    "    rem.u64     %rd173, %rd170, %rd69;\n"
    "    bra.uni     $L__BB0_13;\n"
    "$L__BB0_12:\n"
    "    cvt.u32.u64     %r12, %rd170;\n"
    "    rem.u32     %r13, %r12, %r3;\n"
    "    cvt.u64.u32     %rd173, %r13;\n"
    "$L__BB0_13:\n"
    "    add.s64     %rd83, %rd172, 15;\n"
    "    and.b64      %rd84, %rd83, -16;\n"
    "    mul.lo.s64     %rd15, %rd84, %rd173;\n"
    "    min.u64     %rd16, %rd15, %rd8;\n"
    "    sub.s64     %rd85, %rd8, %rd16;\n"
    "    setp.lt.u64     %p6, %rd85, %rd84;\n"
    "    add.s64     %rd86, %rd16, %rd84;\n"
    "    selp.b64     %rd87, %rd8, %rd86, %p6;\n"
    "    ld.shared.u64     %rd17, [_ZZ13pm_block_copyE3dst];\n"
    "    add.s64     %rd18, %rd17, %rd16;\n"
    "    ld.shared.u64     %rd19, [_ZZ13pm_block_copyE3src];\n"
    "    add.s64     %rd20, %rd19, %rd16;\n"
    "    sub.s64     %rd88, %rd87, %rd16;\n"
    "    cvt.u32.u64     %r14, %rd20;\n"
    "    cvt.u32.u64     %r15, %rd18;\n"
    "    xor.b32      %r16, %r15, %r14;\n"
    "    and.b32      %r1, %r16, 15;\n"
    "    setp.eq.s32     %p7, %r1, 0;\n"
    "    and.b32      %r17, %r16, 3;\n"
    "    setp.eq.s32     %p8, %r17, 0;\n"
    "    selp.b32     %r18, 4, 1, %p8;\n"
    "    selp.b32     %r2, 16, %r18, %p7;\n"
    "    cvt.u64.u32     %rd89, %r2;\n"
    "    add.s32     %r19, %r2, -1;\n"
    "    cvt.u64.u32     %rd90, %r19;\n"
    "    and.b64      %rd91, %rd90, %rd18;\n"
    "    sub.s64     %rd92, %rd89, %rd91;\n"
    "    and.b64      %rd93, %rd92, %rd90;\n"
    "    min.u64     %rd21, %rd93, %rd88;\n"
    "    sub.s64     %rd22, %rd88, %rd21;\n"
    "    not.b64     %rd94, %rd90;\n"
    "    and.b64      %rd23, %rd22, %rd94;\n"
    "    setp.le.u64     %p9, %rd21, %rd2;\n"
    "    @%p9 bra     $L__BB0_15;\n"
    "    add.s64     %rd95, %rd20, %rd2;\n"
    "    ld.u8     %rs1, [%rd95];\n"
    "    add.s64     %rd96, %rd18, %rd2;\n"
    "    st.u8     [%rd96], %rs1;\n"
    "$L__BB0_15:\n"
    "    add.s64     %rd24, %rd18, %rd21;\n"
    "    add.s64     %rd25, %rd20, %rd21;\n"
    "    @%p7 bra     $L__BB0_27;\n"
    "    setp.eq.s32     %p11, %r2, 4;\n"
    "    @%p11 bra     $L__BB0_22;\n"
    "    bra.uni     $L__BB0_17;\n"
    "$L__BB0_22:\n"
    "    shr.u64     %rd39, %rd23, 2;\n"
    "    mul.wide.u32     %rd40, %r6, 3;\n"
    "    add.s64     %rd115, %rd40, %rd2;\n"
    "    setp.ge.u64     %p16, %rd115, %rd39;\n"
    "    mov.u64     %rd182, %rd2;\n"
    "    @%p16 bra     $L__BB0_25;\n"
    "    shl.b64     %rd116, %rd2, 2;\n"
    "    add.s64     %rd117, %rd116, -2;\n"
    "    add.s64     %rd118, %rd19, %rd117;\n"
    "    not.b64     %rd119, %rd8;\n"
    "    not.b64     %rd120, %rd15;\n"
    "    max.u64     %rd121, %rd120, %rd119;\n"
    "    add.s64     %rd122, %rd21, 1;\n"
    "    sub.s64     %rd123, %rd122, %rd121;\n"
    "    add.s64     %rd180, %rd118, %rd123;\n"
    "    add.s64     %rd124, %rd17, %rd117;\n"
    "    add.s64     %rd181, %rd124, %rd123;\n"
    "    shl.b64     %rd43, %rd3, 2;\n"
    "    mov.u64     %rd182, %rd2;\n"
    "$L__BB0_24:\n"
    "    ld.u32     %r22, [%rd180];\n"
    "    add.s64     %rd125, %rd180, %rd43;\n"
    "    ld.u32     %r23, [%rd125];\n"
    "    add.s64     %rd126, %rd125, %rd43;\n"
    "    ld.u32     %r24, [%rd126];\n"
    "    add.s64     %rd127, %rd126, %rd43;\n"
    "    add.s64     %rd180, %rd127, %rd43;\n"
    "    ld.u32     %r25, [%rd127];\n"
    "    st.u32     [%rd181], %r22;\n"
    "    add.s64     %rd128, %rd181, %rd43;\n"
    "    st.u32     [%rd128], %r23;\n"
    "    add.s64     %rd129, %rd128, %rd43;\n"
    "    st.u32     [%rd129], %r24;\n"
    "    add.s64     %rd130, %rd129, %rd43;\n"
    "    add.s64     %rd181, %rd130, %rd43;\n"
    "    st.u32     [%rd130], %r25;\n"
    "    add.s64     %rd131, %rd182, %rd3;\n"
    "    add.s64     %rd182, %rd40, %rd131;\n"
    "    add.s64     %rd132, %rd182, %rd40;\n"
    "    setp.lt.u64     %p17, %rd132, %rd39;\n"
    "    @%p17 bra     $L__BB0_24;\n"
    "$L__BB0_25:\n"
    "    setp.ge.u64     %p18, %rd182, %rd39;\n"
    "    @%p18 bra     $L__BB0_32;\n"
    "$L__BB0_26:\n"
    "    shl.b64     %rd133, %rd182, 2;\n"
    "    add.s64     %rd134, %rd25, %rd133;\n"
    "    ld.u32     %r26, [%rd134];\n"
    "    add.s64     %rd135, %rd24, %rd133;\n"
    "    st.u32     [%rd135], %r26;\n"
    "    add.s64     %rd182, %rd182, %rd3;\n"
    "    setp.lt.u64     %p19, %rd182, %rd39;\n"
    "    @%p19 bra     $L__BB0_26;\n"
    "    bra.uni     $L__BB0_32;\n"
    "$L__BB0_27:\n"
    "    shr.u64     %rd53, %rd23, 4;\n"
    "    mul.wide.u32     %rd54, %r6, 3;\n"
    "    add.s64     %rd136, %rd54, %rd2;\n"
    "    setp.ge.u64     %p20, %rd136, %rd53;\n"
    "    mov.u64     %rd186, %rd2;\n"
    "    @%p20 bra     $L__BB0_30;\n"
    "    shl.b64     %rd137, %rd2, 4;\n"
    "    add.s64     %rd138, %rd17, %rd137;\n"
    "    not.b64     %rd139, %rd8;\n"
    "    not.b64     %rd140, %rd15;\n"
    "    max.u64     %rd141, %rd140, %rd139;\n"
    "    add.s64     %rd142, %rd21, 1;\n"
    "    sub.s64     %rd143, %rd142, %rd141;\n"
    "    add.s64     %rd144, %rd138, %rd143;\n"
    "    add.s64     %rd185, %rd144, -2;\n"
    "    shl.b64     %rd56, %rd3, 4;\n"
    "    neg.s64     %rd57, %rd3;\n"
    "    mov.u64     %rd186, %rd2;\n"
    "$L__BB0_29:\n"
    "    shl.b64     %rd145, %rd186, 4;\n"
    "    add.s64     %rd146, %rd25, %rd145;\n"
    "    shl.b64     %rd147, %rd3, 2;\n"
    "    add.s64     %rd149, %rd146, %rd56;\n"
    "    ld.v4.u32     {%r28, %r29, %r30, %r31}, [%rd149];\n"
    "    add.s64     %rd150, %rd149, %rd56;\n"
    "    ld.v4.u32     {%r36, %r37, %r38, %r39}, [%rd150];\n"
    "    add.s64     %rd151, %rd150, %rd56;\n"
    "    ld.v4.u32     {%r44, %r45, %r46, %r47}, [%rd151];\n"
    "    shl.b64     %rd152, %rd57, 4;\n"
    "    add.s64     %rd153, %rd149, %rd152;\n"
    "    ld.v4.u32     {%r52, %r53, %r54, %r55}, [%rd153];\n"
    "    st.v4.u32     [%rd185], {%r52, %r53, %r54, %r55};\n"
    "    add.s64     %rd154, %rd185, %rd56;\n"
    "    st.v4.u32     [%rd154], {%r28, %r29, %r30, %r31};\n"
    "    add.s64     %rd155, %rd154, %rd56;\n"
    "    st.v4.u32     [%rd155], {%r36, %r37, %r38, %r39};\n"
    "    add.s64     %rd156, %rd155, %rd56;\n"
    "    add.s64     %rd185, %rd156, %rd56;\n"
    "    st.v4.u32     [%rd156], {%r44, %r45, %r46, %r47};\n"
    "    add.s64     %rd186, %rd147, %rd186;\n"
    "    add.s64     %rd157, %rd186, %rd54;\n"
    "    setp.lt.u64     %p21, %rd157, %rd53;\n"
    "    @%p21 bra     $L__BB0_29;\n"
    "$L__BB0_30:\n"
    "    setp.ge.u64     %p22, %rd186, %rd53;\n"
    "    @%p22 bra     $L__BB0_32;\n"
    "$L__BB0_31:\n"
    "    shl.b64     %rd158, %rd186, 4;\n"
    "    add.s64     %rd159, %rd24, %rd158;\n"
    "    add.s64     %rd160, %rd25, %rd158;\n"
    "    ld.v4.u32     {%r60, %r61, %r62, %r63}, [%rd160];\n"
    "    st.v4.u32     [%rd159], {%r60, %r61, %r62, %r63};\n"
    "    add.s64     %rd186, %rd186, %rd3;\n"
    "    setp.lt.u64     %p23, %rd186, %rd53;\n"
    "    @%p23 bra     $L__BB0_31;\n"
    "    bra.uni     $L__BB0_32;\n"
    "$L__BB0_17:\n"
    "    mul.wide.u32     %rd26, %r6, 3;\n"
    "    add.s64     %rd97, %rd26, %rd2;\n"
    "    setp.ge.u64     %p12, %rd97, %rd23;\n"
    "    mov.u64     %rd177, %rd2;\n"
    "    @%p12 bra     $L__BB0_20;\n"
    "    add.s64     %rd98, %rd2, -2;\n"
    "    add.s64     %rd99, %rd19, %rd98;\n"
    "    not.b64     %rd100, %rd8;\n"
    "    not.b64     %rd101, %rd15;\n"
    "    max.u64     %rd102, %rd101, %rd100;\n"
    "    add.s64     %rd103, %rd21, 1;\n"
    "    sub.s64     %rd104, %rd103, %rd102;\n"
    "    add.s64     %rd175, %rd99, %rd104;\n"
    "    add.s64     %rd105, %rd17, %rd98;\n"
    "    add.s64     %rd176, %rd105, %rd104;\n"
    "    shl.b64     %rd29, %rd3, 2;\n"
    "    mov.u64     %rd177, %rd2;\n"
    "$L__BB0_19:\n"
    "    ld.u8     %rs2, [%rd175];\n"
    "    add.s64     %rd106, %rd175, %rd3;\n"
    "    ld.u8     %rs3, [%rd106];\n"
    "    add.s64     %rd107, %rd106, %rd3;\n"
    "    ld.u8     %rs4, [%rd107];\n"
    "    add.s64     %rd108, %rd107, %rd3;\n"
    "    add.s64     %rd175, %rd108, %rd3;\n"
    "    ld.u8     %rs5, [%rd108];\n"
    "    st.u8     [%rd176], %rs2;\n"
    "    add.s64     %rd109, %rd176, %rd3;\n"
    "    st.u8     [%rd109], %rs3;\n"
    "    add.s64     %rd110, %rd109, %rd3;\n"
    "    st.u8     [%rd110], %rs4;\n"
    "    add.s64     %rd111, %rd110, %rd3;\n"
    "    add.s64     %rd176, %rd111, %rd3;\n"
    "    st.u8     [%rd111], %rs5;\n"
    "    add.s64     %rd177, %rd177, %rd29;\n"
    "    add.s64     %rd112, %rd177, %rd26;\n"
    "    setp.lt.u64     %p13, %rd112, %rd23;\n"
    "    @%p13 bra     $L__BB0_19;\n"
    "$L__BB0_20:\n"
    "    setp.ge.u64     %p14, %rd177, %rd23;\n"
    "    @%p14 bra     $L__BB0_32;\n"
    "$L__BB0_21:\n"
    "    add.s64     %rd113, %rd25, %rd177;\n"
    "    ld.u8     %rs6, [%rd113];\n"
    "    add.s64     %rd114, %rd24, %rd177;\n"
    "    st.u8     [%rd114], %rs6;\n"
    "    add.s64     %rd177, %rd177, %rd3;\n"
    "    setp.lt.u64     %p15, %rd177, %rd23;\n"
    "    @%p15 bra     $L__BB0_21;\n"
    "$L__BB0_32:\n"
    "    min.u64     %rd169, %rd15, %rd8;\n"
    "    sub.s64     %rd161, %rd22, %rd23;\n"
    "    setp.le.u64     %p24, %rd161, %rd2;\n"
    "    add.s64     %rd65, %rd21, %rd169;\n"
    "    @%p24 bra     $L__BB0_34;\n"
    "    add.s64     %rd162, %rd65, %rd2;\n"
    "    add.s64     %rd163, %rd162, %rd23;\n"
    "    add.s64     %rd164, %rd19, %rd163;\n"
    "    ld.u8     %rs7, [%rd164];\n"
    "    add.s64     %rd165, %rd17, %rd163;\n"
    "    st.u8     [%rd165], %rs7;\n"
    "$L__BB0_34:\n"
    "    mov.u32     %r68, %nctaid.x;\n"
    "    cvt.u64.u32     %rd166, %r68;\n"
    "    add.s64     %rd170, %rd170, %rd166;\n"
    "    setp.lt.u64     %p25, %rd170, %rd70;\n"
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
/* No block is split into parts smaller than this (a part is one block of
 * threads' work). */
enum { PART_MIN = 16 << 10 };

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

CUresult pm__cuda_kernel_launch(const pm__block_copy *blocks, size_t count, CUstream s)
{
    if (!pm__cuda_kernel_loaded())
        return CUDA_ERROR_NOT_SUPPORTED;
    /* Few blocks are split into parts, so that every multiprocessor works;
     * many are one part each, and the grid strides over them. */
    unsigned long long largest = 0;
    for (size_t i = 0; i < count; i++)
        largest = blocks[i].bytes > largest ? blocks[i].bytes : largest;
    unsigned long long parts = 1;
    if (count < grid_max) {
        parts = (grid_max + count - 1) / count;
        unsigned long long most = largest / PART_MIN;
        parts = parts < most ? parts : most ? most : 1;
    }
    unsigned long long units = count * parts;
    unsigned grid = units < grid_max ? (unsigned)units : grid_max;
    CUdeviceptr list = (CUdeviceptr)(uintptr_t)blocks; /* host pointer = device pointer here */
    unsigned long long n = count;
    unsigned p = (unsigned)parts;
    void *params[] = {&list, &n, &p};
    return cu->launch_kernel(function, grid, 1, 1, THREADS, 1, 1, 0, s, params, NULL);
}
