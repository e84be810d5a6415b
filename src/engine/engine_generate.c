/* lm_engine_generate: one answer per conversation, every conversation checked to
 * start with the prefix messages, all queued at once (shortest final message
 * first) and continuously batched by the worker; texts in input order. */
#include "engine/engine_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static bool same_message(const lm_chat_message *a, const lm_chat_message *b) {
    return a->role && a->content && strcmp(a->role, b->role) == 0 && strcmp(a->content, b->content) == 0;
}

typedef struct order {
    size_t index, len;
} order;

static int order_cmp(const void *a, const void *b) {
    const order *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

void lm_engine_texts_free(char **texts, size_t n) {
    if (!texts) return;
    for (size_t i = 0; i < n; i++) free(texts[i]);
    free(texts);
}

lm_status lm_engine_generate(lm_engine *e, const lm_conversation *convs, size_t n, const lm_generate_params *params,
                             lm_engine_progress_fn on_progress, void *user, char ***texts_out) {
    if (!e || !texts_out) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_generate: NULL argument");
    *texts_out = NULL;
    lm_status st = lm_eng_check_usable(e);
    if (st) return st;
    if (pthread_equal(pthread_self(), e->thread))
        return lm_error(LM_ERR_INVALID_ARG, "lm_engine_generate cannot run inside a job (it waits for the worker)");
    if (n == 0 || !convs)
        return lm_error(LM_ERR_INVALID_ARG, "lm_engine_generate: the list of conversations is empty");
    size_t np = e->p.n_prefix_messages;
    for (size_t i = 0; i < n; i++) {
        const lm_conversation *c = &convs[i];
        if (!c->messages || c->n_messages == 0)
            return lm_error(LM_ERR_INVALID_ARG, "conversation %zu has no messages", i);
        for (size_t k = 0; k < c->n_messages; k++)
            if (!c->messages[k].role || !c->messages[k].content)
                return lm_error(LM_ERR_INVALID_ARG, "conversation %zu: message %zu has a NULL role or content", i, k);
        if (c->n_messages < np)
            return lm_error(LM_ERR_INVALID_ARG,
                            "conversation %zu does not start with the engine's %zu prefix messages: it has only %zu "
                            "messages",
                            i, np, c->n_messages);
        for (size_t k = 0; k < np; k++)
            if (!same_message(&c->messages[k], &e->prefix[k]))
                return lm_error(LM_ERR_INVALID_ARG,
                                "conversation %zu does not start with the engine's prefix messages: its message %zu "
                                "(role \"%s\") differs from prefix message %zu (role \"%s\")",
                                i, k, c->messages[k].role, k, e->prefix[k].role);
    }
    lm_generate_params defaults = lm_engine_generate_default_params();
    const lm_generate_params *gp = params ? params : &defaults;
    order *ord = malloc(sizeof *ord * n);
    lm_engine_request **reqs = calloc(n, sizeof *reqs);
    char **texts = calloc(n, sizeof *texts);
    size_t *lens = calloc(n, sizeof *lens), *caps = calloc(n, sizeof *caps);
    if (!ord || !reqs || !texts || !lens || !caps) {
        st = lm_error(LM_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const lm_conversation *c = &convs[i];
        ord[i] = (order){i, strlen(c->messages[c->n_messages - 1].content)};
    }
    qsort(ord, n, sizeof *ord, order_cmp);
    /* every request joins the queue at once, shortest final message first; the
     * worker admits batch_size at a time and refills the batch as they finish */
    for (size_t k = 0; k < n && !st; k++) {
        size_t i = ord[k].index;
        int32_t *ids;
        size_t nt;
        st = lm_eng_render_tokens(e->model, convs[i].messages, convs[i].n_messages, true, &ids, &nt);
        if (st) {
            st = lm_error_prefix(st, "conversation %zu", i);
            break;
        }
        lm_engine_request *r;
        st = lm_eng_request_create(e, ids, nt, gp, &r);
        free(ids);
        if (!st) st = lm_eng_request_enqueue(e, r);
        if (st) {
            st = lm_error_prefix(st, "conversation %zu", i);
            break;
        }
        reqs[i] = r;
    }
    size_t chunk = (size_t)e->p.batch_size, done = 0;
    for (size_t k = 0; k < n && !st; k++) {
        size_t i = ord[k].index;
        lm_step s;
        do {
            st = lm_engine_request_next(reqs[i], &s);
            if (st) {
                st = lm_error_prefix(st, "conversation %zu", i);
                break;
            }
            if (lens[i] + s.text_len + 1 > caps[i]) {
                size_t cap = caps[i] ? caps[i] : 64;
                while (cap < lens[i] + s.text_len + 1) cap *= 2;
                char *t = realloc(texts[i], cap);
                if (!t) {
                    st = lm_error(LM_ERR_NO_MEMORY, "out of memory for generated text");
                    break;
                }
                texts[i] = t;
                caps[i] = cap;
            }
            memcpy(texts[i] + lens[i], s.text, s.text_len);
            lens[i] += s.text_len;
            texts[i][lens[i]] = '\0';
        } while (s.finish == LM_FINISH_NONE);
        done++;
        if (!st && on_progress && (done % chunk == 0 || done == n)) on_progress(done, n, user);
    }
out:
    if (reqs)
        for (size_t i = 0; i < n; i++) lm_engine_request_free(reqs[i]);
    if (st) {
        lm_engine_texts_free(texts, n);
    } else {
        *texts_out = texts;
    }
    free(ord);
    free(reqs);
    free(lens);
    free(caps);
    return st;
}
