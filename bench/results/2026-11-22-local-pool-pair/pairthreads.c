/* 4 KiB pool pairs in six new threads one after another, then in the main
 * thread: best of 5 x 2,000,000 each. gcc -O2 -Iinclude pairthreads.c build/libpinmem.a -lpthread -ldl -lm */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "pinmem.h"
static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1e9+t.tv_nsec;}
static pm_mem_pool_t pool;
static void *run(void *arg){
  void *p; for(int i=0;i<100000;i++){pm_mem_alloc_from_pool(&p,4096,pool); pm_mem_free(p);}
  double best=1e9;
  for(int r=0;r<5;r++){double t0=now(); for(int i=0;i<2000000;i++){pm_mem_alloc_from_pool(&p,4096,pool); pm_mem_free(p);} double ns=(now()-t0)/2e6; if(ns<best)best=ns;}
  printf("thread: block %p, stack %p: %.1f ns\n", p, (void*)&p, best);
  return NULL;
}
int main(void){
  pm_init(0);
  pm_mem_pool_props props={.location={PM_MEM_LOCATION_TYPE_HOST,0}};
  pm_mem_pool_create(&pool,&props);
  for(int k=0;k<6;k++){pthread_t t; pthread_create(&t,NULL,run,NULL); pthread_join(t,NULL);}
  run(NULL);
  return 0;
}
