/*
 * Plan selection from C: the same decode problem planned by the hand rules and
 * by the learned cost model (the model shipped beside the library, or one
 * given as the first argument), for an H100-class part, with no GPU needed.
 * explain lists each candidate's predicted time (a multiple of the hand rules'
 * plan's); the last line says which plan each source picks and why.
 *
 *   cc examples/c_api_selection.c -I$(python -c "import ckfmha; print(ckfmha.get_include()[1])") \
 *      -L$(python -c "import ckfmha; print(ckfmha.get_library_dir())") -lckfmha \
 *      -Wl,-rpath,$(python -c "import ckfmha; print(ckfmha.get_library_dir())") -lm -o c_api_selection
 */
#include "c_api_example.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BATCH = 8, HEADS_Q = 40, HEADS_K = 8, SEQLEN_K = 12345, HDIM = 128 };

/* Prints the "plan:" line of the problem's explanation for sm_90. */
static int print_plan(const ckfmha_fwd_problem* problem, const char* label) {
  size_t needed = 0;
  int status = ckfmha_fwd_explain(problem, 90, NULL, 0, &needed);
  if (status != CKFMHA_SUCCESS && status != CKFMHA_ERROR_BUFFER_TOO_SMALL) return status;
  char* text = malloc(needed);
  if (text == NULL) return CKFMHA_ERROR_INTERNAL;
  status = ckfmha_fwd_explain(problem, 90, text, needed, NULL);
  if (status == CKFMHA_SUCCESS) {
    const char* plan = strstr(text, "\nplan: ");
    printf("%s %s", label, plan ? plan + 1 : "(no plan line)\n");
  }
  free(text);
  return status;
}

int main(int argc, char** argv) {
  ckfmha_fwd_problem problem;
  CHECK(ckfmha_fwd_problem_init(&problem, CKFMHA_DTYPE_BF16, CKFMHA_LAYOUT_BHSD, BATCH, HEADS_Q,
                                HEADS_K, 1, SEQLEN_K, HDIM, HDIM));
  if (argc > 1) CHECK(ckfmha_selection_model_load(argv[1]));

  CHECK(ckfmha_set_selection(CKFMHA_SELECTION_HEURISTIC));
  CHECK(print_plan(&problem, "hand rules:"));

  CHECK(ckfmha_set_selection(CKFMHA_SELECTION_LEARNED));
  CHECK(print_plan(&problem, "learned:   "));
  char info[512];
  CHECK(ckfmha_selection_model_info(info, sizeof info, NULL));
  printf("model: %s\n", info);

  ckfmha_selection mode;
  CHECK(ckfmha_get_selection(&mode));
  CHECK(ckfmha_set_selection(CKFMHA_SELECTION_HEURISTIC));
  return mode == CKFMHA_SELECTION_LEARNED ? 0 : 1;
}
