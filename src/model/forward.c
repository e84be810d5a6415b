#include "model/forward.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

enum { KV_BLOCK_TOKENS = 16 };

lm_status lm_kv_cache_for_model(const lm_model_internal *m, int64_t n_ctx, int64_t n_seqs, lm_dtype type,
                                lm_kv_cache **out) {
    if (n_ctx <= 0 || n_seqs <= 0) return lm_error(LM_ERR_INVALID_ARG, "context length and sequence count must be > 0");
    int64_t blocks_per_seq = (n_ctx + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    return lm_kv_cache_create(m->backend, m->hp.n_layer, m->hp.n_head_kv * m->hp.head_dim, KV_BLOCK_TOKENS,
                              blocks_per_seq * n_seqs, n_seqs, type, out);
}

/* Activation buffers, in backend memory. */
typedef struct scratch {
    float *x;        /* [n][n_embd]   residual stream        */
    float *xn;       /* [n][n_embd]   normalized input       */
    float *q;        /* [n][n_head*hd]                       */
    float *k, *v;    /* [n][n_kv*hd]                         */
    float *attn;     /* [n][n_head*hd] attention output      */
    float *tmp;      /* [n][n_embd]   block output           */
    float *gate, *up;/* [n][n_ff]                            */
    float *logits;   /* [n_out][n_vocab]                     */
} scratch;

/* The buffers of the last pass stay for the next, so a decode step allocates
 * nothing and its buffers keep their addresses (what a recorded pass points at).
 * One pass at a time uses them; a concurrent pass on the same model (two contexts
 * on two threads) gets buffers of its own. */
struct lm_forward_state {
    atomic_flag busy;
    scratch s;
    int64_t n_cap, out_cap; /* tokens and logit rows s holds */
};

static void scratch_free(lm_backend *b, scratch *s) {
    float *all[] = {s->x, s->xn, s->q, s->k, s->v, s->attn, s->tmp, s->gate, s->up, s->logits};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) b->ops->free(b, all[i]);
    memset(s, 0, sizeof *s);
}

static lm_status scratch_alloc(lm_backend *b, const lm_hparams *hp, int64_t n, int64_t n_out, scratch *s) {
    memset(s, 0, sizeof *s);
    size_t f = sizeof(float);
    int64_t q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    s->x = b->ops->alloc(b, (size_t)(n * hp->n_embd) * f);
    s->xn = b->ops->alloc(b, (size_t)(n * hp->n_embd) * f);
    s->q = b->ops->alloc(b, (size_t)(n * q_dim) * f);
    s->k = b->ops->alloc(b, (size_t)(n * kv_dim) * f);
    s->v = b->ops->alloc(b, (size_t)(n * kv_dim) * f);
    s->attn = b->ops->alloc(b, (size_t)(n * q_dim) * f);
    s->tmp = b->ops->alloc(b, (size_t)(n * hp->n_embd) * f);
    s->gate = b->ops->alloc(b, (size_t)(n * hp->n_ff) * f);
    s->up = b->ops->alloc(b, (size_t)(n * hp->n_ff) * f);
    s->logits = b->ops->alloc(b, (size_t)(n_out * hp->n_vocab) * f);
    if (!s->x || !s->xn || !s->q || !s->k || !s->v || !s->attn || !s->tmp || !s->gate || !s->up || !s->logits) {
        scratch_free(b, s);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory for activations of a %lld-token batch", (long long)n);
    }
    return LM_OK;
}

lm_status lm_forward_state_create(lm_forward_state **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    atomic_flag_clear(&(*out)->busy);
    return LM_OK;
}

void lm_forward_state_free(lm_backend *b, lm_forward_state *st) {
    if (!st) return;
    scratch_free(b, &st->s);
    free(st);
}

/* Buffers for n tokens and n_out logit rows: the model's kept ones (*kept = true;
 * release with scratch_release) or, when another pass holds those, new ones. */
static lm_status scratch_acquire(const lm_model_internal *m, int64_t n, int64_t n_out, scratch *s, bool *kept) {
    lm_forward_state *fs = m->fwd;
    *kept = false;
    if (!fs || atomic_flag_test_and_set(&fs->busy)) return scratch_alloc(m->backend, &m->hp, n, n_out, s);
    if (n > fs->n_cap || n_out > fs->out_cap) {
        int64_t want_n = n > fs->n_cap ? n : fs->n_cap, want_out = n_out > fs->out_cap ? n_out : fs->out_cap;
        scratch_free(m->backend, &fs->s);
        fs->n_cap = fs->out_cap = 0;
        lm_status st = scratch_alloc(m->backend, &m->hp, want_n, want_out, &fs->s);
        if (st) {
            atomic_flag_clear(&fs->busy);
            return st;
        }
        fs->n_cap = want_n;
        fs->out_cap = want_out;
    }
    *s = fs->s;
    *kept = true;
    return LM_OK;
}

static void scratch_release(const lm_model_internal *m, scratch *s, bool kept) {
    if (kept)
        atomic_flag_clear(&m->fwd->busy);
    else
        scratch_free(m->backend, s);
}

static lm_status check_batch(const lm_model_internal *m, lm_kv_cache *kv, const lm_batch *batch) {
    if (!batch || batch->n_tokens <= 0 || !batch->tokens || !batch->pos || !batch->seq)
        return lm_error(LM_ERR_INVALID_ARG, "empty or incomplete batch");
    for (int64_t t = 0; t < batch->n_tokens; t++) {
        if (batch->tokens[t] < 0 || batch->tokens[t] >= m->hp.n_vocab)
            return lm_error(LM_ERR_INVALID_ARG, "token id %d at batch index %lld is outside the vocabulary (%lld)",
                            batch->tokens[t], (long long)t, (long long)m->hp.n_vocab);
        if (batch->seq[t] < 0 || batch->seq[t] >= kv->n_seqs)
            return lm_error(LM_ERR_INVALID_ARG, "sequence id %d at batch index %lld is out of range",
                            batch->seq[t], (long long)t);
        if (batch->pos[t] < 0) return lm_error(LM_ERR_INVALID_ARG, "negative position at batch index %lld", (long long)t);
    }
    /* every position the batch writes needs a slot */
    for (int64_t t = 0; t < batch->n_tokens; t++) {
        lm_status st = lm_kv_cache_reserve(kv, batch->seq[t], (int64_t)batch->pos[t] + 1);
        if (st) return st;
    }
    return LM_OK;
}

/* Products sharing one input, through the backend's fused op when it has one. */
static lm_status matmul_many(lm_backend *b, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                             float *const *y) {
    if (b->ops->matmul_many) return b->ops->matmul_many(b, w, n_w, x, n, y);
    for (int i = 0; i < n_w; i++) {
        lm_status st = b->ops->matmul(b, w[i], x, n, y[i]);
        if (st) return st;
    }
    return LM_OK;
}

/* The residual add x += r, then xn = rms_norm(x) * w: one fused op where the backend
 * has it (bit-identical), else the two ops. */
static void residual_then_norm(lm_backend *b, float *x, const float *r, const float *w, int64_t n, int64_t d,
                               float eps, float *xn) {
    if (b->ops->add_rms_norm) {
        b->ops->add_rms_norm(b, x, r, w, n, d, eps, xn);
        return;
    }
    b->ops->add(b, x, r, n * d);
    b->ops->rms_norm(b, x, w, n, d, eps, xn);
}

/* The shape of a pass for a backend that records passes: the same key means the
 * same ops on the same buffers (the ops a pass issues depend only on the batch's
 * shape; its host metadata fills them in). 0: not recordable (buffers of its own).
 * The backend decides which shapes are worth recording. */
static uint64_t pass_key(const lm_kv_cache *kv, const lm_batch *batch, const scratch *s, bool kept) {
    if (!kept) return 0;
    uint64_t h = 1469598103934665603ULL;
#define MIX(v)                        \
    do {                              \
        h ^= (uint64_t)(v);           \
        h *= 1099511628211ULL;        \
    } while (0)
    MIX(batch->n_tokens);
    /* what a pass reads of the cache (its device buffers and layout), not the cache
     * object: a new cache on the same buffers replays the same graphs. Buffers at a
     * freed model's addresses are safe: freeing drops every recording (cuda_graph.cu) */
    MIX((uintptr_t)kv->k);
    MIX((uintptr_t)kv->v);
    MIX(kv->n_blocks);
    MIX(kv->block_size);
    MIX(kv->n_embd_kv);
    MIX(kv->type);
    const float *bufs[] = {s->x, s->xn, s->q, s->k, s->v, s->attn, s->tmp, s->gate, s->up, s->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) MIX((uintptr_t)bufs[i]);
    for (int64_t t = 0; t < batch->n_tokens; t++) MIX(batch->logits ? batch->logits[t] != 0 : t == batch->n_tokens - 1);
#undef MIX
    return h ? h : 1;
}

void lm_decode_model_of(const lm_model_internal *m, lm_decode_layer *layers, lm_decode_model *out) {
    for (int64_t il = 0; il < m->hp.n_layer; il++) {
        const lm_layer_weights *w = &m->layers[il];
        layers[il] = (lm_decode_layer){w->wq,        w->wk,        w->wv, w->wo, w->w_gate, w->w_up, w->w_down,
                                       w->attn_norm, w->ffn_norm, w->bq, w->bk, w->bv};
    }
    *out = (lm_decode_model){&m->hp, m->tok_embd, m->output, m->output_norm, layers};
}

/* A batch of one token whose logits are wanted, by the backend's decode_step (one
 * kernel on the GPU); LM_ERR_UNSUPPORTED where the backend does not serve the model. */
static lm_status forward_decode_step(const lm_model_internal *m, lm_kv_cache *kv, const lm_batch *batch,
                                     const scratch *s) {
    lm_decode_layer layers[LM_DECODE_MAX_LAYERS];
    if (m->hp.n_layer > LM_DECODE_MAX_LAYERS) return LM_ERR_UNSUPPORTED;
    lm_decode_model dm;
    lm_decode_model_of(m, layers, &dm);
    lm_attn_batch ab = {batch->n_tokens, batch->pos, batch->seq};
    return m->backend->ops->decode_step(m->backend, &dm, kv, &ab, batch->tokens, s->x, s->logits);
}

/* Everything from the embeddings to the logits in backend memory (s->logits). */
static lm_status forward_body(const lm_model_internal *m, lm_kv_cache *kv, const lm_batch *batch, const scratch *sp,
                              int64_t n_out) {
    const lm_hparams *hp = &m->hp;
    lm_backend *b = m->backend;
    const lm_backend_ops *op = b->ops;
    const scratch s = *sp;
    int64_t n = batch->n_tokens, d = hp->n_embd, hd = hp->head_dim;
    int64_t q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    lm_status st;
#define TRY(call)             \
    do {                      \
        if ((st = (call))) return st; \
    } while (0)
    lm_attn_batch ab = {n, batch->pos, batch->seq};
    if (n == 1 && n_out == 1 && op->decode_step) {
        st = forward_decode_step(m, kv, batch, sp);
        if (st != LM_ERR_UNSUPPORTED) return st;
    }

    op->get_rows(b, m->tok_embd, batch->tokens, n, s.x);
    if (hp->embd_scale != 1.0f) op->scale(b, s.x, hp->embd_scale, n * d);
    /* each block's residual add is fused with the norm that follows it; the first
     * layer's attention norm has no add before it */
    op->rms_norm(b, s.x, m->layers[0].attn_norm, n, d, hp->rms_eps, s.xn);
    /* the last add feeds the output norm, which runs on the gathered rows: fused only
     * when every row is wanted (nothing to gather) */
    bool fuse_output = n_out == n;

    for (int64_t il = 0; il < hp->n_layer; il++) {
        const lm_layer_weights *w = &m->layers[il];
        bool swa = lm_hparams_layer_is_swa(hp, il);

        /* attention block (s.xn: its input, normalized) */
        {
            const lm_weight *qkv[3] = {w->wq, w->wk, w->wv};
            float *out[3] = {s.q, s.k, s.v};
            TRY(matmul_many(b, qkv, 3, s.xn, n, out));
        }
        float theta = swa ? hp->rope_theta_local : hp->rope_theta;
        float fscale = swa ? 1.0f : hp->rope_freq_scale;
        if (op->qkv_finish) {
            lm_qkv_finish f = {s.q, s.k, s.v, w->bq, w->bk, w->bv, w->q_norm, w->k_norm, hp->rms_eps,
                               hp->n_head, hp->n_head_kv, hd, hp->n_rot, theta, fscale, hp->rope_mode};
            op->qkv_finish(b, kv, il, &ab, &f);
        } else {
            if (w->bq) {
                op->add_bias(b, s.q, w->bq, n, q_dim);
                op->add_bias(b, s.k, w->bk, n, kv_dim);
                op->add_bias(b, s.v, w->bv, n, kv_dim);
            }
            if (w->q_norm) {
                op->rms_norm(b, s.q, w->q_norm, n * hp->n_head, hd, hp->rms_eps, s.q);
                op->rms_norm(b, s.k, w->k_norm, n * hp->n_head_kv, hd, hp->rms_eps, s.k);
            }
            op->rope(b, s.q, n, hp->n_head, hd, hp->n_rot, batch->pos, theta, fscale, hp->rope_mode);
            op->rope(b, s.k, n, hp->n_head_kv, hd, hp->n_rot, batch->pos, theta, fscale, hp->rope_mode);
            op->kv_store(b, kv, il, &ab, s.k, s.v);
        }
        TRY(op->attention(b, kv, il, &ab, s.q, hp->n_head, hp->n_head_kv, hd, swa ? hp->sliding_window : 0,
                          hp->attn_scale, s.attn));
        TRY(op->matmul(b, w->wo, s.attn, n, s.tmp));
        if (w->post_attn_norm) op->rms_norm(b, s.tmp, w->post_attn_norm, n, d, hp->rms_eps, s.tmp);
        residual_then_norm(b, s.x, s.tmp, w->ffn_norm, n, d, hp->rms_eps, s.xn);

        /* feed-forward block */
        if (!hp->ffn_gelu && op->matmul_swiglu) {
            TRY(op->matmul_swiglu(b, w->w_gate, w->w_up, s.xn, n, s.gate, s.up));
        } else {
            const lm_weight *gate_up[2] = {w->w_gate, w->w_up};
            float *out[2] = {s.gate, s.up};
            TRY(matmul_many(b, gate_up, 2, s.xn, n, out));
            if (hp->ffn_gelu)
                op->geglu(b, s.gate, s.up, n * hp->n_ff, s.gate);
            else
                op->swiglu(b, s.gate, s.up, n * hp->n_ff, s.gate);
        }
        TRY(op->matmul(b, w->w_down, s.gate, n, s.tmp));
        if (w->post_ffn_norm) op->rms_norm(b, s.tmp, w->post_ffn_norm, n, d, hp->rms_eps, s.tmp);
        if (il + 1 < hp->n_layer)
            residual_then_norm(b, s.x, s.tmp, m->layers[il + 1].attn_norm, n, d, hp->rms_eps, s.xn);
        else if (fuse_output)
            residual_then_norm(b, s.x, s.tmp, m->output_norm, n, d, hp->rms_eps, s.xn);
        else
            op->add(b, s.x, s.tmp, n * d);
    }

    if (n_out > 0) {
        /* gather the rows whose logits are wanted, then the head over just those
         * (every row wanted: nothing moves, and the norm ran fused above) */
        int64_t j = 0;
        for (int64_t t = 0; t < n; t++) {
            bool want = batch->logits ? batch->logits[t] != 0 : t == n - 1;
            if (want) {
                if (j != t) op->copy(b, s.x + j * d, s.x + t * d, (size_t)d * sizeof(float));
                j++;
            }
        }
        if (!fuse_output) op->rms_norm(b, s.x, m->output_norm, n_out, d, hp->rms_eps, s.xn);
        TRY(op->matmul(b, m->output, s.xn, n_out, s.logits));
    }
#undef TRY
    return LM_OK;
}

/* One pass, bracketed by pass_begin/pass_end where the backend records passes. */
static lm_status forward_pass(const lm_model_internal *m, lm_kv_cache *kv, const lm_batch *batch, const scratch *s,
                              int64_t n_out, uint64_t key) {
    const lm_backend_ops *op = m->backend->ops;
    if (!op->pass_begin) return forward_body(m, kv, batch, s, n_out);
    lm_attn_batch ab = {batch->n_tokens, batch->pos, batch->seq};
    bool ran = false; /* a replay from the batch alone: no ops to walk (~15 us a step) */
    lm_status st = op->pass_begin(m->backend, key, kv, &ab, batch->tokens, &ran);
    if (st || ran) return st;
    st = forward_body(m, kv, batch, s, n_out);
    lm_status end = op->pass_end(m->backend);
    return st ? st : end;
}

/* The selected rows' candidates from the logits in backend memory (lm_forward_topk). */
static lm_status topk_outputs(const lm_model_internal *m, const float *dev_logits, int64_t n_out,
                              const lm_topk_out *out) {
    lm_backend *b = m->backend;
    const int64_t n_vocab = m->hp.n_vocab;
    const size_t row_bytes = (size_t)n_vocab * sizeof(float);
    lm_status st;
    if (b->ops->logits_topk) {
        st = b->ops->logits_topk(b, dev_logits, n_out, n_vocab, out->k, out->ids, out->vals, out->row_max,
                                 out->row_lse);
        if (st || !out->need_full) return st;
        for (int64_t r = 0; r < n_out; r++) {
            out->fetched[r] = out->need_full(out->user, r) ? 1 : 0;
            if (out->fetched[r]) b->ops->download(b, out->full + r * n_vocab, dev_logits + r * n_vocab, row_bytes);
        }
        return LM_OK;
    }
    /* no op: every row to the host (into `full` when given), reduced there */
    float *host = out->full;
    if (!host && !(host = lm_backend_host_alloc(b, row_bytes * (size_t)n_out)))
        return lm_error(LM_ERR_NO_MEMORY, "out of memory for the logits of %lld rows", (long long)n_out);
    b->ops->download(b, host, dev_logits, row_bytes * (size_t)n_out);
    st = lm_logits_topk_host(host, n_out, n_vocab, out->k, out->ids, out->vals, out->row_max, out->row_lse);
    if (!st && out->need_full) /* the rows are in `full` already */
        for (int64_t r = 0; r < n_out; r++) out->fetched[r] = out->need_full(out->user, r) ? 1 : 0;
    if (host != out->full) lm_backend_host_free(b, host);
    return st;
}

/* The pass, then the selected rows' logits (logits != NULL) or candidates (topk). */
static lm_status forward_run(const lm_model_internal *m, lm_kv_cache *kv, const lm_batch *batch, float *logits,
                             const lm_topk_out *topk) {
    lm_status st = check_batch(m, kv, batch);
    if (st) return st;
    lm_backend *b = m->backend;
    int64_t n = batch->n_tokens, n_out = 0;
    for (int64_t t = 0; t < n; t++) n_out += batch->logits ? (batch->logits[t] != 0) : (t == n - 1);
    if (topk && n_out > 0) {
        if (!topk->ids || !topk->vals || !topk->row_max || (topk->need_full && (!topk->full || !topk->fetched)))
            return lm_error(LM_ERR_INVALID_ARG, "lm_forward_topk: an output buffer is NULL");
        if (topk->k < 1 || topk->k > LM_TOPK_MAX || topk->k > m->hp.n_vocab)
            return lm_error(LM_ERR_INVALID_ARG, "lm_forward_topk: k = %d must be in [1, %d] and at most n_vocab (%lld)",
                            topk->k, LM_TOPK_MAX, (long long)m->hp.n_vocab);
    }

    scratch s;
    bool kept;
    if ((st = scratch_acquire(m, n, n_out > 0 ? n_out : 1, &s, &kept))) return st;
    uint64_t key = b->ops->pass_begin ? pass_key(kv, batch, &s, kept) : 0;
    st = forward_pass(m, kv, batch, &s, n_out, key);
    /* a recorded pass that failed may have failed in the recording: once more,
     * unrecorded (rewriting the same K/V slots is harmless); a real error repeats */
    if (st && key) st = forward_pass(m, kv, batch, &s, n_out, 0);
    if (st == LM_OK && n_out > 0) {
        if (topk)
            st = topk_outputs(m, s.logits, n_out, topk);
        else
            b->ops->download(b, logits, s.logits, (size_t)(n_out * m->hp.n_vocab) * sizeof(float));
    }
    scratch_release(m, &s, kept);
    return st;
}

lm_status lm_forward(const lm_model_internal *m, lm_kv_cache *kv, const lm_batch *batch, float *logits) {
    return forward_run(m, kv, batch, logits, NULL);
}

lm_status lm_forward_topk(const lm_model_internal *m, lm_kv_cache *kv, const lm_batch *batch, const lm_topk_out *out) {
    if (!out) return lm_error(LM_ERR_INVALID_ARG, "lm_forward_topk: out is NULL");
    return forward_run(m, kv, batch, NULL, out);
}
