/* The rows of docs/driver-behavior.md, written once as cases over an
 * abstract host-memory API. test_contract runs them against pinmem and
 * checks the expected answers; test_differential runs them against the raw
 * driver and pinmem and requires the same answers from both. */
#ifndef PINMEM_CONTRACT_CASES_H
#define PINMEM_CONTRACT_CASES_H

#include <stddef.h>

typedef struct host_api {
    const char *name;
    int (*alloc_host)(void **pp, size_t bytesize);
    int (*host_alloc)(void **pp, size_t bytesize, unsigned flags);
    int (*free_host)(void *p);
    int (*host_register)(void *p, size_t bytesize, unsigned flags);
    int (*host_unregister)(void *p);
    int (*get_device_pointer)(unsigned long long *pdptr, void *p, unsigned flags);
    int (*get_flags)(unsigned *pflags, void *p);
    int (*get_address_range)(unsigned long long *pbase, size_t *psize, unsigned long long dptr);
    /* Optional: what this side knows of address q that its answers may not
     * show (pinmem: "pinmem's pages" for pages it pinned outside the bytes
     * it was asked for, which answer as pageable memory). */
    void (*describe)(const void *q, char *out, size_t cap);
} host_api;

/* One answer. answer (optional) spells it out for comparing two sides: the
 * code and the values returned, relative to the object probed ("SUCCESS
 * base=p size=100"); note (optional) says something about the address that
 * may differ between the sides and explains a difference ("unmapped"). */
typedef struct observation {
    char label[112];
    long long got, expected;
    char answer[48];
    char note[24];
} observation;

/* expected for rows the spec's table does not settle: test_contract does
 * not check them; test_differential compares the driver's and pinmem's. */
#define EXPECT_UNKNOWN (-0x7fffffffffffffffll)
/* expected for rows whose answer depends on what lies beside the object
 * (memory the allocator placed there, which differs between the sides):
 * checked by neither test; test_differential prints them where they differ. */
#define EXPECT_LAYOUT (-0x7ffffffffffffffell)
/* got for a call that succeeded but returned the wrong value. */
#define GOT_WRONG_VALUE (-2ll)

typedef struct case_log {
    observation obs[320];
    int n;
} case_log;

typedef struct contract_case {
    const char *name; /* "section/row"; "sweep/..." cases probe every pointer
                         around an object, one observation per call and pointer */
    void (*run)(const host_api *api, case_log *log);
} contract_case;

extern const contract_case contract_cases[];
extern const size_t contract_case_count;

/* pinmem's own API in host_api form. */
extern const host_api pinmem_host_api;

#endif
