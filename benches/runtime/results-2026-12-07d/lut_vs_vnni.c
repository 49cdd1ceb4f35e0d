#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define NTRI 86
#ifndef TT
#define TT 8
#endif
// LUT kernel: RG row groups of 32, NB blocks, NT tokens (multiple of TT)
__attribute__((noinline)) void lut(const __m512i* idx, const __m512i* tab, int RG, int NB, int NT, int32_t* out){
  memset(out,0,(size_t)RG*NT*32*4);
  for(int b=0;b<NB;b++){
    for(int rg=0; rg<RG; rg++){
      const __m512i* ib = idx + ((size_t)rg*NB + b)*NTRI;
      for(int t0=0; t0<NT; t0+=TT){
        __m512i a[TT];
        for(int t=0;t<TT;t++) a[t]=_mm512_setzero_si512();
        const __m512i* tb = tab + ((size_t)b*NT + t0)*NTRI;
        for(int m=0;m<NTRI;m++){
          __m512i i = _mm512_loadu_si512(ib+m);
          for(int t=0;t<TT;t++) a[t] = _mm512_add_epi16(a[t], _mm512_permutexvar_epi16(i, _mm512_loadu_si512(tb + t*NTRI + m)));
        }
        for(int t=0;t<TT;t++){
          int32_t* o=out+((size_t)(rg*NT+t0+t))*32;
          _mm512_storeu_si512(o, _mm512_add_epi32(_mm512_loadu_si512(o), _mm512_cvtepi16_epi32(_mm512_castsi512_si256(a[t]))));
          _mm512_storeu_si512(o+16, _mm512_add_epi32(_mm512_loadu_si512(o+16), _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(a[t],1))));
        }
      }
    }
  }
}

#ifndef GR
#define GR 4
#endif
#ifndef GT
#define GT 4
#endif
__attribute__((noinline)) void lut2(const __m512i* idx, const __m512i* tab, int RG, int NB, int NT, int32_t* out){
  memset(out,0,(size_t)RG*NT*32*4);
  for(int b=0;b<NB;b++){
    for(int rg=0; rg<RG; rg+=GR){
      for(int t0=0; t0<NT; t0+=GT){
        __m512i a[GR][GT];
        for(int r=0;r<GR;r++)for(int t=0;t<GT;t++) a[r][t]=_mm512_setzero_si512();
        const __m512i* tb = tab + ((size_t)b*NT + t0)*NTRI;
        for(int m=0;m<NTRI;m++){
          __m512i tv[GT];
          for(int t=0;t<GT;t++) tv[t]=_mm512_loadu_si512(tb + t*NTRI + m);
          for(int r=0;r<GR;r++){
            __m512i i = _mm512_loadu_si512(idx + ((size_t)(rg+r)*NB + b)*NTRI + m);
            for(int t=0;t<GT;t++) a[r][t] = _mm512_add_epi16(a[r][t], _mm512_permutexvar_epi16(i, tv[t]));
          }
        }
        for(int r=0;r<GR;r++)for(int t=0;t<GT;t++){
          int32_t* o=out+((size_t)((rg+r)*NT+t0+t))*32;
          _mm512_storeu_si512(o, _mm512_add_epi32(_mm512_loadu_si512(o), _mm512_cvtepi16_epi32(_mm512_castsi512_si256(a[r][t]))));
          _mm512_storeu_si512(o+16, _mm512_add_epi32(_mm512_loadu_si512(o+16), _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(a[r][t],1))));
        }
      }
    }
  }
}
// VNNI kernel like tokens_rows<8,2,1>: R=8 rows, 2 groups of 16 tokens; c: unpacked codes [row][K/4] u32; x: [group][K/4] zmm
__attribute__((noinline)) void vnni(const uint32_t* c, const __m512i* x, int R8, int K, int NG, int32_t* out){
  int ng=K/4;
  for(int r0=0;r0<R8;r0++){
    for(int g0=0; g0<NG; g0+=2){
      __m512i ia[2][8];
      for(int g=0;g<2;g++)for(int r=0;r<8;r++) ia[g][r]=_mm512_setzero_si512();
      for(int gi=0; gi<ng; gi+=2){
        __m512i x00=_mm512_loadu_si512(x+(size_t)g0*ng+gi), x01=_mm512_loadu_si512(x+(size_t)g0*ng+gi+1);
        __m512i x10=_mm512_loadu_si512(x+(size_t)(g0+1)*ng+gi), x11=_mm512_loadu_si512(x+(size_t)(g0+1)*ng+gi+1);
        for(int r=0;r<8;r++){
          __m512i w0=_mm512_set1_epi32(c[(size_t)(r0*8+r)*ng+gi]), w1=_mm512_set1_epi32(c[(size_t)(r0*8+r)*ng+gi+1]);
          ia[0][r]=_mm512_dpbusd_epi32(ia[0][r],x00,w0); ia[0][r]=_mm512_dpbusd_epi32(ia[0][r],x01,w1);
          ia[1][r]=_mm512_dpbusd_epi32(ia[1][r],x10,w0); ia[1][r]=_mm512_dpbusd_epi32(ia[1][r],x11,w1);
        }
      }
      for(int g=0;g<2;g++)for(int r=0;r<8;r++) _mm512_storeu_si512(out+((size_t)((r0*8+r)*NG+g0+g))*16, ia[g][r]);
    }
  }
}
int main(int argc,char**argv){
  int K = argc>1?atoi(argv[1]):4096; int R=argc>2?atoi(argv[2]):512; int NT=argc>3?atoi(argv[3]):64;
  int NB=K/256; int RG=R/32;
  __m512i* idx=aligned_alloc(64,(size_t)RG*NB*NTRI*64); __m512i* tab=aligned_alloc(64,(size_t)NB*NT*NTRI*64);
  for(size_t i=0;i<(size_t)RG*NB*NTRI*32;i++) ((int16_t*)idx)[i]=rand()%27;
  for(size_t i=0;i<(size_t)NB*NT*NTRI*32;i++) ((int16_t*)tab)[i]=rand()%100-50;
  int32_t* out=aligned_alloc(64,(size_t)R*NT*4+4096);
  double best=1e9; double macs=(double)R*K*NT;
  best=1e9;
  for(int rep=0;rep<7;rep++){double t=now(); lut2(idx,tab,RG,NB,NT,out); t=now()-t; if(t<best)best=t;}
  printf("LUT2 GR=%d GT=%d: %.1f MAC/ns\n",GR,GT,macs/best*1e-9);
  best=1e9;
  for(int rep=0;rep<7;rep++){double t=now(); lut(idx,tab,RG,NB,NT,out); t=now()-t; if(t<best)best=t;}
  printf("LUT  K=%d R=%d T=%d TT=%d: %.3f ms, %.1f MAC/ns (table set per block %.0f KB)\n",K,R,NT,TT,best*1e3,macs/best*1e-9, NT*NTRI*64/1024.0);
  uint32_t* c=aligned_alloc(64,(size_t)R*K); for(size_t i=0;i<(size_t)R*K/4;i++) c[i]=rand()&0x03030303;
  int NG=NT/16; __m512i* x=aligned_alloc(64,(size_t)NG*K/4*64); memset(x,1,(size_t)NG*K/4*64);
  best=1e9;
  for(int rep=0;rep<7;rep++){double t=now(); vnni(c,x,R/8,K,NG,out); t=now()-t; if(t<best)best=t;}
  printf("VNNI K=%d R=%d T=%d: %.3f ms, %.1f MAC/ns\n",K,R,NT,best*1e3,macs/best*1e-9);
}
