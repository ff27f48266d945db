/*
 * A decode step from C: the dispatcher plans split-KV (fwd_splitkv, then
 * fwd_splitkv_combine) for one query row per sequence against a long KV cache;
 * the caller owns the workspace the plan needs.
 *
 *   cc examples/c_api_decode.c -I$(python -c "import ckfmha; print(ckfmha.get_include()[1])") \
 *      -L$(python -c "import ckfmha; print(ckfmha.get_library_dir())") -lckfmha \
 *      -Wl,-rpath,$(python -c "import ckfmha; print(ckfmha.get_library_dir())") -o c_api_decode
 */
#include "c_api_example.h"

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
  unsigned short* host = malloc(kv_elems * sizeof *host);
  fill_pattern(host, kv_elems, 128); /* bf16 */
  void *q, *k, *v, *o, *workspace = NULL;
  CHECK(upload(&q, host, q_elems * 2));
  CHECK(upload(&k, host, kv_elems * 2));
  CHECK(upload(&v, host, kv_elems * 2));
  CHECK(ckfmha_device_malloc(&o, q_elems * 2));
  if (bytes > 0) CHECK(ckfmha_device_malloc(&workspace, bytes));

  ckfmha_fwd_args args = {
      .q = q, .k = k, .v = v, .o = o, .workspace = workspace, .workspace_bytes = bytes};
  CHECK(ckfmha_fwd_run(&problem, &args, NULL, NULL));
  CHECK(ckfmha_stream_synchronize(NULL));
  CHECK(ckfmha_memcpy_to_host(host, o, q_elems * 2));
  printf("o[0] bits = 0x%04x\n", host[0]);
  ckfmha_device_free(q);
  ckfmha_device_free(k);
  ckfmha_device_free(v);
  ckfmha_device_free(o);
  if (workspace) ckfmha_device_free(workspace);
  free(host);
  return 0;
}
