#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "pinmem.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static pm_mem_pool_t pool; static long N=20000000;
static void *run(void *a){ (void)a; void *p; for(long i=0;i<N;i++){pm_mem_alloc_from_pool(&p,4096,pool); pm_mem_free(p);} return NULL;}
int main(int argc,char**argv){ int n=atoi(argv[1]); pm_mem_pool_props pr={.location={PM_MEM_LOCATION_TYPE_HOST,0}}; pm_mem_pool_create(&pool,&pr);
 pthread_t t[64]; double t0=now(); for(int i=0;i<n;i++) pthread_create(&t[i],0,run,0); for(int i=0;i<n;i++) pthread_join(t[i],0);
 printf("%d threads: %.1f M pairs/s\n", n, n*N/((now()-t0)/1e3)); return 0;}
