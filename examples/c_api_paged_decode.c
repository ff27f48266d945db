/*
 * A decode step over a paged KV cache from C: k and v live in pages of 16
 * tokens ([num_pages, 16, nhead_k, hdim], vLLM's flash layout) that a block
 * table hands out per sequence; the plan is fwd_pagedkv then the split-KV
 * combine (or one split writing O itself), with a caller-owned workspace.
 * Every output row, the empty sequence's included, is then checked against a
 * float64 reference over the sequence's keys gathered through the table on the
 * host; exits 1 on a mismatch.
 *
 *   cc examples/c_api_paged_decode.c -I$(python -c "import ckfmha; print(ckfmha.get_include()[1])") \
 *      -L$(python -c "import ckfmha; print(ckfmha.get_library_dir())") -lckfmha \
 *      -Wl,-rpath,$(python -c "import ckfmha; print(ckfmha.get_library_dir())") -lm \
 *      -o c_api_paged_decode
 */
#include "c_api_example.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { BATCH = 4, HEADS_Q = 32, HEADS_K = 8, HDIM = 128, PAGE = 16, MAX_PAGES = 256 };

int main(void) {
  const int32_t lengths[BATCH] = {4096, 17, 1000, 0}; /* keys cached per sequence */
  const int num_pages = BATCH * MAX_PAGES;

  ckfmha_fwd_problem problem;
  CHECK(ckfmha_fwd_problem_init(&problem, CKFMHA_DTYPE_BF16, CKFMHA_LAYOUT_BHSD, BATCH, HEADS_Q,
                                HEADS_K, 1, MAX_PAGES * PAGE, HDIM, HDIM));
  problem.mask = CKFMHA_MASK_CAUSAL_BOTTOM_RIGHT;
  problem.kv_storage = CKFMHA_KV_PAGED_TABLE;
  problem.page_layout = CKFMHA_PAGE_LAYOUT_LINEAR;
  problem.page_size = PAGE;
  problem.max_pages_per_seq = MAX_PAGES;
  problem.block_table_stride = MAX_PAGES;
  problem.num_pages = num_pages; /* kernels check every page id against it */
  /* (page, head, token in page) strides of [num_pages, PAGE, HEADS_K, HDIM]. */
  problem.k_stride[0] = problem.v_stride[0] = (int64_t)PAGE * HEADS_K * HDIM;
  problem.k_stride[1] = problem.v_stride[1] = HDIM;
  problem.k_stride[2] = problem.v_stride[2] = (int64_t)HEADS_K * HDIM;

  size_t bytes = 0;
  CHECK(ckfmha_fwd_workspace_size(&problem, 90, NULL, &bytes));
  printf("sm_90 paged plan needs a %zu-byte workspace\n", bytes);

  RETURN_IF_NO_GPU();
  CHECK(ckfmha_fwd_workspace_size(&problem, -1, NULL, &bytes));
  size_t q_elems = (size_t)BATCH * HEADS_Q * HDIM;
  size_t cache_elems = (size_t)num_pages * PAGE * HEADS_K * HDIM;
  uint16_t* host_q = malloc(q_elems * sizeof *host_q);
  uint16_t* host_k = malloc(cache_elems * sizeof *host_k);
  uint16_t* host_v = malloc(cache_elems * sizeof *host_v);
  uint16_t* host_o = malloc(q_elems * sizeof *host_o);
  fill_random_bf16(host_q, q_elems, 1);
  fill_random_bf16(host_k, cache_elems, 2);
  fill_random_bf16(host_v, cache_elems, 3);
  /* Sequence b owns pages b, b + BATCH, b + 2 * BATCH, ...: interleaved, not contiguous. */
  int32_t* table = malloc(sizeof(int32_t) * BATCH * MAX_PAGES);
  for (int b = 0; b < BATCH; ++b) {
    for (int p = 0; p < MAX_PAGES; ++p) table[b * MAX_PAGES + p] = p * BATCH + b;
  }
  void *q, *k, *v, *o, *block_table, *seqlens_k, *workspace = NULL;
  CHECK(upload(&q, host_q, q_elems * 2));
  CHECK(upload(&k, host_k, cache_elems * 2));
  CHECK(upload(&v, host_v, cache_elems * 2));
  CHECK(upload(&block_table, table, sizeof(int32_t) * BATCH * MAX_PAGES));
  CHECK(upload(&seqlens_k, lengths, sizeof lengths));
  CHECK(ckfmha_device_malloc(&o, q_elems * 2));
  if (bytes > 0) CHECK(ckfmha_device_malloc(&workspace, bytes));

  ckfmha_fwd_args args = {.q = q, .k = k, .v = v, .o = o, .workspace = workspace,
                          .workspace_bytes = bytes, .block_table = block_table,
                          .seqlens_k = seqlens_k};
  CHECK(ckfmha_fwd_run(&problem, &args, NULL, NULL));
  CHECK(ckfmha_stream_synchronize(NULL));
  CHECK(ckfmha_memcpy_to_host(host_o, o, q_elems * 2));

  /* Key j of sequence b: slot j % PAGE of page table[b][j / PAGE]; query head h
   * reads K/V head h / (HEADS_Q / HEADS_K), every cached key visible. */
  const uint16_t** k_rows = malloc(MAX_PAGES * PAGE * sizeof *k_rows);
  const uint16_t** v_rows = malloc(MAX_PAGES * PAGE * sizeof *v_rows);
  double* weights = malloc(MAX_PAGES * PAGE * sizeof *weights);
  double error_sq = 0.0, reference_sq = 0.0;
  for (int b = 0; b < BATCH; ++b) {
    for (int h = 0; h < HEADS_Q; ++h) {
      const int kv_head = h / (HEADS_Q / HEADS_K);
      for (int j = 0; j < lengths[b]; ++j) {
        size_t token = (size_t)table[b * MAX_PAGES + j / PAGE] * PAGE + j % PAGE;
        k_rows[j] = host_k + (token * HEADS_K + kv_head) * HDIM;
        v_rows[j] = host_v + (token * HEADS_K + kv_head) * HDIM;
      }
      size_t row = ((size_t)b * HEADS_Q + h) * HDIM;
      add_attention_row_error(float_from_bf16, host_q + row, k_rows, v_rows, lengths[b], HDIM,
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
  ckfmha_device_free(block_table);
  ckfmha_device_free(seqlens_k);
  if (workspace) ckfmha_device_free(workspace);
  free(host_q);
  free(host_k);
  free(host_v);
  free(host_o);
  free(table);
  free(k_rows);
  free(v_rows);
  free(weights);
  if (!ok) fprintf(stderr, "output differs from the reference\n");
  return ok ? 0 : 1;
}
