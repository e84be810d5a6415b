/* The objects behind the public handles of include/lumen.h (models, contexts,
 * requests), shared by the files of src/api/ and, later, by the engine. */
#ifndef LM_API_API_INTERNAL_H
#define LM_API_API_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "tokenizer/template/template.h"
#include "tokenizer/tokenizer.h"

struct lm_model {
    lm_model_internal *m;
    lm_backend *backend;       /* owned                                               */
    lm_tokenizer *tok;         /* owned                                               */
    char *template_src;        /* the model's chat template source, NULL if none      */
    lm_template *tmpl;         /* parsed template; NULL if none or if it did not parse */
    char *template_error;      /* why it did not parse (reported at render time)      */
    char *bos_text, *eos_text; /* token texts handed to templates; NULL if none       */
    lm_model_params params;    /* resolved: backend name, threads, n_ctx, kv type      */
    char *backend_name;
    pthread_mutex_t forward_lock;      /* one forward pass at a time on the backend */
    _Atomic uint64_t kv_bytes_live;    /* KV caches of live contexts (memory limit)  */
};

/* Bytes a KV cache of n_ctx tokens takes for this model with keys/values of `type`. */
uint64_t lm_model_kv_bytes(const lm_model *model, int64_t n_ctx, lm_kv_type type);

/* lm_forward under the model's lock. */
lm_status lm_model_forward(lm_model *model, lm_kv_cache *kv, const int32_t *tokens, const int32_t *pos,
                           const int32_t *seq, int64_t n, float *logits);

/* lm_forward_topk (the last token's candidates) under the model's lock. */
struct lm_topk_out;
lm_status lm_model_forward_topk(lm_model *model, lm_kv_cache *kv, const int32_t *tokens, const int32_t *pos,
                                const int32_t *seq, int64_t n, const struct lm_topk_out *out);

/* The process's peak resident set size in bytes (VmHWM; 0 if unknown). */
uint64_t lm_peak_rss_bytes(void);

/* Seconds on a monotonic clock. */
double lm_now_s(void);

#endif
