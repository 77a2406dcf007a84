/* The spec's rows (contract_cases.c) against pinmem, on whatever backend this
 * process gets. argv[1] picks the section ("alloc", "flags", ...). */
#include <string.h>

#include "check.h"
#include "contract_cases.h"

int main(int argc, char **argv)
{
    const char *section = argc > 1 ? argv[1] : "";
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    printf("backend: %s\n", pm_backend_name());
    int ran = 0;
    for (size_t i = 0; i < contract_case_count; i++) {
        const contract_case *c = &contract_cases[i];
        if (strncmp(c->name, section, strlen(section)) != 0)
            continue;
        case_log log = {0};
        c->run(&pinmem_host_api, &log);
        ran++;
        for (int k = 0; k < log.n; k++) {
            const observation *o = &log.obs[k];
            if (o->got != o->expected) {
                fprintf(stderr, "%s: %s: got %lld, expected %lld\n", c->name, o->label, o->got,
                        o->expected);
                check_failures++;
            }
        }
        printf("%-26s %d rows\n", c->name, log.n);
    }
    CHECK(ran > 0);
    return check_finish("contract");
}
