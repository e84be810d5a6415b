/* The sampler pipeline of sampling.h: bias, penalties, processors, then greedy or
 * temperature / top-k / top-p / min-p thresholds and a counter-based draw. */
#include "sampling/sampling.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "sampling/rng.h"
#include "sampling/select.h"

/* ---- token counts: a small open-addressing map token -> count ------------------ */

typedef struct token_counts {
    int32_t *key; /* -1 = empty slot                 */
    int32_t *cnt;
    size_t cap;   /* 0 or a power of two             */
    size_t used;  /* occupied slots (keys never leave) */
} token_counts;

static size_t counts_slot(const token_counts *m, int32_t tok) {
    uint32_t h = (uint32_t)tok * 0x9E3779B1u;
    size_t i = (size_t)(h ^ (h >> 15)) & (m->cap - 1);
    while (m->key[i] != -1 && m->key[i] != tok) i = (i + 1) & (m->cap - 1);
    return i;
}

static lm_status counts_grow(token_counts *m) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    token_counts n = {malloc(cap * sizeof(int32_t)), malloc(cap * sizeof(int32_t)), cap, m->used};
    if (!n.key || !n.cnt) {
        free(n.key);
        free(n.cnt);
        return lm_error(LM_ERR_NO_MEMORY, "sampling: out of memory for penalty counts (%zu slots)", cap);
    }
    memset(n.key, 0xff, cap * sizeof(int32_t));
    for (size_t i = 0; i < m->cap; i++) {
        if (m->key[i] == -1) continue;
        size_t j = counts_slot(&n, m->key[i]);
        n.key[j] = m->key[i];
        n.cnt[j] = m->cnt[i];
    }
    free(m->key);
    free(m->cnt);
    *m = n;
    return LM_OK;
}

static lm_status counts_add(token_counts *m, int32_t tok, int32_t delta) {
    if ((m->used + 1) * 2 > m->cap) {
        lm_status st = counts_grow(m);
        if (st != LM_OK) return st;
    }
    size_t i = counts_slot(m, tok);
    if (m->key[i] == -1) {
        m->key[i] = tok;
        m->cnt[i] = 0;
        m->used++;
    }
    m->cnt[i] += delta;
    return LM_OK;
}

static void counts_free(token_counts *m) {
    free(m->key);
    free(m->cnt);
}

/* ---- parameters ------------------------------------------------------------------ */

lm_sampling_params lm_sampling_default_params(void) {
    lm_sampling_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.repetition_context_size = 64;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.seed = LM_SAMPLING_SEED_RANDOM;
    return p;
}

lm_status lm_sampling_params_validate(const lm_sampling_params *p, size_t n_vocab) {
    if (!p) return lm_error(LM_ERR_INVALID_ARG, "sampling: the parameters pointer is NULL");
    if (n_vocab == 0 || n_vocab > INT32_MAX)
        return lm_error(LM_ERR_INVALID_ARG, "sampling: n_vocab must be in [1, %d], got %zu", INT32_MAX, n_vocab);
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return lm_error(LM_ERR_INVALID_ARG, "sampling: temperature must be a finite number >= 0 (0 = greedy), got %g",
                        (double)p->temperature);
    if (p->top_k < 0)
        return lm_error(LM_ERR_INVALID_ARG, "sampling: top_k must be >= 0 (0 = off), got %d", (int)p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return lm_error(LM_ERR_INVALID_ARG, "sampling: top_p must be in (0, 1] (1 = off), got %g", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return lm_error(LM_ERR_INVALID_ARG, "sampling: min_p must be in [0, 1] (0 = off), got %g", (double)p->min_p);
    if (!isfinite(p->repetition_penalty) || !(p->repetition_penalty > 0.0f))
        return lm_error(LM_ERR_INVALID_ARG, "sampling: repetition_penalty must be a finite number > 0 (1 = off), got %g",
                        (double)p->repetition_penalty);
    if (p->repetition_context_size < 0)
        return lm_error(LM_ERR_INVALID_ARG,
                        "sampling: repetition_context_size must be >= 0 (0 = the whole history), got %d",
                        (int)p->repetition_context_size);
    if (!isfinite(p->presence_penalty))
        return lm_error(LM_ERR_INVALID_ARG, "sampling: presence_penalty must be a finite number, got %g",
                        (double)p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return lm_error(LM_ERR_INVALID_ARG, "sampling: frequency_penalty must be a finite number, got %g",
                        (double)p->frequency_penalty);
    if (p->n_logit_bias && !p->logit_bias)
        return lm_error(LM_ERR_INVALID_ARG, "sampling: logit_bias is NULL but n_logit_bias is %zu", p->n_logit_bias);
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        const lm_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || (size_t)b->token >= n_vocab)
            return lm_error(LM_ERR_INVALID_ARG,
                            "sampling: logit_bias[%zu] names token %d, outside the vocabulary [0, %zu)", i,
                            (int)b->token, n_vocab);
        if (isnan(b->bias) || (isinf(b->bias) && b->bias > 0))
            return lm_error(LM_ERR_INVALID_ARG,
                            "sampling: logit_bias[%zu] for token %d must be finite or -inf (a ban), got %g", i,
                            (int)b->token, (double)b->bias);
    }
    if (p->n_processors && !p->processors)
        return lm_error(LM_ERR_INVALID_ARG, "sampling: processors is NULL but n_processors is %zu", p->n_processors);
    for (size_t i = 0; i < p->n_processors; i++)
        if (!p->processors[i].fn)
            return lm_error(LM_ERR_INVALID_ARG, "sampling: processors[%zu] has no function (fn is NULL)", i);
    return LM_OK;
}

/* ---- the sampler ------------------------------------------------------------------- */

struct lm_sampler {
    lm_sampling_params p; /* logit_bias / processors point at the copies below */
    lm_logit_bias *bias;
    lm_logits_processor *procs;
    size_t n_vocab;
    uint64_t seed;

    int32_t *hist; /* [n_hist]: prompt tokens, then generated tokens */
    size_t n_hist, cap_hist, n_prompt;

    bool use_rep, use_pf;
    token_counts win; /* counts in the repetition window    */
    token_counts gen; /* counts of generated tokens         */

    float *work; /* [n_vocab] logits after bias, penalties, processors          */
    float *wt;   /* [n_vocab] unnormalized weights exp((l - l_max)/T), 0 = removed */
    float *sel;  /* [n_vocab] selection scratch                                 */
};

static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t fresh_seed(const void *salt) {
    static atomic_uint_fast64_t counter;
    struct timespec rt = {0, 0}, mt = {0, 0};
    clock_gettime(CLOCK_REALTIME, &rt);
    clock_gettime(CLOCK_MONOTONIC, &mt);
    uint64_t x = mix64((uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec);
    x = mix64(x ^ ((uint64_t)mt.tv_sec * 1000000000ull + (uint64_t)mt.tv_nsec));
    x = mix64(x ^ (uint64_t)(uintptr_t)salt);
    x = mix64(x ^ (uint64_t)atomic_fetch_add(&counter, 1));
    return x == LM_SAMPLING_SEED_RANDOM ? 0 : x;
}

lm_status lm_sampler_create(const lm_sampling_params *params, size_t n_vocab, lm_sampler **out) {
    if (!out) return lm_error(LM_ERR_INVALID_ARG, "sampling: lm_sampler_create: out is NULL");
    *out = NULL;
    lm_status st = lm_sampling_params_validate(params, n_vocab);
    if (st != LM_OK) return st;
    lm_sampler *s = calloc(1, sizeof *s);
    if (!s) return lm_error(LM_ERR_NO_MEMORY, "sampling: out of memory for a sampler");
    s->p = *params;
    s->n_vocab = n_vocab;
    if (params->n_logit_bias) {
        s->bias = malloc(params->n_logit_bias * sizeof *s->bias);
        if (!s->bias) goto oom;
        memcpy(s->bias, params->logit_bias, params->n_logit_bias * sizeof *s->bias);
    }
    if (params->n_processors) {
        s->procs = malloc(params->n_processors * sizeof *s->procs);
        if (!s->procs) goto oom;
        memcpy(s->procs, params->processors, params->n_processors * sizeof *s->procs);
    }
    s->p.logit_bias = s->bias;
    s->p.processors = s->procs;
    s->seed = params->seed == LM_SAMPLING_SEED_RANDOM ? fresh_seed(s) : params->seed;
    s->use_rep = params->repetition_penalty != 1.0f;
    s->use_pf = params->presence_penalty != 0.0f || params->frequency_penalty != 0.0f;
    *out = s;
    return LM_OK;
oom:
    lm_sampler_free(s);
    return lm_error(LM_ERR_NO_MEMORY, "sampling: out of memory copying the sampling parameters");
}

void lm_sampler_free(lm_sampler *s) {
    if (!s) return;
    free(s->bias);
    free(s->procs);
    free(s->hist);
    counts_free(&s->win);
    counts_free(&s->gen);
    free(s->work);
    free(s->wt);
    free(s->sel);
    free(s);
}

uint64_t lm_sampler_seed(const lm_sampler *s) { return s ? s->seed : 0; }

size_t lm_sampler_n_generated(const lm_sampler *s) { return s ? s->n_hist - s->n_prompt : 0; }

/* Appends one token to the history and updates the penalty counts. */
static lm_status push_token(lm_sampler *s, int32_t tok, bool generated) {
    if (tok < 0 || (size_t)tok >= s->n_vocab)
        return lm_error(LM_ERR_INVALID_ARG, "sampling: token %d is outside the vocabulary [0, %zu)", (int)tok,
                        s->n_vocab);
    if (s->n_hist == s->cap_hist) {
        size_t cap = s->cap_hist ? s->cap_hist * 2 : 256;
        int32_t *h = realloc(s->hist, cap * sizeof *h);
        if (!h) return lm_error(LM_ERR_NO_MEMORY, "sampling: out of memory for the token history (%zu tokens)", cap);
        s->hist = h;
        s->cap_hist = cap;
    }
    lm_status st;
    if (s->use_rep) {
        if ((st = counts_add(&s->win, tok, 1)) != LM_OK) return st;
        size_t w = (size_t)s->p.repetition_context_size;
        if (w > 0 && s->n_hist >= w) /* the token w places back leaves the window */
            if ((st = counts_add(&s->win, s->hist[s->n_hist - w], -1)) != LM_OK) return st;
    }
    if (generated && s->use_pf)
        if ((st = counts_add(&s->gen, tok, 1)) != LM_OK) return st;
    s->hist[s->n_hist++] = tok;
    return LM_OK;
}

lm_status lm_sampler_accept_prompt(lm_sampler *s, const int32_t *tokens, size_t n) {
    if (!s || (n && !tokens)) return lm_error(LM_ERR_INVALID_ARG, "sampling: accept_prompt: NULL sampler or tokens");
    if (s->n_hist != s->n_prompt)
        return lm_error(LM_ERR_INVALID_ARG,
                        "sampling: prompt tokens must be accepted before the first generated token (%zu generated)",
                        s->n_hist - s->n_prompt);
    for (size_t i = 0; i < n; i++) /* all or nothing */
        if (tokens[i] < 0 || (size_t)tokens[i] >= s->n_vocab)
            return lm_error(LM_ERR_INVALID_ARG, "sampling: prompt token %zu (%d) is outside the vocabulary [0, %zu)", i,
                            (int)tokens[i], s->n_vocab);
    for (size_t i = 0; i < n; i++) {
        lm_status st = push_token(s, tokens[i], false);
        if (st != LM_OK) return st;
        s->n_prompt++;
    }
    return LM_OK;
}

lm_status lm_sampler_accept(lm_sampler *s, int32_t token) {
    if (!s) return lm_error(LM_ERR_INVALID_ARG, "sampling: accept: the sampler is NULL");
    return push_token(s, token, true);
}

/* The errors of a row after steps 1-3, one sentence for both draws (full row and
 * candidates). */
static lm_status nan_error(size_t t) {
    return lm_error(LM_ERR_INVALID_ARG,
                    "sampling: the logit of token %zu is NaN (after logit bias, penalties and processors)", t);
}

static lm_status banned_error(size_t n) {
    return lm_error(LM_ERR_INVALID_ARG,
                    "sampling: every token is banned (all %zu logits are -inf after logit bias, penalties and "
                    "processors)",
                    n);
}

/* Steps 1-3 of the pipeline into s->work; finds the max and the finite count. */
static lm_status prepare(lm_sampler *s, const float *logits, size_t n, float *lmax_out, size_t *n_finite_out,
                         size_t *argmax_out) {
    if (!logits) return lm_error(LM_ERR_INVALID_ARG, "sampling: logits is NULL");
    if (n != s->n_vocab)
        return lm_error(LM_ERR_INVALID_ARG, "sampling: got %zu logits, but the sampler was made for n_vocab = %zu", n,
                        s->n_vocab);
    if (!s->work) {
        s->work = malloc(n * sizeof(float));
        s->wt = malloc(n * sizeof(float));
        s->sel = malloc(n * sizeof(float));
        if (!s->work || !s->wt || !s->sel) {
            free(s->work);
            free(s->wt);
            free(s->sel);
            s->work = s->wt = s->sel = NULL;
            return lm_error(LM_ERR_NO_MEMORY, "sampling: out of memory for scratch over %zu logits", n);
        }
    }
    float *w = s->work;
    memcpy(w, logits, n * sizeof(float));

    for (size_t i = 0; i < s->p.n_logit_bias; i++) {
        const lm_logit_bias *b = &s->bias[i];
        w[b->token] = isinf(b->bias) ? -INFINITY : w[b->token] + b->bias;
    }
    if (s->use_rep) {
        const float r = s->p.repetition_penalty;
        for (size_t i = 0; i < s->win.cap; i++) {
            if (s->win.key[i] == -1 || s->win.cnt[i] <= 0) continue;
            float l = w[s->win.key[i]];
            w[s->win.key[i]] = l > 0.0f ? l / r : l * r;
        }
    }
    if (s->use_pf) {
        const float pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
        for (size_t i = 0; i < s->gen.cap; i++) {
            if (s->gen.key[i] == -1 || s->gen.cnt[i] <= 0) continue;
            w[s->gen.key[i]] -= (float)s->gen.cnt[i] * freq + pres;
        }
    }
    static const int32_t no_tokens[1] = {0}; /* processors never see a NULL history */
    const int32_t *hist = s->hist ? s->hist : no_tokens;
    for (size_t i = 0; i < s->p.n_processors; i++) {
        lm_clear_error();
        lm_status st = s->procs[i].fn(s->procs[i].user, hist, s->n_hist, w, n);
        if (st != LM_OK) {
            if (lm_last_error()[0] == '\0')
                lm_error(st, "the processor returned %d (%s) without an error message", (int)st,
                         lm_status_str(st));
            return lm_error_prefix(st, "sampling: logits processor %zu", i);
        }
    }

    float lmax = -INFINITY;
    size_t n_finite = 0, amax = 0;
    for (size_t t = 0; t < n; t++) {
        float l = w[t];
        if (isnan(l)) return nan_error(t);
        if (l > lmax) {
            lmax = l;
            amax = t;
        }
        n_finite += l > -INFINITY;
    }
    if (n_finite == 0) return banned_error(n);
    *lmax_out = lmax;
    *n_finite_out = n_finite;
    *argmax_out = amax;
    return LM_OK;
}

/* Steps 4-7: fills s->wt with the weights of the kept tokens (0 elsewhere) and
 * returns their total. Weights are w = exp((l - l_max) / T) in float, 1 for l_max.
 *
 * Cost: one exp per token that could survive. Tokens are skipped without an exp when
 * they are below the top-k threshold, or far enough below l_max that float underflow
 * or min-p drops them anyway (cutoffs with a margin; the exact tests follow; not
 * min-p when top-p is on, since top-p needs the mass of the whole top-k set). For
 * top-p, a token of weight w <= (1 - p) * Z / m (Z the total of the m nonzero
 * weights) always has mass >= Z - m * w >= p * Z strictly above it, so it is dropped:
 * only heavier tokens go through the selection. */
static double weigh(lm_sampler *s, float lmax, size_t n_finite) {
    const size_t n = s->n_vocab;
    const float *w = s->work;
    float *wt = s->wt;
    const float inv_t = 1.0f / s->p.temperature;
    const float min_p = s->p.min_p;

    float cut = -INFINITY; /* logits below `cut` get weight 0 without an exp */
    if (s->p.top_k > 0 && (size_t)s->p.top_k < n_finite)
        cut = lm_select_kth_largest(w, n, (size_t)s->p.top_k, s->sel);
    if (isfinite(lmax)) {
        /* (l - l_max) / T below log(min_p) or below -110 (expf underflows to 0 near
         * -104) means weight < min_p or 0; 1e-3 of margin covers float rounding */
        double floor_arg = min_p > 0.0f && s->p.top_p >= 1.0f ? log((double)min_p) - 1e-3 : -110.0;
        if (floor_arg < -110.0) floor_arg = -110.0;
        double c = (double)lmax + floor_arg * (double)s->p.temperature;
        float cf = (float)c;
        if ((double)cf > c) cf = nextafterf(cf, -INFINITY); /* round the cutoff down */
        if (cf > cut) cut = cf;
    }

    double z = 0.0;
    size_t m = 0;
    for (size_t t = 0; t < n; t++) {
        float l = w[t], v = 0.0f;
        if (l >= cut && l > -INFINITY) {
            v = l == lmax ? 1.0f : expf((l - lmax) * inv_t);
            z += v;
            m += v > 0.0f;
        }
        wt[t] = v;
    }

    float thr = min_p; /* min-p: p / p_max >= min_p, and p_max has weight 1 */
    if (s->p.top_p < 1.0f) {
        const double need = (double)s->p.top_p * z;
        const float dropped_below = (float)((1.0 - (double)s->p.top_p) * z / (double)m * (1.0 - 1e-5));
        size_t mc = 0;
        for (size_t t = 0; t < n; t++)
            if (wt[t] > dropped_below && wt[t] >= min_p && wt[t] > 0.0f) s->sel[mc++] = wt[t];
        float tp = lm_select_mass_threshold(s->sel, mc, need);
        if (tp > thr) thr = tp;
    }
    double total = 0.0;
    for (size_t t = 0; t < n; t++) {
        if (wt[t] > 0.0f && wt[t] >= thr)
            total += wt[t];
        else
            wt[t] = 0.0f;
    }
    return total;
}

lm_status lm_sampler_draw(lm_sampler *s, const float *logits, size_t n_vocab, int32_t *token) {
    if (!s || !token) return lm_error(LM_ERR_INVALID_ARG, "sampling: draw: NULL sampler or token pointer");
    float lmax;
    size_t n_finite, amax;
    lm_status st = prepare(s, logits, n_vocab, &lmax, &n_finite, &amax);
    if (st != LM_OK) return st;
    if (s->p.temperature == 0.0f) {
        *token = (int32_t)amax;
        return LM_OK;
    }
    double total = weigh(s, lmax, n_finite);
    double target = lm_rng_uniform(s->seed, s->n_hist - s->n_prompt, 0) * total;
    double acc = 0.0;
    size_t last = amax;
    for (size_t t = 0; t < n_vocab; t++) {
        if (s->wt[t] == 0.0f) continue;
        acc += s->wt[t];
        last = t;
        if (target < acc) break;
    }
    *token = (int32_t)last; /* `last` also covers a target rounded up to the total */
    return LM_OK;
}

lm_status lm_sampler_sample(lm_sampler *s, const float *logits, size_t n_vocab, int32_t *token) {
    lm_status st = lm_sampler_draw(s, logits, n_vocab, token);
    if (st != LM_OK) return st;
    return lm_sampler_accept(s, *token);
}

lm_status lm_sampler_distribution(lm_sampler *s, const float *logits, size_t n_vocab, float *probs) {
    if (!s || !probs) return lm_error(LM_ERR_INVALID_ARG, "sampling: distribution: NULL sampler or probs");
    float lmax;
    size_t n_finite, amax;
    lm_status st = prepare(s, logits, n_vocab, &lmax, &n_finite, &amax);
    if (st != LM_OK) return st;
    if (s->p.temperature == 0.0f) {
        memset(probs, 0, n_vocab * sizeof(float));
        probs[amax] = 1.0f;
        return LM_OK;
    }
    double total = weigh(s, lmax, n_finite);
    for (size_t t = 0; t < n_vocab; t++) probs[t] = (float)(s->wt[t] / total);
    return LM_OK;
}

/* ---- drawing from candidates ------------------------------------------------------ */

/* Steps 1-3 change nothing: the logits are the model's. */
static bool plain_params(const lm_sampler *s) {
    return s->p.n_logit_bias == 0 && !s->use_rep && !s->use_pf && s->p.n_processors == 0;
}

bool lm_sampler_candidates_ok(const lm_sampler *s, int k) {
    if (!s || k < 1 || !plain_params(s)) return false;
    if ((size_t)k >= s->n_vocab) return true; /* the candidates are the whole row */
    return s->p.temperature == 0.0f || (s->p.top_k >= 1 && s->p.top_k < k);
}

bool lm_sampler_candidates_suffice(const lm_sampler *s, const lm_candidates *c) {
    if (!s || !c || !c->ids || !c->vals || c->n_vocab != s->n_vocab || c->k < 1 || (size_t)c->k > c->n_vocab ||
        c->k > LM_TOPK_CANDIDATES_MAX)
        return false;
    if (!lm_sampler_candidates_ok(s, c->k)) return false;
    /* a NaN or an all -inf row: the same error as from the full row */
    if (isnan(c->row_max) || !(c->vals[0] > -INFINITY)) return true;
    if (s->p.temperature == 0.0f || (size_t)c->k >= s->n_vocab) return true;
    const int tk = s->p.top_k; /* 1 <= tk < k */
    /* at most tk finite logits: all of them are candidates and top-k cuts nothing */
    if (!(c->vals[tk] > -INFINITY)) return true;
    /* top-k keeps {l >= vals[tk - 1]}: known only if the candidates end below it */
    return c->vals[c->k - 1] < c->vals[tk - 1];
}

/* weigh() and the draw of lm_sampler_draw over the candidates that can survive,
 * walked in increasing id order as the full row is, so every float and double
 * operation happens with the same operands in the same order: same token. */
static int32_t draw_candidates(const lm_sampler *s, const lm_candidates *c) {
    const int k = c->k;
    const float lmax = c->vals[0];
    const float inv_t = 1.0f / s->p.temperature;
    const float min_p = s->p.min_p;

    /* the finite count matters only through top_k < n_finite: exact when a -inf
     * candidate marks the end of the finite ones or the candidates are the row */
    size_t n_finite = 0;
    while (n_finite < (size_t)k && c->vals[n_finite] > -INFINITY) n_finite++;
    if (n_finite == (size_t)k && (size_t)k < c->n_vocab) n_finite = (size_t)k + 1;

    float cut = -INFINITY;
    if (s->p.top_k > 0 && (size_t)s->p.top_k < n_finite) cut = c->vals[s->p.top_k - 1];
    if (isfinite(lmax)) { /* the same floor as weigh() */
        double floor_arg = min_p > 0.0f && s->p.top_p >= 1.0f ? log((double)min_p) - 1e-3 : -110.0;
        if (floor_arg < -110.0) floor_arg = -110.0;
        double cc = (double)lmax + floor_arg * (double)s->p.temperature;
        float cf = (float)cc;
        if ((double)cf > cc) cf = nextafterf(cf, -INFINITY);
        if (cf > cut) cut = cf;
    }

    /* the tokens that get a weight, by increasing id */
    int32_t id[LM_TOPK_CANDIDATES_MAX];
    float lv[LM_TOPK_CANDIDATES_MAX], wt[LM_TOPK_CANDIDATES_MAX], sel[LM_TOPK_CANDIDATES_MAX];
    int n = 0;
    for (int i = 0; i < k; i++) {
        float l = c->vals[i];
        if (!(l >= cut && l > -INFINITY)) continue;
        int j = n++;
        while (j > 0 && id[j - 1] > c->ids[i]) {
            id[j] = id[j - 1];
            lv[j] = lv[j - 1];
            j--;
        }
        id[j] = c->ids[i];
        lv[j] = l;
    }
    double z = 0.0;
    size_t m = 0;
    for (int i = 0; i < n; i++) {
        float v = lv[i] == lmax ? 1.0f : expf((lv[i] - lmax) * inv_t);
        z += v;
        m += v > 0.0f;
        wt[i] = v;
    }
    float thr = min_p;
    if (s->p.top_p < 1.0f) {
        const double need = (double)s->p.top_p * z;
        const float dropped_below = (float)((1.0 - (double)s->p.top_p) * z / (double)m * (1.0 - 1e-5));
        size_t mc = 0;
        for (int i = 0; i < n; i++)
            if (wt[i] > dropped_below && wt[i] >= min_p && wt[i] > 0.0f) sel[mc++] = wt[i];
        float tp = lm_select_mass_threshold(sel, mc, need);
        if (tp > thr) thr = tp;
    }
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        if (wt[i] > 0.0f && wt[i] >= thr)
            total += wt[i];
        else
            wt[i] = 0.0f;
    }
    double target = lm_rng_uniform(s->seed, s->n_hist - s->n_prompt, 0) * total;
    double acc = 0.0;
    int32_t last = c->ids[0]; /* the argmax, as in lm_sampler_draw */
    for (int i = 0; i < n; i++) {
        if (wt[i] == 0.0f) continue;
        acc += wt[i];
        last = id[i];
        if (target < acc) break;
    }
    return last;
}

lm_status lm_sampler_sample_candidates(lm_sampler *s, const lm_candidates *c, int32_t *token) {
    if (!s || !c || !token) return lm_error(LM_ERR_INVALID_ARG, "sampling: sample_candidates: NULL argument");
    if (!lm_sampler_candidates_suffice(s, c))
        return lm_error(LM_ERR_INVALID_ARG,
                        "sampling: %d candidates do not settle this step (parameters that need the full row, or "
                        "a tie at the top-k boundary): sample from the full logits",
                        c->k);
    if (isnan(c->row_max)) return nan_error((size_t)c->ids[0]);
    if (!(c->vals[0] > -INFINITY)) return banned_error(c->n_vocab);
    *token = s->p.temperature == 0.0f ? c->ids[0] : draw_candidates(s, c);
    return lm_sampler_accept(s, *token);
}

/* ---- logprobs ------------------------------------------------------------------------ */

/* Heap order for the top-n: a is "worse" than b (lower logit, or equal and higher id). */
static bool worse(float la, int32_t ta, float lb, int32_t tb) { return la < lb || (la == lb && ta > tb); }

static void sift_down(float *hl, int32_t *ht, size_t n, size_t i) {
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && worse(hl[c + 1], ht[c + 1], hl[c], ht[c])) c++;
        if (!worse(hl[c], ht[c], hl[i], ht[i])) return;
        float tl = hl[i];
        hl[i] = hl[c];
        hl[c] = tl;
        int32_t tt = ht[i];
        ht[i] = ht[c];
        ht[c] = tt;
        i = c;
    }
}

lm_status lm_logprobs(const float *logits, size_t n_vocab, int32_t token, float *token_logprob, size_t n_top,
                      lm_token_logprob *top, size_t *n_top_out) {
    if (!logits || n_vocab == 0 || n_vocab > INT32_MAX)
        return lm_error(LM_ERR_INVALID_ARG, "logprobs: need logits and n_vocab in [1, %d], got %zu", INT32_MAX,
                        n_vocab);
    if (n_top && (!top || !n_top_out))
        return lm_error(LM_ERR_INVALID_ARG, "logprobs: n_top is %zu but top or n_top_out is NULL", n_top);
    if (token >= 0 && !token_logprob)
        return lm_error(LM_ERR_INVALID_ARG, "logprobs: token %d given but token_logprob is NULL", (int)token);
    if (token >= 0 && (size_t)token >= n_vocab)
        return lm_error(LM_ERR_INVALID_ARG, "logprobs: token %d is outside the vocabulary [0, %zu)", (int)token,
                        n_vocab);
    float lmax = -INFINITY;
    size_t n_inf = 0;
    for (size_t t = 0; t < n_vocab; t++) {
        if (isnan(logits[t])) return lm_error(LM_ERR_INVALID_ARG, "logprobs: the logit of token %zu is NaN", t);
        if (logits[t] > lmax) lmax = logits[t];
        n_inf += isinf(logits[t]) && logits[t] > 0;
    }
    if (lmax == -INFINITY) return lm_error(LM_ERR_INVALID_ARG, "logprobs: every logit is -inf");

    /* log p(t) = l - l_max - log sum exp(l - l_max); with +inf logits, the +inf tokens
     * share the mass equally and every other token has log p = -inf. */
    double lse = 0.0;
    if (n_inf) {
        lse = log((double)n_inf);
    } else {
        for (size_t t = 0; t < n_vocab; t++) lse += exp((double)logits[t] - (double)lmax);
        lse = log(lse);
    }
#define LOGP(l) (n_inf ? ((l) == lmax ? (float)-lse : -INFINITY) : (float)((double)(l) - (double)lmax - lse))

    if (token >= 0) *token_logprob = LOGP(logits[token]);
    if (n_top == 0) {
        if (n_top_out) *n_top_out = 0;
        return LM_OK;
    }
    size_t k = n_top < n_vocab ? n_top : n_vocab;
    /* a min-heap (by `worse`) of the k best seen, kept in the caller's array */
    float *hl = malloc(k * sizeof(float));
    int32_t *ht = malloc(k * sizeof(int32_t));
    if (!hl || !ht) {
        free(hl);
        free(ht);
        return lm_error(LM_ERR_NO_MEMORY, "logprobs: out of memory for the top %zu", k);
    }
    size_t h = 0;
    for (size_t t = 0; t < n_vocab; t++) {
        float l = logits[t];
        if (h < k) {
            size_t i = h++;
            hl[i] = l;
            ht[i] = (int32_t)t;
            while (i > 0 && worse(hl[i], ht[i], hl[(i - 1) / 2], ht[(i - 1) / 2])) {
                size_t par = (i - 1) / 2;
                float tl = hl[i];
                hl[i] = hl[par];
                hl[par] = tl;
                int32_t tt = ht[i];
                ht[i] = ht[par];
                ht[par] = tt;
                i = par;
            }
        } else if (worse(hl[0], ht[0], l, (int32_t)t)) {
            hl[0] = l;
            ht[0] = (int32_t)t;
            sift_down(hl, ht, h, 0);
        }
    }
    /* pop the worst to the back: best first */
    for (size_t i = k; i-- > 0;) {
        top[i].token = ht[0];
        top[i].logprob = LOGP(hl[0]);
        hl[0] = hl[h - 1];
        ht[0] = ht[h - 1];
        h--;
        sift_down(hl, ht, h, 0);
    }
#undef LOGP
    free(hl);
    free(ht);
    *n_top_out = k;
    return LM_OK;
}
