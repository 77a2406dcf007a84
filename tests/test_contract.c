/* The spec's rows (contract_cases.c) against pinmem, on whatever backend this
 * process gets. argv[1] picks the section ("alloc", "flags", ...); --rows
 * after it prints every row's answer. Rows that depend on what lies beside
 * the object are printed, not checked. */
#include <stdbool.h>
#include <string.h>

#include "check.h"
#include "contract_cases.h"

int main(int argc, char **argv)
{
    const char *section = argc > 1 ? argv[1] : "";
    const bool rows = argc > 2 && strcmp(argv[2], "--rows") == 0;
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    printf("backend: %s\n", pm_backend_name());
    int ran = 0;
    for (size_t i = 0; i < contract_case_count; i++) {
        const contract_case *c = &contract_cases[i];
        if (strncmp(c->name, section, strlen(section)) != 0)
            continue;
        static case_log log;
        memset(&log, 0, sizeof log);
        c->run(&pinmem_host_api, &log);
        ran++;
        CHECK(log.n < (int)(sizeof log.obs / sizeof log.obs[0])); /* no row was dropped */
        int checked = 0, layout = 0;
        for (int k = 0; k < log.n; k++) {
            const observation *o = &log.obs[k];
            if (rows)
                printf("  %-62s %s%s%s%s\n", o->label, o->answer[0] ? o->answer : "",
                       o->note[0] ? "  " : "", o->note,
                       o->expected == EXPECT_LAYOUT ? "  (layout-dependent)" : "");
            layout += o->expected == EXPECT_LAYOUT;
            if (o->expected == EXPECT_UNKNOWN || o->expected == EXPECT_LAYOUT)
                continue; /* the differential test compares these with the driver */
            checked++;
            if (o->got == o->expected || !check_failed_())
                continue;
            if (o->answer[0]) /* a sweep's row: codes, and the values returned */
                fprintf(stderr, "%s: %s: got %s, expected %s\n", c->name, o->label, o->answer,
                        pm_result_name((pm_result)o->expected));
            else
                fprintf(stderr, "%s: %s: got %lld, expected %lld\n", c->name, o->label, o->got,
                        o->expected);
        }
        const int unknown = log.n - checked - layout;
        if (checked == log.n)
            printf("%-26s %d rows\n", c->name, log.n);
        else
            printf("%-26s %d rows, %d checked (the rest:%s%s%s)\n", c->name, log.n, checked,
                   unknown ? " no row in the spec's table" : "", unknown && layout ? ";" : "",
                   layout ? " what lies beside the object" : "");
    }
    CHECK(ran > 0);
    return check_finish("contract");
}
