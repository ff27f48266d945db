/*
 * The C API from plain C: describe a problem, pick a kernel, run it.
 *
 *   cc examples/c_api_fwd.c -I$(python -c "import ckfmha; print(ckfmha.get_include()[1])") \
 *      -L$(python -c "import ckfmha; print(ckfmha.get_library_dir())") -lckfmha \
 *      -Wl,-rpath,$(python -c "import ckfmha; print(ckfmha.get_library_dir())") -o c_api_fwd
 */
#include "c_api_example.h"

#include <stdio.h>
#include <stdlib.h>

int main(void) {
  ckfmha_fwd_problem problem;
  CHECK(ckfmha_fwd_problem_init(&problem, CKFMHA_DTYPE_FP16, CKFMHA_LAYOUT_BHSD, 2, 8, 8, 512,
                                512, 64, 64));
  problem.mask = CKFMHA_MASK_CAUSAL_TOP_LEFT;

  char name[256];
  CHECK(ckfmha_fwd_select(&problem, 90, name, sizeof name));
  printf("sm_90 would run %s\n", name);

  RETURN_IF_NO_GPU();
  size_t elems = (size_t)2 * 8 * 512 * 64;
  unsigned short* host = malloc(elems * sizeof *host);
  fill_pattern(host, elems, 1024); /* fp16 */
  void *q, *k, *v, *o;
  CHECK(upload(&q, host, elems * 2));
  CHECK(upload(&k, host, elems * 2));
  CHECK(upload(&v, host, elems * 2));
  CHECK(ckfmha_device_malloc(&o, elems * 2));
  ckfmha_fwd_args args = {.q = q, .k = k, .v = v, .o = o};
  CHECK(ckfmha_fwd_run(&problem, &args, NULL, NULL));
  CHECK(ckfmha_stream_synchronize(NULL));
  CHECK(ckfmha_memcpy_to_host(host, o, elems * 2));
  printf("o[0] bits = 0x%04x\n", host[0]);
  ckfmha_device_free(q);
  ckfmha_device_free(k);
  ckfmha_device_free(v);
  ckfmha_device_free(o);
  free(host);
  return 0;
}
