/* Incremental detokenization. Each token's piece goes through the same steps as
 * lm_tokenizer_decode, done online:
 *   - the first piece loses one leading space (SPM add_space_prefix), unless the
 *     sequence started with a removed BOS;
 *   - a trailing EOS is dropped when remove_special: an EOS is held until another
 *     token shows it was not the last;
 *   - clean_spaces: llama.cpp's three passes are local rewrites (" ?" -> "?",
 *     " ' " -> "'", " 's"/" 'm"/" 're"/" 've" lose the space), so each is a small
 *     transducer holding at most three bytes of lookahead;
 *   - an incomplete UTF-8 sequence at the end is held until its bytes arrive.
 * Every step is O(1) per byte, so a push costs O(bytes of the piece). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

struct lm_detok_stream {
    const lm_tokenizer *tok;
    const lm_vocab *v;
    bool remove_special, unparse_special;
    bool started, remove_space, held_eos;
    bool p1_space;  /* pass 1: a space waiting for the next byte */
    int p2;         /* pass 2: 0, 1 = " ", 2 = " '" pending */
    char p3[3];     /* pass 3: pending " ", " '", " 'r" or " 'v" */
    int p3n;
    lm_bytes stage; /* final text not yet returned (may end in a partial character) */
    lm_bytes out;   /* what the last call returned */
    bool oom;
};

static void stage_put(lm_detok_stream *s, const char *p, size_t n) {
    if (!lm_bytes_append(&s->stage, p, n)) s->oom = true;
}

/* pass 3: drop a space before 's 'm 're 've */
static void p3_flush(lm_detok_stream *s) {
    stage_put(s, s->p3, (size_t)s->p3n);
    s->p3n = 0;
}

static void p3_put(lm_detok_stream *s, char c) {
    switch (s->p3n) {
    case 0:
        break;
    case 1: /* " " */
        if (c == '\'') {
            s->p3[s->p3n++] = c;
            return;
        }
        p3_flush(s);
        break;
    case 2: /* " '" */
        if (c == 's' || c == 'm') {
            s->p3n = 0;
            stage_put(s, "'", 1);
            stage_put(s, &c, 1);
            return;
        }
        if (c == 'r' || c == 'v') {
            s->p3[s->p3n++] = c;
            return;
        }
        p3_flush(s);
        break;
    default: /* " 'r" or " 'v" */
        if (c == 'e') {
            s->p3n = 0;
            stage_put(s, s->p3 + 1, 2);
            stage_put(s, &c, 1);
            return;
        }
        p3_flush(s);
        break;
    }
    if (c == ' ') {
        s->p3[0] = ' ';
        s->p3n = 1;
    } else {
        stage_put(s, &c, 1);
    }
}

/* pass 2: " ' " -> "'", scanning left to right; the eaten space starts nothing */
static void p2_put(lm_detok_stream *s, char c) {
    if (s->p2 == 1) {
        if (c == '\'') {
            s->p2 = 2;
            return;
        }
        p3_put(s, ' ');
        s->p2 = 0;
    } else if (s->p2 == 2) {
        s->p2 = 0;
        if (c == ' ') {
            p3_put(s, '\'');
            return;
        }
        p3_put(s, ' ');
        p3_put(s, '\'');
    }
    if (c == ' ')
        s->p2 = 1;
    else
        p3_put(s, c);
}

static void p2_flush(lm_detok_stream *s) {
    if (s->p2 >= 1) p3_put(s, ' ');
    if (s->p2 == 2) p3_put(s, '\'');
    s->p2 = 0;
}

/* pass 1: drop a space before ? ! . , */
static void p1_put(lm_detok_stream *s, char c) {
    if (s->p1_space) {
        s->p1_space = false;
        if (!(c == '?' || c == '!' || c == '.' || c == ',')) p2_put(s, ' ');
    }
    if (c == ' ')
        s->p1_space = true;
    else
        p2_put(s, c);
}

static void p1_flush(lm_detok_stream *s) {
    if (s->p1_space) p2_put(s, ' ');
    s->p1_space = false;
}

static void feed(lm_detok_stream *s, const char *p, size_t n) {
    if (!s->v->clean_spaces) {
        stage_put(s, p, n);
        return;
    }
    for (size_t i = 0; i < n; i++) p1_put(s, p[i]);
}

/* How many bytes at the end of b form the start of a UTF-8 character still missing
 * bytes (0 if none). */
static size_t partial_tail(const char *b, size_t n) {
    size_t k = 0; /* continuation bytes at the end */
    while (k < n && k < 3 && ((uint8_t)b[n - 1 - k] & 0xC0) == 0x80) k++;
    if (k == n) return 0;
    uint8_t lead = (uint8_t)b[n - 1 - k];
    size_t need = lead >= 0xC2 && lead <= 0xDF ? 2 : lead >= 0xE0 && lead <= 0xEF ? 3
                : lead >= 0xF0 && lead <= 0xF4 ? 4 : 0;
    return need && k + 1 < need ? k + 1 : 0;
}

static lm_status release(lm_detok_stream *s, bool all, const char **text, size_t *len) {
    if (s->oom) {
        s->oom = false;
        return lm_error(LM_ERR_NO_MEMORY, "detok stream: out of memory");
    }
    size_t keep = all ? 0 : partial_tail(s->stage.p, s->stage.n);
    size_t give = s->stage.n - keep;
    s->out.n = 0;
    if (!lm_bytes_append(&s->out, s->stage.p, give))
        return lm_error(LM_ERR_NO_MEMORY, "detok stream: out of memory");
    memmove(s->stage.p, s->stage.p + give, keep);
    s->stage.n = keep;
    *text = s->out.p;
    *len = s->out.n;
    return LM_OK;
}

void lm_detok_stream_reset(lm_detok_stream *s) {
    if (!s) return;
    s->started = s->remove_space = s->held_eos = false;
    s->p1_space = false;
    s->p2 = 0;
    s->p3n = 0;
    s->stage.n = 0;
    s->out.n = 0;
    s->oom = false;
}

lm_status lm_detok_stream_create(const lm_tokenizer *tok, bool remove_special,
                                 bool unparse_special, lm_detok_stream **out) {
    if (!tok || !out) return lm_error(LM_ERR_INVALID_ARG, "detok stream: NULL argument");
    *out = NULL;
    lm_detok_stream *s = calloc(1, sizeof *s);
    if (!s) return lm_error(LM_ERR_NO_MEMORY, "detok stream: out of memory");
    s->tok = tok;
    s->v = lm_tokenizer_vocab(tok);
    s->remove_special = remove_special;
    s->unparse_special = unparse_special;
    if (!lm_bytes_append(&s->out, "", 0) || !lm_bytes_append(&s->stage, "", 0)) {
        lm_detok_stream_free(s);
        return lm_error(LM_ERR_NO_MEMORY, "detok stream: out of memory");
    }
    *out = s;
    return LM_OK;
}

void lm_detok_stream_free(lm_detok_stream *s) {
    if (!s) return;
    free(s->stage.p);
    free(s->out.p);
    free(s);
}

static lm_status put_piece(lm_detok_stream *s, int32_t id) {
    const char *p;
    size_t n;
    lm_status st = lm_tokenizer_piece(s->tok, id, s->unparse_special, &p, &n);
    if (st) return st;
    if (s->remove_space && n && p[0] == ' ') p++, n--;
    s->remove_space = false;
    feed(s, p, n);
    return LM_OK;
}

lm_status lm_detok_stream_push(lm_detok_stream *s, int32_t id, const char **text, size_t *len) {
    if (!s || !text || !len) return lm_error(LM_ERR_INVALID_ARG, "detok stream: NULL argument");
    *text = s->out.p;
    *len = 0;
    const lm_vocab *v = s->v;
    if (id < 0 || (uint32_t)id >= v->n_tokens)
        return lm_error(LM_ERR_INVALID_ARG, "detok stream: token id %d out of range (vocab %u)", id,
                        v->n_tokens);
    if (!s->started) {
        s->started = true;
        s->remove_space = v->add_space_prefix;
        if (s->remove_special && v->add_bos && id == v->bos) {
            s->remove_space = false;
            return release(s, false, text, len);
        }
    }
    if (s->remove_special && v->add_eos) {
        if (s->held_eos) {
            s->held_eos = false;
            lm_status st = put_piece(s, v->eos);
            if (st) return st;
        }
        if (id == v->eos) {
            s->held_eos = true;
            return release(s, false, text, len);
        }
    }
    lm_status st = put_piece(s, id);
    if (st) return st;
    return release(s, false, text, len);
}

lm_status lm_detok_stream_finish(lm_detok_stream *s, const char **text, size_t *len) {
    if (!s || !text || !len) return lm_error(LM_ERR_INVALID_ARG, "detok stream: NULL argument");
    s->held_eos = false; /* a final EOS is dropped, as in lm_tokenizer_decode */
    if (s->v->clean_spaces) {
        p1_flush(s);
        p2_flush(s);
        p3_flush(s);
    }
    lm_status st = release(s, true, text, len);
    bool oom = s->oom;
    /* keep the returned text (s->out) readable: reset everything else */
    s->started = s->remove_space = false;
    s->p1_space = false;
    s->p2 = 0;
    s->p3n = 0;
    s->stage.n = 0;
    s->oom = false;
    (void)oom;
    return st;
}
