#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "pinmem.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(int argc,char**argv){
  int n = 1000000; size_t sz = argc>1?strtoul(argv[1],0,10):64;
  pm_mem_pool_t pool; pm_mem_pool_props pr={.location={PM_MEM_LOCATION_TYPE_HOST,0}};
  if(pm_mem_pool_create(&pool,&pr)) return 1;
  void*p; double bp=1e9,bg=1e9;
  for(int r=0;r<40;r++){
  double t0=now();
  for(int i=0;i<n;i++){ pm_mem_alloc_from_pool(&p,sz,pool); pm_mem_free(p);}
  double t1=now();
  for(int i=0;i<n;i++){ p=malloc(sz); __asm__ volatile(""::"r"(p):"memory"); free(p);}
  double t2=now();
  if((t1-t0)/n<bp)bp=(t1-t0)/n; if((t2-t1)/n<bg)bg=(t2-t1)/n;}
  printf("size %zu: pinmem min %.2f ns  glibc min %.2f ns  ratio %.2f\n",sz,bp,bg,bp/bg);
  return 0;
}
