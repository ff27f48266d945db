/*
 * Appending to a KV cache from C: a decode step writes SEQLEN_NEW new key and
 * value tokens per sequence into a contiguous bf16 cache
 * [batch, MAX_CACHE, heads, hdim], each sequence from its own length on, the
 * keys rotated at their cache positions with half-rotated (GPT-NeoX) RoPE over
 * the first ROTARY_DIM head-dim columns. The host then reads the whole cache
 * back: appended keys must match a float rotation of the new keys, appended
 * values and the unrotated key columns must be the new bits, and every other
 * row must still hold what was there before. Exits 1 on any mismatch.
 *
 *   cc examples/c_api_append_kv.c -I$(python -c "import ckfmha; print(ckfmha.get_include()[1])") \
 *      -L$(python -c "import ckfmha; print(ckfmha.get_library_dir())") -lckfmha \
 *      -Wl,-rpath,$(python -c "import ckfmha; print(ckfmha.get_library_dir())") -lm \
 *      -o c_api_append_kv
 */
#include "c_api_example.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BATCH = 4, HEADS_K = 8, HDIM = 128, ROTARY_DIM = 64, SEQLEN_NEW = 3, MAX_CACHE = 256 };
enum { HALF = ROTARY_DIM / 2 };

/* The kernel rounds its fp32 rotation to bf16 once; a host float rotation may
 * land on the neighbouring bf16 value (at most 2^-7 of the magnitude away). */
static int rotated_close(uint16_t got, float want) {
  return fabsf(float_from_bf16(got) - want) <= 1e-2f * fabsf(want) + 1e-5f;
}

/* Element (b, s, h, d) of a contiguous [batch, seq, heads, hdim] tensor with `seqlen` rows. */
static size_t at(int b, int s, int h, int d, int seqlen) {
  return (((size_t)b * seqlen + s) * HEADS_K + h) * HDIM + d;
}

/* A rotated key row: columns below ROTARY_DIM within one bf16 rounding of the
 * float rotation at `pos`, the others the new key's bits. */
static int key_row_ok(const uint16_t* got, const uint16_t* key, int pos, const float* cos_table,
                      const float* sin_table) {
  for (int i = 0; i < HALF; ++i) {
    const float c = cos_table[pos * HALF + i], s = sin_table[pos * HALF + i];
    const float x = float_from_bf16(key[i]), y = float_from_bf16(key[i + HALF]);
    if (!rotated_close(got[i], x * c - y * s) || !rotated_close(got[i + HALF], x * s + y * c)) {
      return 0;
    }
  }
  return memcmp(got + ROTARY_DIM, key + ROTARY_DIM, (HDIM - ROTARY_DIM) * sizeof *got) == 0;
}

/* The (row, head) vectors of sequence b's key and value caches that differ from
 * what the append should leave: new tokens at rows length..length+SEQLEN_NEW-1
 * (values bit for bit), every other row as it was before. */
static long wrong_rows(int b, int length, const uint16_t* k_cache, const uint16_t* v_cache,
                       const uint16_t* k_before, const uint16_t* v_before, const uint16_t* k_new,
                       const uint16_t* v_new, const float* cos_table, const float* sin_table) {
  const size_t bytes = HDIM * sizeof *k_cache;
  long wrong = 0;
  for (int s = 0; s < MAX_CACHE; ++s) {
    const int t = s - length; /* the new token this row holds, if any */
    for (int h = 0; h < HEADS_K; ++h) {
      const size_t row = at(b, s, h, 0, MAX_CACHE);
      if (t < 0 || t >= SEQLEN_NEW) {
        wrong += memcmp(k_cache + row, k_before + row, bytes) != 0;
        wrong += memcmp(v_cache + row, v_before + row, bytes) != 0;
      } else {
        const size_t token = at(b, t, h, 0, SEQLEN_NEW);
        wrong += !key_row_ok(k_cache + row, k_new + token, s, cos_table, sin_table);
        wrong += memcmp(v_cache + row, v_new + token, bytes) != 0;
      }
    }
  }
  return wrong;
}

int main(void) {
  /* Keys cached per sequence: an empty one, and one the append fills to the last row. */
  const int32_t lengths[BATCH] = {0, 17, 200, MAX_CACHE - SEQLEN_NEW};

  ckfmha_appendkv_problem problem;
  CHECK(ckfmha_appendkv_problem_init(&problem, CKFMHA_DTYPE_BF16, CKFMHA_LAYOUT_BSHD, BATCH,
                                     HEADS_K, SEQLEN_NEW, MAX_CACHE, HDIM, HDIM));
  problem.rope = CKFMHA_ROPE_HALF_ROTATED;
  problem.rotary_dim = ROTARY_DIM;
  problem.rope_dtype = CKFMHA_DTYPE_FP32;
  problem.rope_max_pos = MAX_CACHE; /* an angle row for every cache position */
  problem.cos_stride = problem.sin_stride = HALF;

  char name[256];
  CHECK(ckfmha_appendkv_select(&problem, 90, name, sizeof name));
  printf("sm_90 would run %s\n", name);

  RETURN_IF_NO_GPU();
  const size_t new_elems = (size_t)BATCH * SEQLEN_NEW * HEADS_K * HDIM;
  const size_t cache_elems = (size_t)BATCH * MAX_CACHE * HEADS_K * HDIM;
  const size_t table_elems = (size_t)MAX_CACHE * HALF;
  uint16_t* k_new = malloc(new_elems * sizeof *k_new);
  uint16_t* v_new = malloc(new_elems * sizeof *v_new);
  uint16_t* k_before = malloc(cache_elems * sizeof *k_before);
  uint16_t* v_before = malloc(cache_elems * sizeof *v_before);
  uint16_t* k_after = malloc(cache_elems * sizeof *k_after);
  uint16_t* v_after = malloc(cache_elems * sizeof *v_after);
  float* cos_table = malloc(table_elems * sizeof *cos_table);
  float* sin_table = malloc(table_elems * sizeof *sin_table);
  fill_random_bf16(k_new, new_elems, 1);
  fill_random_bf16(v_new, new_elems, 2);
  /* Earlier tokens: values the append must leave alone. */
  fill_random_bf16(k_before, cache_elems, 3);
  fill_random_bf16(v_before, cache_elems, 4);
  /* The usual angle tables: entry i of row p is p * 10000^(-2i / ROTARY_DIM). */
  for (int p = 0; p < MAX_CACHE; ++p) {
    for (int i = 0; i < HALF; ++i) {
      const double angle = p * pow(10000.0, -2.0 * i / ROTARY_DIM);
      cos_table[p * HALF + i] = (float)cos(angle);
      sin_table[p * HALF + i] = (float)sin(angle);
    }
  }

  void *d_k_new, *d_v_new, *d_k_cache, *d_v_cache, *d_lengths, *d_cos, *d_sin, *d_overflow;
  CHECK(upload(&d_k_new, k_new, new_elems * 2));
  CHECK(upload(&d_v_new, v_new, new_elems * 2));
  CHECK(upload(&d_k_cache, k_before, cache_elems * 2));
  CHECK(upload(&d_v_cache, v_before, cache_elems * 2));
  CHECK(upload(&d_lengths, lengths, sizeof lengths));
  CHECK(upload(&d_cos, cos_table, table_elems * sizeof *cos_table));
  CHECK(upload(&d_sin, sin_table, table_elems * sizeof *sin_table));
  CHECK(ckfmha_device_malloc(&d_overflow, sizeof(int32_t)));
  CHECK(ckfmha_memset_device(d_overflow, 0, sizeof(int32_t)));

  /* The host copy of the lengths lets the call refuse an append past the
   * cache or the angle tables before launching; the device copy is what the
   * kernel reads, and the overflow flag reports any token it had to skip. */
  ckfmha_appendkv_args args = {.k_new = d_k_new, .v_new = d_v_new, .k_cache = d_k_cache,
                               .v_cache = d_v_cache, .cache_seqlens = d_lengths,
                               .cache_seqlens_host = lengths, .cos = d_cos, .sin = d_sin,
                               .overflow = d_overflow};
  CHECK(ckfmha_appendkv_run(&problem, &args, NULL, NULL));
  CHECK(ckfmha_stream_synchronize(NULL));
  int32_t overflow = -1;
  CHECK(ckfmha_memcpy_to_host(k_after, d_k_cache, cache_elems * 2));
  CHECK(ckfmha_memcpy_to_host(v_after, d_v_cache, cache_elems * 2));
  CHECK(ckfmha_memcpy_to_host(&overflow, d_overflow, sizeof overflow));

  long wrong = 0;
  for (int b = 0; b < BATCH; ++b) {
    const long seq_wrong = wrong_rows(b, lengths[b], k_after, v_after, k_before, v_before, k_new,
                                      v_new, cos_table, sin_table);
    printf("sequence %d: rows %d..%d appended, %ld of %d key/value rows wrong\n", b, lengths[b],
           lengths[b] + SEQLEN_NEW - 1, seq_wrong, 2 * MAX_CACHE * HEADS_K);
    wrong += seq_wrong;
  }
  printf("%s: %d new tokens x %d sequences x %d heads, RoPE on %d of %d columns, "
         "overflow flag %d\n",
         wrong == 0 && overflow == 0 ? "ok" : "MISMATCH", SEQLEN_NEW, BATCH, HEADS_K, ROTARY_DIM,
         HDIM, overflow);

  ckfmha_device_free(d_k_new);
  ckfmha_device_free(d_v_new);
  ckfmha_device_free(d_k_cache);
  ckfmha_device_free(d_v_cache);
  ckfmha_device_free(d_lengths);
  ckfmha_device_free(d_cos);
  ckfmha_device_free(d_sin);
  ckfmha_device_free(d_overflow);
  free(k_new);
  free(v_new);
  free(k_before);
  free(v_before);
  free(k_after);
  free(v_after);
  free(cos_table);
  free(sin_table);
  return wrong == 0 && overflow == 0 ? 0 : 1;
}
