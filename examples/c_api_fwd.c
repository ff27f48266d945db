/*
 * The C API from plain C: describe a problem, pick a kernel, run it, and check
 * every output row against a float64 reference on the host (exits 1 on a
 * mismatch). fp16, causal (top-left: query i sees keys 0..i).
 *
 *   cc examples/c_api_fwd.c -I$(python -c "import ckfmha; print(ckfmha.get_include()[1])") \
 *      -L$(python -c "import ckfmha; print(ckfmha.get_library_dir())") -lckfmha \
 *      -Wl,-rpath,$(python -c "import ckfmha; print(ckfmha.get_library_dir())") -lm -o c_api_fwd
 */
#include "c_api_example.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { BATCH = 2, HEADS = 8, SEQLEN = 512, HDIM = 64 };

int main(void) {
  ckfmha_fwd_problem problem;
  CHECK(ckfmha_fwd_problem_init(&problem, CKFMHA_DTYPE_FP16, CKFMHA_LAYOUT_BHSD, BATCH, HEADS,
                                HEADS, SEQLEN, SEQLEN, HDIM, HDIM));
  problem.mask = CKFMHA_MASK_CAUSAL_TOP_LEFT;

  char name[256];
  CHECK(ckfmha_fwd_select(&problem, 90, name, sizeof name));
  printf("sm_90 would run %s\n", name);

  RETURN_IF_NO_GPU();
  size_t elems = (size_t)BATCH * HEADS * SEQLEN * HDIM;
  uint16_t* host_q = malloc(elems * sizeof *host_q);
  uint16_t* host_k = malloc(elems * sizeof *host_k);
  uint16_t* host_v = malloc(elems * sizeof *host_v);
  uint16_t* host_o = malloc(elems * sizeof *host_o);
  fill_random_fp16(host_q, elems, 1);
  fill_random_fp16(host_k, elems, 2);
  fill_random_fp16(host_v, elems, 3);
  void *q, *k, *v, *o;
  CHECK(upload(&q, host_q, elems * 2));
  CHECK(upload(&k, host_k, elems * 2));
  CHECK(upload(&v, host_v, elems * 2));
  CHECK(ckfmha_device_malloc(&o, elems * 2));
  ckfmha_fwd_args args = {.q = q, .k = k, .v = v, .o = o};
  CHECK(ckfmha_fwd_run(&problem, &args, NULL, NULL));
  CHECK(ckfmha_stream_synchronize(NULL));
  CHECK(ckfmha_memcpy_to_host(host_o, o, elems * 2));

  /* Rows of head (b, h) are SEQLEN apart; query i attends to keys 0..i. */
  const uint16_t* k_rows[SEQLEN];
  const uint16_t* v_rows[SEQLEN];
  double weights[SEQLEN];
  double error_sq = 0.0, reference_sq = 0.0;
  for (size_t head = 0; head < (size_t)BATCH * HEADS; ++head) {
    for (int j = 0; j < SEQLEN; ++j) {
      k_rows[j] = host_k + (head * SEQLEN + j) * HDIM;
      v_rows[j] = host_v + (head * SEQLEN + j) * HDIM;
    }
    for (int i = 0; i < SEQLEN; ++i) {
      size_t row = (head * SEQLEN + i) * HDIM;
      add_attention_row_error(float_from_fp16, host_q + row, k_rows, v_rows, i + 1, HDIM,
                              problem.scale, host_o + row, weights, &error_sq, &reference_sq);
    }
  }
  const double relative = sqrt(error_sq / reference_sq);
  printf("relative L2 error against a float64 reference: %.2e over %d rows\n", relative,
         BATCH * HEADS * SEQLEN);
  const int ok = relative < 5e-3; /* fp16 probabilities and outputs */
  ckfmha_device_free(q);
  ckfmha_device_free(k);
  ckfmha_device_free(v);
  ckfmha_device_free(o);
  free(host_q);
  free(host_k);
  free(host_v);
  free(host_o);
  if (!ok) fprintf(stderr, "output differs from the reference\n");
  return ok ? 0 : 1;
}
