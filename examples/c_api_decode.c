/*
 * A decode step from C: the dispatcher plans split-KV (fwd_splitkv, then
 * fwd_splitkv_combine, or one split writing O itself) for one query row per
 * sequence against a long KV cache; the caller owns the workspace the plan
 * needs. Every output row is then checked against a float64 reference on the
 * host; exits 1 on a mismatch.
 *
 *   cc examples/c_api_decode.c -I$(python -c "import ckfmha; print(ckfmha.get_include()[1])") \
 *      -L$(python -c "import ckfmha; print(ckfmha.get_library_dir())") -lckfmha \
 *      -Wl,-rpath,$(python -c "import ckfmha; print(ckfmha.get_library_dir())") -lm -o c_api_decode
 */
#include "c_api_example.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { BATCH = 4, HEADS_Q = 32, HEADS_K = 8, SEQLEN_K = 8192, HDIM = 128 };

int main(void) {
  /* One new token per sequence, GQA 32/8, bf16, attending to its whole cache. */
  ckfmha_fwd_problem problem;
  CHECK(ckfmha_fwd_problem_init(&problem, CKFMHA_DTYPE_BF16, CKFMHA_LAYOUT_BHSD, BATCH, HEADS_Q,
                                HEADS_K, 1, SEQLEN_K, HDIM, HDIM));
  problem.mask = CKFMHA_MASK_CAUSAL_BOTTOM_RIGHT;
  problem.num_splits = 0; /* let the dispatcher choose; 1 would force one stage */

  /* The plan and its workspace for an H100-class part, without a GPU. */
  size_t bytes = 0;
  CHECK(ckfmha_fwd_workspace_size(&problem, 90, NULL, &bytes));
  printf("sm_90 plan needs a %zu-byte workspace\n", bytes);

  RETURN_IF_NO_GPU();
  CHECK(ckfmha_fwd_workspace_size(&problem, -1, NULL, &bytes)); /* this device's plan */
  size_t q_elems = (size_t)BATCH * HEADS_Q * HDIM;
  size_t kv_elems = (size_t)BATCH * HEADS_K * SEQLEN_K * HDIM;
  uint16_t* host_q = malloc(q_elems * sizeof *host_q);
  uint16_t* host_k = malloc(kv_elems * sizeof *host_k);
  uint16_t* host_v = malloc(kv_elems * sizeof *host_v);
  uint16_t* host_o = malloc(q_elems * sizeof *host_o);
  fill_random_bf16(host_q, q_elems, 1);
  fill_random_bf16(host_k, kv_elems, 2);
  fill_random_bf16(host_v, kv_elems, 3);
  void *q, *k, *v, *o, *workspace = NULL;
  CHECK(upload(&q, host_q, q_elems * 2));
  CHECK(upload(&k, host_k, kv_elems * 2));
  CHECK(upload(&v, host_v, kv_elems * 2));
  CHECK(ckfmha_device_malloc(&o, q_elems * 2));
  if (bytes > 0) CHECK(ckfmha_device_malloc(&workspace, bytes));

  ckfmha_fwd_args args = {
      .q = q, .k = k, .v = v, .o = o, .workspace = workspace, .workspace_bytes = bytes};
  CHECK(ckfmha_fwd_run(&problem, &args, NULL, NULL));
  CHECK(ckfmha_stream_synchronize(NULL));
  CHECK(ckfmha_memcpy_to_host(host_o, o, q_elems * 2));

  /* Query head h reads K/V head h / (HEADS_Q / HEADS_K); with one query row the
   * bottom-right causal mask leaves every cached key visible. */
  const uint16_t** k_rows = malloc(SEQLEN_K * sizeof *k_rows);
  const uint16_t** v_rows = malloc(SEQLEN_K * sizeof *v_rows);
  double* weights = malloc(SEQLEN_K * sizeof *weights);
  double error_sq = 0.0, reference_sq = 0.0;
  for (int b = 0; b < BATCH; ++b) {
    for (int h = 0; h < HEADS_Q; ++h) {
      size_t kv_head = (size_t)b * HEADS_K + h / (HEADS_Q / HEADS_K);
      for (int j = 0; j < SEQLEN_K; ++j) {
        k_rows[j] = host_k + (kv_head * SEQLEN_K + j) * HDIM;
        v_rows[j] = host_v + (kv_head * SEQLEN_K + j) * HDIM;
      }
      size_t row = ((size_t)b * HEADS_Q + h) * HDIM;
      add_attention_row_error(float_from_bf16, host_q + row, k_rows, v_rows, SEQLEN_K, HDIM,
                              problem.scale, host_o + row, weights, &error_sq, &reference_sq);
    }
  }
  const double relative = sqrt(error_sq / reference_sq);
  printf("relative L2 error against a float64 reference: %.2e over %d rows\n", relative,
         BATCH * HEADS_Q);
  const int ok = relative < 1e-2; /* bf16 probabilities and outputs */
  ckfmha_device_free(q);
  ckfmha_device_free(k);
  ckfmha_device_free(v);
  ckfmha_device_free(o);
  if (workspace) ckfmha_device_free(workspace);
  free(host_q);
  free(host_k);
  free(host_v);
  free(host_o);
  free(k_rows);
  free(v_rows);
  free(weights);
  if (!ok) fprintf(stderr, "output differs from the reference\n");
  return ok ? 0 : 1;
}
