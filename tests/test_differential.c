/* On a GPU: every contract case through the raw driver and through pinmem,
 * requiring the same answers from both (and the answers the spec's table
 * records). Rows whose answer depends on what lies beside the object (memory
 * the allocator placed there, which differs between the two sides) are
 * printed where they differ, and not counted. Also memory crossing between
 * the two APIs. */
#include <stdbool.h>

#include "check.h"
#include "contract_cases.h"

#ifdef PINMEM_HAVE_CUDA_HEADERS
#include "backend/cuda_loader.h"

static const pm__cuda_api *cu;

static int d_alloc_host(void **pp, size_t n) { return cu->mem_alloc_host(pp, n); }
static int d_host_alloc(void **pp, size_t n, unsigned f) { return cu->mem_host_alloc(pp, n, f); }
static int d_free_host(void *p) { return cu->mem_free_host(p); }
static int d_register(void *p, size_t n, unsigned f) { return cu->mem_host_register(p, n, f); }
static int d_unregister(void *p) { return cu->mem_host_unregister(p); }
static int d_device_pointer(unsigned long long *d, void *p, unsigned f)
{
    CUdeviceptr v = 0;
    int rc = cu->mem_host_get_device_pointer(d ? &v : NULL, p, f);
    if (d && rc == 0)
        *d = v;
    return rc;
}
static int d_get_flags(unsigned *f, void *p) { return cu->mem_host_get_flags(f, p); }
static int d_address_range(unsigned long long *b, size_t *s, unsigned long long d)
{
    CUdeviceptr base = 0;
    int rc = cu->mem_get_address_range(b ? &base : NULL, s, (CUdeviceptr)d);
    if (b && rc == 0)
        *b = base;
    return rc;
}

static const host_api driver_api = {
    "driver",     d_alloc_host,     d_host_alloc, d_free_host,     d_register,
    d_unregister, d_device_pointer, d_get_flags,  d_address_range, NULL,
};

/* Sweep rows are compared by their spelled-out answers (codes and values
 * relative to the object); other rows by the value observed. */
static bool same_answer(const observation *a, const observation *b)
{
    if (a->answer[0] || b->answer[0])
        return strcmp(a->answer, b->answer) == 0;
    return a->got == b->got;
}

static int agreeing_rows, differing_rows, layout_rows;

static bool unsettled(const observation *o)
{
    return o->expected == EXPECT_UNKNOWN || o->expected == EXPECT_LAYOUT;
}

/* The driver's answers on the rows the spec's table does not settle or that
 * depend on the layout, one line per object and call ("p-1: INVALID_VALUE,
 * end(p): ..."), pinmem's after a slash where it answered otherwise. */
static void print_unsettled(const case_log *drv, const case_log *pm)
{
    char line[1024] = "", prefix[112] = "";
    for (int k = 0; k <= drv->n && k <= pm->n; k++) {
        const observation *a = &drv->obs[k], *b = &pm->obs[k];
        const bool last = k == drv->n || k == pm->n;
        const char *cut = last ? NULL : strrchr(a->label, '|');
        size_t plen = cut ? (size_t)(cut - a->label) : 0;
        while (plen && a->label[plen - 1] == ' ')
            plen--;
        if (last || strncmp(prefix, a->label, plen) != 0 || prefix[plen] != '\0') {
            if (line[0])
                printf("  %s:%s\n", prefix, line);
            line[0] = '\0';
            if (last)
                break;
            snprintf(prefix, sizeof prefix, "%.*s", (int)plen, a->label);
        }
        if (!unsettled(a))
            continue;
        size_t used = strlen(line);
        snprintf(line + used, sizeof line - used, "%s %s %s%s%s", used ? "," : "", cut + 2,
                 a->answer, same_answer(a, b) ? "" : " / ", same_answer(a, b) ? "" : b->answer);
    }
}

/* The rows outside the sweeps that the spec's table does not settle yet,
 * each with both answers, so that a run on a GPU settles them. */
static void print_unsettled_rows(const contract_case *c, const case_log *drv, const case_log *pm)
{
    for (int k = 0; k < drv->n && k < pm->n; k++) {
        const observation *a = &drv->obs[k], *b = &pm->obs[k];
        if (a->expected == EXPECT_UNKNOWN)
            printf("  unsettled %s: %s: driver %s (%lld), pinmem %s (%lld)\n", c->name, a->label,
                   pm_result_name((pm_result)a->got), a->got, pm_result_name((pm_result)b->got),
                   b->got);
    }
}

static void compare(const contract_case *c)
{
    static case_log drv, pm;
    memset(&drv, 0, sizeof drv);
    memset(&pm, 0, sizeof pm);
    c->run(&driver_api, &drv);
    c->run(&pinmem_host_api, &pm);
    const bool sweep = strncmp(c->name, "sweep/", 6) == 0;
    int differ = 0, agree = 0, layout = 0;
    for (int k = 0; k < drv.n || k < pm.n; k++) {
        const observation *a = &drv.obs[k], *b = &pm.obs[k];
        if (k >= drv.n || k >= pm.n) {
            fprintf(stderr, "DIFFER %s: %s: the sides ran %d and %d rows\n", c->name,
                    k < drv.n ? a->label : b->label, drv.n, pm.n);
            differ++;
            break;
        }
        const bool beside = a->expected == EXPECT_LAYOUT || b->expected == EXPECT_LAYOUT;
        if (!same_answer(a, b)) {
            if (sweep) /* one line of the table: (case, call, pointer), both answers */
                printf("  %-58s | %-30s | %-30s |%s%s%s%s%s\n", a->label, a->answer, b->answer,
                       beside ? " layout-dependent" : "", a->note[0] ? " driver: " : "", a->note,
                       b->note[0] ? " pinmem: " : "", b->note);
            else
                fprintf(stderr, "DIFFER %s: %s: driver %lld, pinmem %lld\n", c->name, a->label,
                        a->got, b->got);
            if (beside)
                layout++;
            else
                differ++;
        } else if (!unsettled(a) && a->got != a->expected) {
            fprintf(stderr, "TABLE %s: %s: both gave %s%lld, the table says %lld\n", c->name,
                    a->label, a->answer[0] ? a->answer : "", a->got, a->expected);
            differ++;
        } else {
            agree++;
        }
    }
    if (sweep) {
        printf("%s, the driver's answers beside the objects (/ pinmem's if other):\n",
               c->name);
        print_unsettled(&drv, &pm);
    } else {
        print_unsettled_rows(c, &drv, &pm);
    }
    check_failures += differ;
    agreeing_rows += agree;
    differing_rows += differ;
    layout_rows += layout;
    printf("%-26s %3d rows: %s", c->name, drv.n, differ ? "DIFFER" : "same answers");
    if (differ)
        printf(" (%d differ, %d agree)", differ, agree);
    if (layout)
        printf(" (%d layout-dependent rows differ, not counted)", layout);
    printf("\n");
}

/* Where the driver places small write-combined allocations: printed, since
 * pinmem claims exactly their bytes rather than whole pages. */
static void show_driver_placement(void)
{
    void *p[4] = {0};
    printf("driver placement of WRITECOMBINED allocations of 100 bytes:");
    for (int i = 0; i < 4; i++) {
        cu->mem_host_alloc(&p[i], 100, CU_MEMHOSTALLOC_WRITECOMBINED);
        printf(" %p", p[i]);
    }
    printf("\n");
    for (int i = 0; i < 4; i++)
        cu->mem_free_host(p[i]);
}

/* Memory pinned through the driver directly still gets the driver's answers
 * through pinmem, and pinmem's memory is mapped for the driver. */
static void cross_api(void)
{
    const int failures_before = check_failures;
    void *p = NULL;
    CHECK(cu->mem_host_alloc(&p, 10000, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS);
    unsigned df = 0, pf = 0;
    cu->mem_host_get_flags(&df, p);
    CHECK_RESULT(pm_mem_host_get_flags(&pf, (char *)p + 10), PM_SUCCESS);
    CHECK(df == pf);
    pm_deviceptr base = 0;
    size_t size = 0;
    CHECK_RESULT(pm_mem_get_address_range(&base, &size, (pm_deviceptr)(uintptr_t)p + 5),
                 PM_SUCCESS);
    CHECK(base == (uintptr_t)p && size == 10000);
    CHECK_RESULT(pm_mem_free_host(p), PM_SUCCESS);

    void *q = NULL;
    CHECK_RESULT(pm_mem_alloc_host(&q, 3 << 20), PM_SUCCESS);
    CUdeviceptr d = 0;
    CHECK(cu->mem_host_get_device_pointer(&d, (char *)q + 4096, 0) == CUDA_SUCCESS);
    CHECK(d == (uintptr_t)q + 4096);
    CHECK_RESULT(pm_mem_free_host(q), PM_SUCCESS);
    printf("cross-API rows: %s\n", check_failures > failures_before ? "DIFFER" : "same answers");
}

int main(void)
{
    SKIP_UNLESS_CUDA();
    pm_result r = PM_SUCCESS;
    cu = pm__cuda_api_load(&r);
    if (!cu) {
        fprintf(stderr, "the CUDA driver's entry points could not be loaded: %s\n",
                pm_last_error_detail());
        return 1;
    }
    CUdevice dev;
    CUcontext ctx;
    CHECK(cu->device_get(&dev, 0) == CUDA_SUCCESS);
    CHECK(cu->primary_ctx_retain(&ctx, dev) == CUDA_SUCCESS);
    CHECK(cu->ctx_push(ctx) == CUDA_SUCCESS);
    printf("sweep rows that differ: (object | call | pointer) | driver | pinmem | notes "
           "(layout-dependent: not counted)\n");
    for (size_t i = 0; i < contract_case_count; i++)
        compare(&contract_cases[i]);
    printf("contract rows: %d agree, %d differ; %d layout-dependent rows differ (not counted)\n",
           agreeing_rows, differing_rows, layout_rows);
    cross_api();
    show_driver_placement();
    return check_finish("differential");
}
#else
int main(void)
{
    SKIP("no CUDA driver (built without the CUDA headers)");
}
#endif
