#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "pinmem.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(int argc,char**argv){
  int n = argc>1?atoi(argv[1]):10000000;
  pm_mem_pool_t pool; pm_mem_pool_props pr={.location={PM_MEM_LOCATION_TYPE_HOST,0}};
  if(pm_mem_pool_create(&pool,&pr)) return 1;
  void*p;
  for(int r=0;r<5;r++){
  double t0=now();
  for(int i=0;i<n;i++){ pm_mem_alloc_from_pool(&p,64,pool); pm_mem_free(p);} 
  double t1=now();
  for(int i=0;i<n;i++){ p=malloc(64); __asm__ volatile(""::"r"(p):"memory"); free(p);} 
  double t2=now();
  printf("pinmem %.1f ns  glibc %.1f ns\n",(t1-t0)/n,(t2-t1)/n);}
  return 0;
}
